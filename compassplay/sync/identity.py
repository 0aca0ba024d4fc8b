"""Which physical device a process computes on, named the same from every process (no Ray).

CUDA: the GPU's UUID (independent of CUDA_VISIBLE_DEVICES numbering). CPU: ``cpu:<host>``
(every CPU process of a host shares it; CUDA IPC never applies there). Used to match a
colocated producer's tensors to the consumer's device (`sync.ipc`).
"""

from __future__ import annotations

import socket

import torch


def device_id(device: torch.device | str) -> str:
    """A stable name of `device`'s physical device (see the module docstring)."""
    device = torch.device(device)
    if device.type == "cuda":
        return str(torch.cuda.get_device_properties(device).uuid)
    return f"{device.type}:{socket.gethostname()}"
