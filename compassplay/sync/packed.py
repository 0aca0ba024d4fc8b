"""PackedWeights: a state dict as one flat byte buffer, so a snapshot moves as one array (no Ray).

A state dict of torch tensors pickles tensor by tensor through torch's own reducer, which
copies every byte into the pickle stream: under Ray a snapshot of SmolLM2-135M in fp32 (651 MB
as a state dict, whose tied head is a second copy of the embedding) took 3.1-4.0 s to store and
0.8-2.8 s for each receiver to fetch (2 cores, 2026-12-06). One
contiguous numpy array pickles out of band (protocol 5): Ray's object store copies it once,
and a receiver on the same node maps it without a copy. `unpack` gives tensors that are views
of the buffer: on a receiver of Ray's object store they are read only (the store's shared
memory), so a receiver copies them into its own weights (`load_state_dict`) and keeps none.

Tensors that share storage in the packed dict (tied embeddings) are packed once.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

ALIGN = 64
"""Byte alignment of every tensor in the buffer (any dtype's view, and vector loads)."""


@dataclass(frozen=True)
class Entry:
    """Where one tensor lives in the buffer: `offset` in bytes, `dtype` a torch dtype name."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int


@dataclass
class PackedWeights:
    """`buffer`: uint8, 1-D, every tensor's bytes at its entry's offset; `entries` in the
    packed dict's order (aliases share an offset)."""

    buffer: np.ndarray
    entries: list[Entry]

    @classmethod
    def pack(cls, state: dict[str, torch.Tensor], arena: PackArena | None = None
             ) -> PackedWeights:
        """Copy `state` (any device) into one CPU buffer (from `arena` when given: valid until
        its next pack); tensors sharing storage (same data pointer, dtype, shape and
        strides) are stored once."""
        entries, placed, size = layout(state)
        buffer = arena.take(size) if arena is not None else np.empty(size, dtype=np.uint8)
        flat = torch.from_numpy(buffer)
        for offset, t in placed:
            n = t.numel() * t.element_size()
            if n:
                view = flat[offset:offset + n].view(t.dtype).view(t.shape)
                view.copy_(t.detach())
        return cls(buffer, entries)

    @property
    def nbytes(self) -> int:
        return int(self.buffer.nbytes)

    def __len__(self) -> int:
        return len(self.entries)

    def names(self) -> list[str]:
        return [e.name for e in self.entries]

    def unpack(self) -> dict[str, torch.Tensor]:
        """The state dict as views of the buffer (read only when the buffer is; no copy)."""
        with warnings.catch_warnings():  # a mapped object-store buffer is not writable
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            flat = torch.from_numpy(self.buffer)
        out: dict[str, torch.Tensor] = {}
        for e in self.entries:
            dtype = getattr(torch, e.dtype)
            n = int(np.prod(e.shape, dtype=np.int64)) * torch.empty((), dtype=dtype).element_size()
            out[e.name] = flat[e.offset:e.offset + n].view(dtype).view(e.shape)
        return out


def layout(state: dict[str, torch.Tensor]
           ) -> tuple[list[Entry], list[tuple[int, torch.Tensor]], int]:
    """Where `pack` puts each tensor: (the entries in `state`'s order, (offset, tensor) of
    each distinct storage to copy, the buffer's size in bytes)."""
    entries: list[Entry] = []
    first: dict[tuple, int] = {}
    placed: list[tuple[int, torch.Tensor]] = []
    size = 0
    for name, t in state.items():
        key = (t.device, t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride()))
        if t.numel() and key in first:
            offset = first[key]
        else:
            offset = first[key] = size
            placed.append((offset, t))
            size += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
        entries.append(Entry(name, str(t.dtype).removeprefix("torch."), tuple(t.shape), offset))
    return entries, placed, size


class PackArena:
    """One buffer reused by successive packs, for a producer whose every pack is copied
    before it packs again: a Ray actor's return value is stored in the object store before
    the actor's next call starts. A fresh 538 MB buffer costs its page faults each time
    (0.3-1.2 s on 2 cores: allocations that large are mapped anew by malloc); a reused one
    is only copied into (0.06-0.08 s). The price: the producer holds one snapshot's bytes
    of host memory for its life (a 7B model's bf16 weights: 15 GB)."""

    def __init__(self) -> None:
        self._buffer = np.empty(0, dtype=np.uint8)

    def reserve(self, nbytes: int) -> None:
        """Hold at least `nbytes`, every page touched now (at start-up, off a step's path)
        rather than by the first pack."""
        self.take(nbytes).fill(0)

    def take(self, nbytes: int) -> np.ndarray:
        """`nbytes` of the buffer (grown when smaller); overwrites the previous pack."""
        if self._buffer.nbytes < nbytes:
            self._buffer = np.empty(0, dtype=np.uint8)  # drop the old one before growing
            self._buffer = np.empty(nbytes, dtype=np.uint8)
        return self._buffer[:nbytes]


def unpacked(state: PackedWeights | dict[str, torch.Tensor] | None
             ) -> dict[str, torch.Tensor] | None:
    """`state` as a plain state dict (PackedWeights unpacked; a dict or None as it is)."""
    return state.unpack() if isinstance(state, PackedWeights) else state
