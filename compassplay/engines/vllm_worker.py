"""Code that runs inside vLLM worker processes (imported there by vLLM by name).

`WeightSyncWorkerExtension` is passed to ``vllm.LLM(worker_extension_cls=...)``; vLLM mixes it
into its GPU worker, so its methods are callable through ``llm.collective_rpc(name, args=...)``
on every worker of the engine (one per tensor-parallel rank) and see the worker's
``self.model_runner`` and ``self.device``.

Rule: RPC arguments and results are small plain values (str, int, float), never tensors.
vLLM's v1 engine msgpack-encodes them to the engine process, where a tensor would arrive as a
list (or be refused) and a state dict would cross ZMQ. Tensors take one of two paths:

* NCCL (`learner.weight_sync=nccl`): `compassplay_join_group(host, port, rank_offset, world)`
  once, then `compassplay_receive_broadcast(version, src, bucket_bytes)` per update while the
  learner broadcasts (`sync.buckets.NCCLBroadcastSync`; its header with names, dtypes and
  shapes travels through the group's store, the bytes through NCCL). Each worker joins as
  ``rank_offset + its rank in the engine's world`` (its TP/PP rank), so an engine with
  tensor parallelism TP takes ranks rank_offset .. rank_offset+TP-1 (`sync.ranks`).
* CUDA IPC (`learner.weight_sync=ipc`, colocated, and the object-store path of a vLLM
  engine): the producer writes a handle file (`sync.ipc.publish`) with, per device UUID, the
  CUDA IPC handles of its tensors (``torch.multiprocessing.reductions.reduce_tensor``); the
  RPC carries only the file's path and the version, `compassplay_load_ipc` opens the handles
  of this worker's GPU and copies them into the model.

Every loading method checks the version (an older one is refused with `StaleWeightsError`,
one other than announced is an error) and returns the version it loaded; the engine reports
a new version only when every worker returned it (`VLLMGenerationEngine`).

This module imports nothing from vllm at import time (the CPU tests mix the extension into a
fake worker, tests/engines/fake_vllm.py).
"""

from __future__ import annotations

from typing import Any

import torch

from compassplay.engines.base import StaleWeightsError
from compassplay.sync.buckets import NCCLBroadcastSync
from compassplay.sync.ipc import open_tensor, read_update


class VLLMBroadcaster:
    """`buckets.Broadcaster` over vLLM's StatelessProcessGroup + PyNcclCommunicator."""

    def __init__(self, group: Any, comm: Any) -> None:
        self.group, self.comm = group, comm

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        self.comm.broadcast(tensor, src=src, stream=torch.cuda.current_stream())

    def broadcast_object(self, obj: Any, src: int) -> Any:
        return self.group.broadcast_obj(obj, src=src)


def vllm_broadcast_group(host: str, port: int, rank: int, world_size: int,
                         device: torch.device | int) -> VLLMBroadcaster:
    """Join the weight-sync NCCL group (learner: rank 0; vLLM workers: see `sync.ranks`)."""
    from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
    from vllm.distributed.utils import StatelessProcessGroup

    group = StatelessProcessGroup.create(host=host, port=port, rank=rank, world_size=world_size)
    return VLLMBroadcaster(group, PyNcclCommunicator(group, device=device))


def device_uuid(device: torch.device) -> str:
    """The physical GPU's UUID (the same from every process, whatever CUDA_VISIBLE_DEVICES)."""
    return str(torch.cuda.get_device_properties(device).uuid)


def check_offered(held: int, announced: int, got: int) -> None:
    """A worker's version check: `got` (what arrived) must be `announced` and not older than
    `held`."""
    if got < held:
        raise StaleWeightsError(f"refusing weight version {got}: this vLLM worker already "
                                f"holds version {held}")
    if got != announced:
        raise RuntimeError(f"expected weight version {announced}, the learner sent {got}")


