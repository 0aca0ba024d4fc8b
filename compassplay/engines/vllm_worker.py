"""Code that runs inside vLLM worker processes (GPU only; imported there by vLLM by name).

`WeightSyncWorkerExtension` is passed to ``vllm.LLM(worker_extension_cls=...)``; vLLM mixes it
into its GPU worker, so its methods are callable through ``llm.collective_rpc(name, args=...)``
and see the worker's ``self.model_runner`` and ``self.device``. Two weight paths:

* `update_weights_from_tensors(named)`: (name, tensor) pairs shipped by RPC (object-store path).
* `init_weight_broadcast(...)` once, then `receive_weights_broadcast(...)` per update: the
  learner (rank 0 of a separate NCCL group built with vLLM's `StatelessProcessGroup` and
  `PyNcclCommunicator`) sends buckets with `NCCLBroadcastSync.send` while every worker receives
  them (`weight_sync.NCCLBroadcastSync.receive`) and loads them in place.

This module imports nothing from vllm at import time.
"""

from __future__ import annotations

from typing import Any

import torch

from compassplay.sync.buckets import NCCLBroadcastSync


class VLLMBroadcaster:
    """`weight_sync.Broadcaster` over vLLM's StatelessProcessGroup + PyNcclCommunicator."""

    def __init__(self, group: Any, comm: Any) -> None:
        self.group, self.comm = group, comm

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        self.comm.broadcast(tensor, src=src, stream=torch.cuda.current_stream())

    def broadcast_object(self, obj: Any, src: int) -> Any:
        return self.group.broadcast_obj(obj, src=src)


def vllm_broadcast_group(host: str, port: int, rank: int, world_size: int,
                         device: torch.device | int) -> VLLMBroadcaster:
    """Join the weight-sync NCCL group (learner: rank 0; vLLM workers: 1..world_size-1)."""
    from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
    from vllm.distributed.utils import StatelessProcessGroup

    group = StatelessProcessGroup.create(host=host, port=port, rank=rank, world_size=world_size)
    return VLLMBroadcaster(group, PyNcclCommunicator(group, device=device))


class WeightSyncWorkerExtension:
    """Mixed into vLLM's worker: in-place weight loading from RPC tensors or an NCCL group."""

    def update_weights_from_tensors(self, named: list[tuple[str, torch.Tensor]]) -> int:
        """Load HF-named tensors into the running model; returns how many were given."""
        model = self.model_runner.model  # type: ignore[attr-defined]
        model.load_weights(weights=[(n, t.to(self.device)) for n, t in named])  # type: ignore
        torch.cuda.synchronize()
        return len(named)

    def init_weight_broadcast(self, host: str, port: int, rank_offset: int,
                              world_size: int) -> None:
        """Join the learner's weight-sync group as rank `rank_offset` + this worker's rank."""
        rank = rank_offset + torch.distributed.get_rank()
        self._compassplay_comm = vllm_broadcast_group(host, port, rank, world_size,
                                                      self.device)  # type: ignore[attr-defined]

    def receive_weights_broadcast(self, src: int = 0, bucket_bytes: int = 256 << 20) -> int:
        """Receive one bucketed broadcast from `src` and load it; returns its version."""
        sync = NCCLBroadcastSync(self._compassplay_comm, src=src, bucket_bytes=bucket_bytes,
                                 device=self.device)  # type: ignore[attr-defined]
        state, version = sync.receive()
        self.model_runner.model.load_weights(weights=list(state.items()))  # type: ignore
        torch.cuda.synchronize()
        return version
