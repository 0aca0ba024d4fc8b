"""Weight sync from the learner to generators/scorers, with monotonically increasing versions.

Two transports, chosen by config (kind "object_store" or "nccl", see `make_weight_sync`):

* `ObjectStoreSync` (CPU, any cluster): a `WeightSnapshot` (version + CPU state dict) is a
  plain value; the Ray layer passes it through the object store to each engine actor, which
  calls `snapshot.apply_to(engine)`.
* `NCCLBroadcastSync` (GPU): the learner rank broadcasts the weights in flat byte buckets of
  `bucket_bytes` over a torch.distributed (NCCL) group that contains the learner and every
  generator/scorer rank; receivers rebuild the state dict on their device and load it. The
  same code runs over gloo on CPU (that is how it is tested here); in production with vLLM the
  receiving side runs inside the vLLM worker (`vllm_worker.WeightSyncWorkerExtension`).

Versions: a sync never goes backwards. Publishing a version not above the last one and applying
one below the engine's current version raise `StaleWeightsError`; re-applying the current
version is a no-op.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from compassplay.engines.base import GenerationEngine, StaleWeightsError


@dataclass(frozen=True)
class WeightSnapshot:
    """Full weights (HF names, CPU tensors owned by the snapshot) at `version` for `role`."""

    version: int
    state: dict[str, torch.Tensor]
    role: str = "solver"

    def apply_to(self, engine: GenerationEngine) -> bool:
        """Load into `engine` if newer; False if it already holds this version."""
        if self.version < engine.weight_version:
            raise StaleWeightsError(f"snapshot version {self.version} is older than the "
                                    f"engine's version {engine.weight_version}")
        if self.version == engine.weight_version:
            return False
        engine.load_weights(self.state, self.version)
        return True


class ObjectStoreSync:
    """Keeps the latest snapshot per role; versions must strictly increase."""

    def __init__(self) -> None:
        self._latest: dict[str, WeightSnapshot] = {}

    def publish(self, state: dict[str, torch.Tensor], version: int, role: str = "solver",
                copy: bool = True) -> WeightSnapshot:
        """Snapshot `state` at `version` (copies to CPU unless `copy=False`, i.e. the caller
        hands over tensors it will not modify, as `Learner.state_dict_for_sync` does)."""
        last = self._latest.get(role)
        if last is not None and version <= last.version:
            raise StaleWeightsError(f"cannot publish version {version} for {role}: "
                                    f"version {last.version} was already published")
        if copy:
            state = {k: v.detach().to("cpu", copy=True) for k, v in state.items()}
        snap = WeightSnapshot(version=version, state=state, role=role)
        self._latest[role] = snap
        return snap

    def publish_learner(self, learner: Any, role: str = "solver") -> WeightSnapshot:
        """Snapshot the learner's current weights for `role` at `learner.weight_version`."""
        return self.publish(learner.state_dict_for_sync(role), learner.weight_version, role,
                            copy=False)

    def latest(self, role: str = "solver") -> WeightSnapshot | None:
        return self._latest.get(role)

    def apply_to(self, engine: GenerationEngine, role: str = "solver") -> bool:
        """Apply the latest snapshot of `role` to `engine` (see `WeightSnapshot.apply_to`)."""
        snap = self._latest.get(role)
        return False if snap is None else snap.apply_to(engine)


class Broadcaster(Protocol):
    """The collective a `NCCLBroadcastSync` needs (torch.distributed or vLLM's PyNccl)."""

    def broadcast(self, tensor: torch.Tensor, src: int) -> None: ...

    def broadcast_object(self, obj: Any, src: int) -> Any: ...


class TorchDistBroadcaster:
    """`Broadcaster` over a torch.distributed group (NCCL on GPU, gloo on CPU)."""

    def __init__(self, group: Any = None) -> None:
        self.group = group

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        torch.distributed.broadcast(tensor, src=src, group=self.group)

    def broadcast_object(self, obj: Any, src: int) -> Any:
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=src, group=self.group)
        return box[0]


def _buckets(meta: list[tuple[str, str, list[int], int]], bucket_bytes: int
             ) -> Iterator[list[int]]:
    """Indices of `meta` grouped so each bucket holds at most `bucket_bytes` (or one tensor)."""
    cur: list[int] = []
    size = 0
    for i, (_, _, _, nbytes) in enumerate(meta):
        if cur and size + nbytes > bucket_bytes:
            yield cur
            cur, size = [], 0
        cur.append(i)
        size += nbytes
    if cur:
        yield cur


class NCCLBroadcastSync:
    """Bucketed broadcast of a state dict from rank `src` (the learner) to all other ranks.

    Each bucket is the raw bytes of consecutive tensors concatenated into one uint8 tensor on
    `device`, so dtypes can mix and there is one collective per bucket.
    """

    def __init__(self, comm: Broadcaster, src: int = 0, bucket_bytes: int = 256 << 20,
                 device: str | torch.device = "cuda") -> None:
        self.comm, self.src, self.bucket_bytes = comm, src, bucket_bytes
        self.device = torch.device(device)

    def send(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Called on rank `src` (all ranks call send/receive together)."""
        tensors = [t.detach().contiguous() for t in state.values()]
        meta = [(name, str(t.dtype).removeprefix("torch."), list(t.shape),
                 t.numel() * t.element_size()) for name, t in zip(state, tensors, strict=True)]
        self.comm.broadcast_object({"version": version, "meta": meta}, self.src)
        for idx in _buckets(meta, self.bucket_bytes):
            flat = torch.cat([tensors[i].to(self.device).reshape(-1).view(torch.uint8)
                              for i in idx])
            self.comm.broadcast(flat, self.src)

    def receive(self) -> tuple[dict[str, torch.Tensor], int]:
        """Called on every other rank: the broadcast state dict (on `device`) and its version."""
        header = self.comm.broadcast_object(None, self.src)
        meta = header["meta"]
        state: dict[str, torch.Tensor] = {}
        for idx in _buckets(meta, self.bucket_bytes):
            flat = torch.empty(sum(meta[i][3] for i in idx), dtype=torch.uint8,
                               device=self.device)
            self.comm.broadcast(flat, self.src)
            off = 0
            for i in idx:
                name, dtype_name, shape, nbytes = meta[i]
                dtype = getattr(torch, dtype_name)
                chunk = flat[off:off + nbytes]
                if off % torch.empty((), dtype=dtype).element_size():
                    chunk = chunk.clone()  # view(dtype) needs an aligned offset
                state[name] = chunk.view(dtype).reshape(shape)
                off += nbytes
        return state, int(header["version"])

    def receive_into(self, engine: GenerationEngine) -> int:
        """Receive and load into `engine` (refusing an older version); returns the version."""
        state, version = self.receive()
        engine.load_weights(state, version)
        return version


def make_weight_sync(kind: str, **kwargs: Any) -> ObjectStoreSync | NCCLBroadcastSync:
    """kind "object_store" (CPU default) or "nccl" (kwargs: comm, src, bucket_bytes, device)."""
    if kind == "object_store":
        return ObjectStoreSync()
    if kind == "nccl":
        if kwargs.get("comm") is None:
            if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
                raise RuntimeError("weight sync 'nccl' needs an initialized torch.distributed "
                                   "group (or a vLLM PyNccl communicator) passed as comm=")
            kwargs["comm"] = TorchDistBroadcaster()
        return NCCLBroadcastSync(**kwargs)
    raise ValueError(f"unknown weight sync {kind!r} (expected 'object_store' or 'nccl')")
