"""Bucketed weight broadcast: the learner rank sends its state dict in flat byte buckets.

`NCCLBroadcastSync` sends the weights in buckets of `bucket_bytes` over a torch.distributed
group (NCCL on GPUs, gloo on CPU in tests) that holds the learner and every generator/scorer
rank; receivers take bucket after bucket (a vLLM worker loads each into its model, an HF role
or scorer stages each on the CPU), so a receiving GPU holds one bucket beside its model. `sync.channel` wraps it for the
pipeline; inside vLLM the receiving side runs in the worker (`vllm_worker`). The object-store
path (HF engines) needs none of this: the state dict travels as a Ray object and
`workers.versioned.Versioned.sync` loads it only when its version is newer.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import torch


class Broadcaster(Protocol):
    """The collective a `NCCLBroadcastSync` needs (torch.distributed or vLLM's PyNccl)."""

    def broadcast(self, tensor: torch.Tensor, src: int) -> None: ...

    def broadcast_object(self, obj: Any, src: int) -> Any: ...


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

    def receive_buckets(self) -> tuple[int, Iterator[list[tuple[str, torch.Tensor]]]]:
        """Called on every other rank: the announced version (from the header) and an iterator
        of buckets, each a list of (name, tensor on `device`) in the sender's order. The
        iterator must be drained (every rank takes part in every bucket's collective); a
        tensor is a view into its bucket's buffer, valid until the caller drops it."""
        header = self.comm.broadcast_object(None, self.src)
        meta = header["meta"]

        def buckets() -> Iterator[list[tuple[str, torch.Tensor]]]:
            for idx in _buckets(meta, self.bucket_bytes):
                flat = torch.empty(sum(meta[i][3] for i in idx), dtype=torch.uint8,
                                   device=self.device)
                self.comm.broadcast(flat, self.src)
                part, off = [], 0
                for i in idx:
                    name, dtype_name, shape, nbytes = meta[i]
                    dtype = getattr(torch, dtype_name)
                    chunk = flat[off:off + nbytes]
                    if off % torch.empty((), dtype=dtype).element_size():
                        chunk = chunk.clone()  # view(dtype) needs an aligned offset
                    part.append((name, chunk.view(dtype).reshape(shape)))
                    off += nbytes
                yield part

        return int(header["version"]), buckets()

    def receive(self, stage: str | torch.device | None = None
                ) -> tuple[dict[str, torch.Tensor], int]:
        """Called on every other rank: the broadcast state dict and its version. `stage`:
        where the tensors are kept, each copied out of its bucket as the bucket arrives, so
        `device` holds one bucket at a time (e.g. "cpu" beside a GPU model the caller loads it
        into); None keeps them on `device`, views into their buckets (a whole state dict)."""
        version, parts = self.receive_buckets()
        if stage is None:
            return {name: t for part in parts for name, t in part}, version
        return {name: t.to(stage, copy=True) for part in parts for name, t in part}, version


def encode_named(named: list[tuple[str, torch.Tensor]]) -> list[list]:
    """[(name, tensor)] as msgpack-plain [name, dtype, shape, raw bytes] items (CPU copies).

    vLLM's v1 RPC (LLM -> engine core, msgpack) decodes its arguments without a schema: a
    tensor arrives as [dtype, shape, data] whose data is an index into buffers the worker
    never sees once it is over a few hundred bytes; `bytes` always travel inline."""
    out = []
    for name, t in named:
        t = t.detach().to("cpu").contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes()
        out.append([name, str(t.dtype).removeprefix("torch."), list(t.shape), raw])
    return out


def decode_named(items: list) -> list[tuple[str, torch.Tensor]]:
    """The inverse of `encode_named` (tensors own their memory, on CPU)."""
    out = []
    for name, dtype_name, shape, raw in items:
        flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        out.append((str(name), flat.view(getattr(torch, dtype_name)).reshape(list(shape))))
    return out
