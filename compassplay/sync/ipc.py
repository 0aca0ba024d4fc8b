"""CUDA IPC weight hand-over to vLLM workers on the same node (no tensor in any RPC).

The producer (the learner, colocated on the engine's GPU, or a vLLM engine's own process for
the object-store path) `publish`es an update: a pickle file in a private temporary folder with
the version and, per GPU UUID, ``(name, handle)`` pairs, where a handle is
``torch.multiprocessing.reductions.reduce_tensor(t)`` of a CUDA tensor (what vLLM's
rlhf_colocate example sends). Only the file's path and the version cross vLLM's RPC; each
worker reads the file (`read_update`), opens the handles of its own GPU (`open_tensor`, with
the device index rewritten to the worker's own, since processes number GPUs differently) and
copies the weights in. The producer must keep the tensors alive until every worker returned;
`IpcUpdate.close` then deletes the file and lets CUDA release the shared blocks.

CPU tensors (the CPU tests' fake engine) are stored in the file by value.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from typing import Any

import torch


def share_tensor(t: torch.Tensor) -> tuple:
    """A picklable handle to contiguous `t`: CUDA IPC for a CUDA tensor, the tensor itself on
    CPU. The caller keeps `t` alive until every consumer is done."""
    if t.is_cuda:
        from torch.multiprocessing.reductions import reduce_tensor

        return ("cuda", reduce_tensor(t))
    return ("cpu", t)


def open_tensor(handle: tuple, device_index: int | None) -> torch.Tensor:
    """The tensor `handle` names, opened on this process's GPU `device_index` (the same
    physical GPU as the producer's, numbered as this process sees it)."""
    kind, payload = handle
    if kind == "cpu":
        return payload
    func, args = payload
    args = list(args)
    if device_index is not None:
        args[6] = device_index  # rebuild_cuda_tensor's storage_device
    return func(*args)


class IpcUpdate:
    """One published update: `path` goes to the workers; `close()` after they all loaded."""

    def __init__(self, path: str, keep: list[torch.Tensor]) -> None:
        self.path, self._keep = path, keep

    def close(self) -> None:
        if os.path.exists(self.path):
            os.unlink(self.path)
            os.rmdir(os.path.dirname(self.path))
        cuda = any(t.is_cuda for t in self._keep)
        self._keep = []
        if cuda:
            torch.cuda.ipc_collect()

    def __enter__(self) -> IpcUpdate:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def publish(by_device: dict[str, list[tuple[str, torch.Tensor]]], version: int) -> IpcUpdate:
    """Write the handle file of `version` for the GPUs (by UUID) in `by_device`."""
    # the exact tensors the handles point to stay referenced until close()
    flat = {uuid: [(name, t.detach().contiguous()) for name, t in named]
            for uuid, named in by_device.items()}
    keep = [t for named in flat.values() for _, t in named]
    payload = {"version": int(version),
               "by_device": {uuid: [(name, share_tensor(t)) for name, t in named]
                             for uuid, named in flat.items()}}
    folder = tempfile.mkdtemp(prefix="compassplay-ipc-")  # mode 0700: this user only
    path = os.path.join(folder, f"v{int(version)}.pkl")
    with open(path, "wb") as f:
        pickle.dump(payload, f, protocol=pickle.HIGHEST_PROTOCOL)
    return IpcUpdate(path, keep)


def read_update(path: str) -> dict:
    """{"version": int, "by_device": {uuid: [(name, handle)]}} from a handle file."""
    with open(path, "rb") as f:
        return pickle.load(f)
