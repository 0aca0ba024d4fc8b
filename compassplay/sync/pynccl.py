"""The weight-sync group over vLLM's `StatelessProcessGroup` + `PyNcclCommunicator` (GPU only).

Used when a vLLM engine receives weights by NCCL (its workers cannot join a torch process
group of their own): the learner, every vLLM worker and every other receiver of the run
join through this transport so the group is built the same way on every rank
(`sync.channel.transport_for`). vLLM is imported only when a group is formed.
"""

from __future__ import annotations

from typing import Any

import torch


class VLLMBroadcaster:
    """`sync.buckets.Broadcaster` over vLLM's StatelessProcessGroup + PyNcclCommunicator."""

    def __init__(self, group: Any, comm: Any) -> None:
        self.group, self.comm = group, comm

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        self.comm.broadcast(tensor, src=src, stream=torch.cuda.current_stream())

    def broadcast_object(self, obj: Any, src: int) -> Any:
        return self.group.broadcast_obj(obj, src=src)


def check_enabled(comm: Any, rank: int, world_size: int) -> None:
    """PyNccl disables itself silently (no libnccl, world size 1, VLLM_DISABLE_PYNCCL...);
    its broadcast then does nothing and receivers would load uninitialised memory."""
    if getattr(comm, "disabled", False) or getattr(comm, "available", True) is False:
        raise RuntimeError(f"vLLM's PyNcclCommunicator is disabled on weight-sync rank {rank} "
                           f"of {world_size} (no usable libnccl, a world of 1, or "
                           "VLLM_DISABLE_PYNCCL): the weight broadcast would send nothing; use "
                           "learner.weight_sync=object_store")


def vllm_broadcast_group(host: str, port: int, rank: int, world_size: int,
                         device: torch.device | int) -> VLLMBroadcaster:
    """Join the weight-sync NCCL group (learner: rank 0; vLLM workers: see `sync.ranks`)."""
    from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
    from vllm.distributed.utils import StatelessProcessGroup

    group = StatelessProcessGroup.create(host=host, port=port, rank=rank, world_size=world_size)
    comm = PyNcclCommunicator(group, device=device)
    check_enabled(comm, rank, world_size)
    return VLLMBroadcaster(group, comm)
