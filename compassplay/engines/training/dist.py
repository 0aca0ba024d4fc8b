"""The learner's data-parallel group: who this rank is, joining the group, summing stats.

A learner group is N processes (Ray actors, or any launcher) that form one torch.distributed
group: gloo on CPU, NCCL on GPUs. Rank 0 picks the rendezvous address and port
(`rendezvous()`); the others get them from whoever starts the group. One rank (`RankInfo()`)
is the special case: a world of 1 on 127.0.0.1 and a free port.

The rendezvous address (`node_ip()`) is the one other nodes reach, found as Ray and vLLM
find theirs (the source address of the default route; `COMPASSPLAY_NODE_IP` or
`VLLM_HOST_IP` override it), not ``gethostbyname(gethostname())``, which is 127.0.1.1 on
stock Debian/Ubuntu: rank 0 (and DeepSpeed's MASTER_ADDR, the weight-sync store) would
listen on loopback and no other node could join.
"""

from __future__ import annotations

import atexit
import datetime
import ipaddress
import logging
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)
IP_ENV = ("COMPASSPLAY_NODE_IP", "VLLM_HOST_IP")  # explicit address, first set wins


@dataclass(frozen=True)
class RankInfo:
    """This process's place in the learner group; `master_*` = rank 0's rendezvous
    (empty/0 with world_size 1: a local address and a free port are chosen)."""

    rank: int = 0
    world_size: int = 1
    master_addr: str = ""
    master_port: int = 0
    timeout_s: float = 1800.0  # a collective waiting longer than this fails

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} outside a world of {self.world_size}")
        if self.world_size > 1 and not (self.master_addr and self.master_port):
            raise ValueError("a learner group of more than one rank needs rank 0's "
                             "master_addr and master_port")


def free_port(host: str = "") -> int:
    """A TCP port free on this node now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def is_loopback(ip: str) -> bool:
    """127.0.0.0/8, ::1 (or not an IP address at all)."""
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return True


def route_ip() -> str:
    """The source address of this node's default route ('' without one): a UDP socket
    `connect`s (no packet is sent), as Ray's and vLLM's `get_ip` do."""
    for family, probe in ((socket.AF_INET, "8.8.8.8"), (socket.AF_INET6, "2001:4860:4860::8888")):
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect((probe, 80))
                return str(s.getsockname()[0])
        except OSError:
            continue
    return ""


def node_ip() -> str:
    """This node's IP as other nodes reach it: `IP_ENV`, else the default route's source
    address, else the host name's address; loopback only when nothing else exists (a
    machine without a network: one node, logged)."""
    for var in IP_ENV:
        if os.environ.get(var):
            return os.environ[var]
    found = [route_ip()]
    try:
        found.append(socket.gethostbyname(socket.gethostname()))
    except OSError:
        pass
    for ip in found:
        if ip and not is_loopback(ip):
            return ip
    log.warning("no non-loopback address found (%s): groups can only form on this node; "
                "set COMPASSPLAY_NODE_IP to the address other nodes reach", found)
    return "127.0.0.1"


def rendezvous() -> tuple[str, int]:
    """(this node's IP as the other ranks reach it, `node_ip`; a free port): called on
    rank 0."""
    return node_ip(), free_port()


def init_group(info: RankInfo, init_fn=None) -> None:
    """Join the group `info` describes (no-op when torch.distributed is already initialized).

    Each rank sees one accelerator (Ray sets CUDA_VISIBLE_DEVICES per actor), so LOCAL_RANK
    is 0. `init_fn(dist_backend=...)` (e.g. `deepspeed.init_distributed`) defaults to
    torch.distributed.init_process_group over env://."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        if dist.get_world_size() != info.world_size or dist.get_rank() != info.rank:
            raise RuntimeError(f"torch.distributed is already a world of {dist.get_world_size()}"
                               f" (rank {dist.get_rank()}), not the learner group {info}")
        return
    addr = info.master_addr or "127.0.0.1"
    port = info.master_port or free_port("127.0.0.1")
    os.environ.update(MASTER_ADDR=addr, MASTER_PORT=str(port), WORLD_SIZE=str(info.world_size),
                      RANK=str(info.rank), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    timeout = datetime.timedelta(seconds=info.timeout_s)
    if init_fn is None:
        dist.init_process_group(backend, timeout=timeout)
    else:
        init_fn(dist_backend=backend, timeout=timeout)
    leave_at_exit(backend)


def leave_group(wait_for_peers: bool = True) -> None:
    """Tear down this process's group (no-op when none is initialized); call it before a
    rank exits. `wait_for_peers`: a barrier first, so no rank closes its connections while a
    peer still reads from them (gloo aborts that peer with SIGABRT)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return
    if wait_for_peers and dist.get_world_size() > 1:
        dist.barrier()
    dist.destroy_process_group()


def leave_at_exit(backend: str) -> None:
    """gloo: destroy the group while the interpreter is still whole. A process that exits
    with a live gloo group can abort (SIGABRT) when gloo's worker threads release tensors
    during interpreter shutdown. NCCL is left alone: destroying a communicator whose peer
    died can hang, and the actor's process ends anyway."""
    if backend == "gloo":
        atexit.register(leave_group, wait_for_peers=False)


def world_size() -> int:
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def sum_over_ranks(values: Sequence[float], device: torch.device | str = "cpu") -> list[float]:
    """Element-wise sum of `values` over the group (float64; identity in a world of 1).
    Collective: every rank calls it with as many values. NCCL needs `device` on the GPU."""
    if world_size() == 1:
        return [float(v) for v in values]
    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(t)
    return t.tolist()
