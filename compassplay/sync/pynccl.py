"""The weight-sync group over vLLM's `StatelessProcessGroup` + `PyNcclCommunicator` (GPU only).

Used when a vLLM engine receives weights by NCCL (its workers cannot join a torch process
group of their own): the learner, every vLLM worker and every other receiver of the run
join through this transport so the group is built the same way on every rank
(`sync.channel.transport_for`). vLLM is imported only when a group is formed.

Timeouts: every broadcast header is a blocking ``store.get`` on the group's TCPStore, whose
timeout vLLM sets from ``store_timeout`` (300 s unless given). A receiver is asked to receive
as soon as it is free, while the learner sends only after its update and any checkpoint
write, so the store waits `SYNC_TIMEOUT_S` (the torch transport's 30 min), and the store's
data outlives it (`data_expiration_s`). The communicator is created outside the NCCL variables
vLLM pins for its own communicators (``vllm.utils.nccl.unpinned_nccl_env``, as vLLM's own
weight-transfer engines do): the learner does not set them, and NCCL never reconciles them
across ranks.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch

from compassplay.sync import identity
from compassplay.sync.gpu_members import check_distinct_devices, gather_device_ids

SYNC_TIMEOUT_S = 1800.0  # s a receiver waits for the next broadcast (torch transport: same)
DATA_EXPIRATION_S = 3600  # vLLM's default: a header stays in the store at least this long


class VLLMBroadcaster:
    """`sync.buckets.Broadcaster` over vLLM's StatelessProcessGroup + PyNcclCommunicator."""

    def __init__(self, group: Any, comm: Any) -> None:
        self.group, self.comm = group, comm

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        self.comm.broadcast(tensor, src=src, stream=torch.cuda.current_stream())

    def broadcast_object(self, obj: Any, src: int) -> Any:
        return self.group.broadcast_obj(obj, src=src)

    def close(self) -> None:
        """Destroy the communicator (the group is re-formed after a recovery); idempotent."""
        comm, self.comm = self.comm, None
        destroy = getattr(comm, "destroy", None)
        if destroy is not None:
            destroy()


def check_enabled(comm: Any, rank: int, world_size: int) -> None:
    """PyNccl disables itself silently (no libnccl, world size 1, VLLM_DISABLE_PYNCCL...);
    its broadcast then does nothing and receivers would load uninitialised memory."""
    if getattr(comm, "disabled", False) or getattr(comm, "available", True) is False:
        raise RuntimeError(f"vLLM's PyNcclCommunicator is disabled on weight-sync rank {rank} "
                           f"of {world_size} (no usable libnccl, a world of 1, or "
                           "VLLM_DISABLE_PYNCCL): the weight broadcast would send nothing; use "
                           "learner.weight_sync=object_store")


def data_expiration_s(timeout_s: float) -> int:
    """How long (s) the store keeps a header: at least twice the timeout, at least vLLM's
    default, so a receiver that waited the whole timeout still finds it."""
    return max(DATA_EXPIRATION_S, 2 * math.ceil(timeout_s))


def vllm_store_group(host: str, port: int, rank: int, world_size: int,
                     timeout_s: float = SYNC_TIMEOUT_S) -> Any:
    """vLLM's StatelessProcessGroup of the weight-sync group (collective: every rank calls
    it), its store waiting `timeout_s` for a key (a broadcast header)."""
    from vllm.distributed.utils import StatelessProcessGroup

    return StatelessProcessGroup.create(host=host, port=port, rank=rank,
                                        world_size=world_size,
                                        data_expiration_seconds=data_expiration_s(timeout_s),
                                        store_timeout=math.ceil(timeout_s))


def _unpinned_nccl_env() -> Any:
    """vLLM's context that lifts the NCCL variables it pinned (a no-op where it has none)."""
    try:
        from vllm.utils.nccl import unpinned_nccl_env
    except ImportError:
        return contextlib.nullcontext()
    return unpinned_nccl_env()


def vllm_broadcast_group(host: str, port: int, rank: int, world_size: int,
                         device: torch.device | int,
                         timeout_s: float = SYNC_TIMEOUT_S) -> VLLMBroadcaster:
    """Join the weight-sync NCCL group (learner: rank 0; vLLM workers: see `sync.ranks`).
    Every member reports its GPU first: two on one GPU are refused, naming the ranks, before
    NCCL's own init would fail on them."""
    from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator

    group = vllm_store_group(host, port, rank, world_size, timeout_s)
    cuda = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    check_distinct_devices(gather_device_ids(VLLMBroadcaster(group, None), rank, world_size,
                                             identity.device_id(cuda)))
    with _unpinned_nccl_env():
        comm = PyNcclCommunicator(group, device=device)
    check_enabled(comm, rank, world_size)
    return VLLMBroadcaster(group, comm)
