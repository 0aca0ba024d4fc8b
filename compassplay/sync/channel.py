"""NCCL weight channel between the learner (rank 0) and the generator/scorer roles (no Ray).

`learner.weight_sync=nccl` (GPU only) replaces the object-store path: after each update the
learner broadcasts its weights once, in flat byte buckets of `learner.sync_bucket_mb`, over a
group made of the learner (rank 0) and every receiver (proposer, solver, scorers), each a
block of ranks of its own (one per receiving process: a vLLM engine takes one per TP worker,
`sync.ranks`);
`engines.weight_sync.NCCLBroadcastSync` does the bucketing.

Group construction: the channel builds a *standalone* process group, a `TCPStore` on the
learner's address plus a `ProcessGroupNCCL` (or `ProcessGroupGloo`, `backend="gloo"`, which is
how it is tested on CPU) constructed directly on that store. It never calls
`init_process_group`, so it does not touch the default group: the DeepSpeed learner already
owns one (world size 1), a vLLM worker owns one for its tensor parallelism, and the channel can
be re-formed after a recovery. Tensors go through the group, small objects (the header) through
the store, like vLLM's `StatelessProcessGroup`.

Wire format per broadcast (the one `vllm_worker.WeightSyncWorkerExtension` already reads): a
header object {version, tensor names/dtypes/shapes} is broadcast first, then the buckets. The
version therefore travels first, inside the header rather than as a separate int64 tensor, so
that HF receivers, scorers and vLLM workers can share one group. A receiver checks it: it
refuses (`StaleWeightsError`) a version lower than the one it holds and a version other than
the one the driver announced, after draining the buckets so the group stays in step.

vLLM engines receive inside their workers (`VLLMGenerationEngine.receive_weights_broadcast`),
which join with vLLM's `StatelessProcessGroup` + `PyNcclCommunicator`. A group must be built
the same way on every rank, so when the proposer or solver uses vLLM every member (learner,
HF receivers, scorers) joins through that transport (`transport="vllm"`); otherwise through
torch (`transport="torch"`). `open_channel` picks it from the config.
"""

from __future__ import annotations

import datetime
import logging
import pickle
from typing import Any, Literal

import torch

from compassplay.config import ConfigError, RunConfig
from compassplay.sync.buckets import NCCLBroadcastSync
from compassplay.sync.gpu_members import (
    check_distinct_devices,
    check_exclusive_gpus,
    check_ipc_colocation,
    gather_device_ids,
)
from compassplay.sync.identity import device_id
from compassplay.sync.pynccl import SYNC_TIMEOUT_S, vllm_broadcast_group
from compassplay.sync.versions import StaleWeightsError, check_offered

log = logging.getLogger(__name__)

Transport = Literal["torch", "vllm"]


def check_weight_sync(cfg: RunConfig, embedded: bool = True) -> None:
    """Fail early (ConfigError) when `learner.weight_sync=nccl` cannot work.

    Called by the driver before it creates actors, not at config load, so such configs stay
    loadable on CPU machines. `embedded`: the actors run on this machine (no Ray cluster
    address), so this machine needs CUDA; on a cluster the driver may sit on a CPU head node
    and each actor checks CUDA itself when it joins the group (`NcclChannel`)."""
    if cfg.learner.weight_sync == "ipc":
        _check_ipc(cfg, embedded)
        return
    if cfg.learner.weight_sync != "nccl":
        return
    if embedded and not torch.cuda.is_available():
        raise ConfigError("learner.weight_sync=nccl needs CUDA GPUs, but torch.cuda is not "
                          "available here; use learner.weight_sync=object_store on CPU")
    c = cfg.cluster
    no_gpu = [name for name, res in (("learner", c.learner), ("proposer", c.proposer),
                                     ("solver", c.solver), ("scorer", c.scorer))
              if res.num_gpus <= 0]
    if no_gpu:
        raise ConfigError("learner.weight_sync=nccl needs a GPU on the learner and on every "
                          "receiver; set " + ", ".join(f"cluster.{n}.num_gpus" for n in no_gpu)
                          + " > 0 or use learner.weight_sync=object_store")
    check_exclusive_gpus(cfg)
    if not cfg.learner.shared_model:
        raise ConfigError("learner.weight_sync=nccl needs learner.shared_model=true (one "
                          "broadcast serves proposer, solver and scorers); use "
                          "learner.weight_sync=object_store with separate models")
    if cfg.pipeline.staleness > 0:
        log.warning("learner.weight_sync=nccl: receivers take each version as soon as it is "
                    "broadcast, so pipeline.staleness=%d acts as 0 (no rollout/learn overlap)",
                    cfg.pipeline.staleness)