class WeightSyncWorkerExtension:
    """Mixed into vLLM's worker: versioned in-place weight loading (NCCL group or CUDA IPC)."""

    _compassplay_version: int = 0
    _compassplay_torn: bool = False  # part of an update may be loaded: weights inconsistent
    _compassplay_comm: Any = None

    # ------------------------------------------------------------------ seams (fake: tests)
    def _compassplay_engine_rank(self) -> int:
        """This worker's rank in its engine's world (TP x PP), 0 .. TP*PP-1."""
        try:
            from vllm.distributed.parallel_state import get_world_group
        except ImportError:  # the CPU fake: the worker's own rank attribute
            return int(self.rank)  # type: ignore[attr-defined]
        return int(get_world_group().rank)

    def _compassplay_join(self, host: str, port: int, rank: int, world_size: int) -> Any:
        return vllm_broadcast_group(host, port, rank, world_size,
                                    self.device)  # type: ignore[attr-defined]

    def _compassplay_load(self, named: list[tuple[str, torch.Tensor]]) -> None:
        self.model_runner.model.load_weights(weights=named)  # type: ignore[attr-defined]
        if torch.cuda.is_available() and self.device.type == "cuda":  # type: ignore[attr-defined]
            torch.cuda.synchronize()

    def _compassplay_uuid(self) -> str:
        return device_uuid(self.device)  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ RPC methods
    def compassplay_device_uuid(self) -> str:
        return self._compassplay_uuid()

    def compassplay_weight_version(self) -> int:
        """The version this worker holds, -1 when it holds part of an update."""
        return -1 if self._compassplay_torn else self._compassplay_version

    def compassplay_set_version(self, version: int) -> int:
        """Start from `version` (the engine's initial weights)."""
        self._compassplay_version = int(version)
        return self._compassplay_version

    def compassplay_join_group(self, host: str, port: int, rank_offset: int,
                               world_size: int) -> int:
        """Join the learner's weight-sync group as rank `rank_offset` + this worker's rank in
        the engine's world; returns that rank."""
        rank = int(rank_offset) + self._compassplay_engine_rank()
        if not 0 < rank < world_size:
            raise ValueError(f"weight-sync rank {rank} outside 1..{world_size - 1} "
                             f"(rank_offset {rank_offset}, world size {world_size})")
        self._compassplay_comm = self._compassplay_join(host, port, rank, world_size)
        return rank

    def compassplay_receive_broadcast(self, version: int, src: int = 0,
                                      bucket_bytes: int = 256 << 20) -> int:
        """Receive the broadcast the learner is sending now (announced as `version`) and
        load it; all buckets are drained before a refusal so the group stays in step."""
        if self._compassplay_comm is None:
            raise RuntimeError("compassplay_receive_broadcast before compassplay_join_group")
        sync = NCCLBroadcastSync(self._compassplay_comm, src=src, bucket_bytes=bucket_bytes,
                                 device=self.device)  # type: ignore[attr-defined]
        state, got = sync.receive()
        check_offered(self._compassplay_version, int(version), got)
        self._compassplay_torn = True
        self._compassplay_load(list(state.items()))
        self._compassplay_version, self._compassplay_torn = got, False
        return got

    def compassplay_load_ipc(self, path: str, version: int, final: bool = True) -> int:
        """Load the tensors a producer published in handle file `path` for this worker's GPU.
        `final`: the last part of the update; the version is taken (and returned) only then
        (-1 for an earlier part)."""
        update = read_update(path)
        check_offered(self._compassplay_version, int(version), int(update["version"]))
        mine = update["by_device"].get(self._compassplay_uuid())
        if mine is None:
            raise RuntimeError(f"no weights for this worker's GPU {self._compassplay_uuid()} in "
                               f"{path} (published for {sorted(update['by_device'])}): with "
                               "learner.weight_sync=ipc the engine must share the learner's GPU")
        index = self.device.index  # type: ignore[attr-defined]
        named = [(name, open_tensor(handle, index)) for name, handle in mine]
        self._compassplay_torn = True
        self._compassplay_load(named)
        del named
        if not final:
            return -1
        self._compassplay_version, self._compassplay_torn = int(version), False
        return self._compassplay_version