def _check_ipc(cfg: RunConfig, embedded: bool) -> None:
    """learner.weight_sync=ipc: the learner and the vLLM generators need GPUs (the config
    already checked vLLM, TP 1, sleep mode and a shared model), fractions of one GPU
    (`sync.gpu_members.check_ipc_colocation`; the Ray executor places them in one bundle). A
    vLLM worker that still finds itself on another GPU refuses the update, naming both."""
    if embedded and not torch.cuda.is_available():
        raise ConfigError("learner.weight_sync=ipc needs CUDA GPUs, but torch.cuda is not "
                          "available here; use learner.weight_sync=object_store on CPU")
    c = cfg.cluster
    no_gpu = [name for name in ("learner", "proposer", "solver")
              if (name == "learner" or getattr(cfg, name).engine == "vllm")
              and getattr(c, name).num_gpus <= 0]
    if no_gpu:
        raise ConfigError("learner.weight_sync=ipc needs a GPU on the learner and on each vLLM "
                          "generator (colocated: fractions of the same GPU); set "
                          + ", ".join(f"cluster.{n}.num_gpus" for n in no_gpu) + " > 0")
    check_ipc_colocation(cfg)
    if cfg.pipeline.staleness > 0:
        log.warning("learner.weight_sync=ipc: vLLM generators take each version as soon as "
                    "it is published, so pipeline.staleness=%d acts as 0 for them",
                    cfg.pipeline.staleness)


def transport_for(cfg: RunConfig) -> Transport:
    """"vllm" when a generator runs vLLM (its workers can only join a PyNccl group)."""
    return "vllm" if "vllm" in (cfg.proposer.engine, cfg.solver.engine) else "torch"


class StoreBroadcaster:
    """`weight_sync.Broadcaster` over a standalone torch process group and its TCPStore."""

    def __init__(self, addr: str, port: int, rank: int, world_size: int, backend: str,
                 timeout: datetime.timedelta) -> None:
        dist = torch.distributed
        self.store = dist.TCPStore(addr, port, world_size, rank == 0, timeout=timeout)
        pg_store = dist.PrefixStore("pg", self.store)
        if backend == "gloo":
            self.pg = dist.ProcessGroupGloo(pg_store, rank, world_size, timeout)
        elif backend == "nccl":
            self.pg = dist.ProcessGroupNCCL(pg_store, rank, world_size, timeout)
        else:
            raise ValueError(f"unknown backend {backend!r} (expected 'nccl' or 'gloo')")
        self.rank, self._objects = rank, 0

    def close(self) -> None:
        """Abort the process group (a peer may be dead: no barrier); idempotent."""
        pg, self.pg = getattr(self, "pg", None), None
        abort = getattr(pg, "abort", None)
        if abort is not None:
            abort()

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        opts = torch.distributed.BroadcastOptions()
        opts.rootRank = src
        self.pg.broadcast([tensor], opts).wait()

    def broadcast_object(self, obj: Any, src: int) -> Any:
        key = f"obj/{self._objects}"
        self._objects += 1
        if self.rank == src:
            self.store.set(key, pickle.dumps(obj))
            return obj
        return pickle.loads(self.store.get(key))


class NcclChannel:
    """Rank 0 (the learner) `send`s versioned state dicts; ranks 1..N `receive` them.

    All ranks construct the channel concurrently (the group forms collectively) and then call
    send/receive together, one receive per send. `version` is the last version sent or
    received (start it at what the rank holds). `timeout_s`: how long a receiver waits for
    the next broadcast (both transports). With NCCL every member reports its GPU when the
    group forms and a GPU shared by two ranks is refused (`sync.gpu_members`). `close()`
    destroys the communicator (before the group re-forms)."""

    def __init__(self, master_addr: str, master_port: int, rank: int, world_size: int,
                 bucket_bytes: int = 256 << 20, backend: str = "nccl",
                 transport: Transport = "torch", version: int = 0,
                 timeout_s: float = SYNC_TIMEOUT_S) -> None:
        if backend == "nccl" and not torch.cuda.is_available():
            raise ConfigError("learner.weight_sync=nccl: this process has no CUDA device "
                              "(give every receiver and the learner a GPU, or use "
                              "learner.weight_sync=object_store)")
        self.rank, self.world_size, self.version = rank, world_size, version
        device = (torch.device("cuda", torch.cuda.current_device()) if backend == "nccl"
                  else torch.device("cpu"))
        if transport == "vllm":
            comm: Any = vllm_broadcast_group(master_addr, master_port, rank, world_size, device,
                                             timeout_s=timeout_s)
        else:
            comm = StoreBroadcaster(master_addr, master_port, rank, world_size, backend,
                                    datetime.timedelta(seconds=timeout_s))
            if device.type == "cuda":  # (the vLLM transport checks before NCCL's init)
                check_distinct_devices(gather_device_ids(comm, rank, world_size,
                                                         device_id(device)))
        self.comm = comm
        self.sync = NCCLBroadcastSync(comm, src=0, bucket_bytes=bucket_bytes, device=device)

    def close(self) -> None:
        """Destroy this rank's communicator (idempotent); the channel is unusable after."""
        comm, self.comm = getattr(self, "comm", None), None
        if comm is not None:
            comm.close()

    def send(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Broadcast `state` as `version` (rank 0 only; versions never go down)."""
        if self.rank != 0:
            raise RuntimeError(f"rank {self.rank} cannot send: only the learner (rank 0) does")
        if version < self.version:
            raise StaleWeightsError(f"cannot send weight version {version}: version "
                                    f"{self.version} was already sent")
        self.sync.send(state, version)
        self.version = version

    def receive(self, version: int | None, like: dict[str, torch.Tensor] | None = None
                ) -> dict[str, torch.Tensor]:
        """The state dict the learner is broadcasting now, announced as `version` (None:
        the version its header carries; read it from `self.version` afterwards), on the CPU:
        each bucket is copied out as it arrives, so the receiving GPU holds one bucket beside
        the model the caller loads the weights into, not a second whole copy.

        Raises `StaleWeightsError` for a version below the one held and RuntimeError for one
        other than `version` (both after draining, so later broadcasts still line up). `like`,
        when given, must have the same names and shapes (catches a mismatched model early)."""
        if self.rank == 0:
            raise RuntimeError("rank 0 (the learner) sends; it cannot receive")
        state, got = self.sync.receive(stage="cpu")
        check_offered(self.version, version, got)
        if like is not None:
            bad = sorted(set(like) ^ set(state)) or [k for k in like
                                                     if like[k].shape != state[k].shape]
            if bad:
                raise KeyError(f"received weights do not match this model: {bad[:5]}")
        self.version = got
        return state


_OPEN: list[NcclChannel] = []  # the channel open_channel opened last in this process


def open_channel(cfg: RunConfig, addr: str, port: int, rank: int, world_size: int,
                 version: int = 0) -> NcclChannel:
    """The run's channel for `rank` (NCCL, bucket size and transport from the config). A
    role is one process with one channel: the one this process opened before (a group
    re-formed after a recovery) is closed first, so no communicator leaks."""
    while _OPEN:
        _OPEN.pop().close()
    ch = NcclChannel(addr, port, rank, world_size,
                     bucket_bytes=cfg.learner.sync_bucket_mb << 20,
                     transport=transport_for(cfg), version=version)
    _OPEN.append(ch)
    return ch
