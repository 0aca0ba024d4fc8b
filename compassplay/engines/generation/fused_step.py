"""A CPU decode step of `StaticDecoder` on the fused C kernels (`decode_kernels`), for a
bfloat16 or float32 decoder.

Between a block's four matmuls (the decoder's own packed `_linear`), three C calls replace the
~30 torch ops of `StaticDecoder._forward`'s decode path: residual add + RMS norm, rotary
embedding + KV write + attention (cached columns that rows share read from one row,
`shared_reads`), SiLU x up; the same roundings, another summation order.
`resolve_kernels` decides whether a decoder uses them (`SamplingSection.decode_kernels`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from compassplay.engines.generation import decode_kernels
from compassplay.engines.generation.decode_kernels import DecodeKernels
from compassplay.engines.generation.shared_reads import READS

if TYPE_CHECKING:
    from compassplay.engines.generation.static_decoder import StaticDecoder


def resolve_kernels(decoder: StaticDecoder, choice: str) -> DecodeKernels | None:
    """The kernels a decoder's steps use (None: torch ops). "auto" takes them for a bfloat16
    or float32 decoder on CPU where the library builds; "c" where they cannot apply or build
    is a ValueError naming the reason; "torch" never takes them. The decoder caches its keys
    transposed ([d, C]) when it takes them."""
    if choice not in decode_kernels.KERNEL_CHOICES:
        raise ValueError(f"decode_kernels: unknown choice {choice!r} (expected one of "
                         f"{decode_kernels.KERNEL_CHOICES})")
    if choice == "torch":
        return None
    kern, why = None, None
    if decoder.head.device.type != "cpu":
        why = "the decoder is not on CPU"
    elif decoder.dtype not in decode_kernels.VARIANTS:
        why = f"the decoder runs in {decoder.dtype}, the kernels in bfloat16 or float32"
    elif (kern := decode_kernels.load(dtype=decoder.dtype)) is None:
        why = "the library could not be built (logged above)"
    if why is not None and choice == "c":
        raise ValueError(f"decode_kernels=c: {why}")
    return kern


class FusedStep:
    """`decoder.step`'s work on `kern`: call with (tok [B] long, column t) -> logits [B, V]
    float32. Reads the decoder's cache, mask, rotary tables and pad counts as they are at
    each call (its `start` and `keep` replace them)."""

    def __init__(self, decoder: StaticDecoder, kern: DecodeKernels) -> None:
        self.decoder = decoder
        self.kern = kern
        self._bufs: dict[tuple[int, int], tuple[torch.Tensor, ...]] = {}

    def buffers(self, rows: int, capacity: int) -> tuple[torch.Tensor, ...]:
        """The step's work tensors for `rows` rows and cache capacity C, kept while the shape
        holds: normed hidden [B, 1, H], attention output [B, 1, nh d] and MLP activation
        [B, 1, I] (the decoder's dtype), the attention's scratch [B nkv, (nh / nkv) C]
        float32."""
        key = (rows, capacity)
        if (bufs := self._bufs.get(key)) is None:
            dec = self.decoder
            hidden, inner = dec.head.shape[1], dec.blocks[0].wd.shape[1]
            bufs = (torch.empty((rows, 1, hidden), dtype=dec.dtype),
                    torch.empty((rows, 1, dec.nh * dec.d), dtype=dec.dtype),
                    torch.empty((rows, 1, inner), dtype=dec.dtype),
                    torch.empty((rows * dec.nkv, (dec.nh // dec.nkv) * capacity)))
            self._bufs = {key: bufs}
        return bufs

    def __call__(self, tok: torch.Tensor, t: int) -> torch.Tensor:
        dec, kern, bsz = self.decoder, self.kern, len(tok)
        h, att, act, scratch = self.buffers(bsz, dec._v.shape[3])
        h2, att2, act2 = h.view(bsz, -1), att.view(bsz, -1), act.view(bsz, -1)
        x = dec.embed[tok].float().contiguous()  # [B, H] float32 residual stream
        pos = (t - dec._pad).contiguous()
        bias = dec._bias.view(bsz, -1)
        heads, delta = (dec.nh, dec.nkv, dec.d), None
        for i, b in enumerate(dec.blocks):
            kern.add_rms(x, delta, b.ln1, h2, dec.eps)  # x: the stream entering block i
            if i == dec.capture_layer and dec._states is not None:
                dec._states[:, t] = x
            qkv = dec._linear(h, b.wqkv, b.bqkv)
            if i == 0:  # the kernels read raw memory: every layout they assume, once a step
                self.check_layout(qkv, bias)
            kern.rope_attend(qkv, dec._cos, dec._sin, pos, dec._k[i], dec._v[i], bias,
                             dec._reads, scratch, att2, heads, t, dec.scale)
            kern.add_rms(x, dec._linear(att, b.wo), b.ln2, h2, dec.eps)
            kern.silu_mul(dec._linear(h, b.wgu), act2)
            delta = dec._linear(act, b.wd)
        kern.add_rms(x, delta, dec.norm, h2, dec.eps)
        return dec._linear(h, dec.head)[:, 0].float()

    def check_layout(self, qkv: torch.Tensor, bias: torch.Tensor) -> None:
        """What the kernels read as plain arrays: contiguous, on CPU, in their dtypes
        (ValueError naming the tensor otherwise, where the C code would read wrong memory)."""
        dec = self.decoder
        if self.kern.dtype != dec.dtype:  # a library reads its own storage type only
            raise ValueError(f"decode_kernels: the {self.kern.dtype} library cannot run a "
                             f"{dec.dtype} decoder")
        want = {"keys": (dec._k, dec.dtype), "values": (dec._v, dec.dtype),
                "qkv": (qkv, dec.dtype), "key mask": (bias, torch.float32),
                "cos": (dec._cos, torch.float32), "sin": (dec._sin, torch.float32),
                "pad": (dec._pad, torch.long), "reads": (dec._reads, torch.long)}
        for name, (ten, dtype) in want.items():
            if not ten.is_contiguous() or ten.dtype != dtype or ten.device.type != "cpu":
                raise ValueError(f"decode_kernels: {name} must be a contiguous CPU {dtype} "
                                 f"tensor (got {ten.dtype}, strides {ten.stride()})")
        if dec._reads.shape != (len(dec._pad), len(READS)):
            raise ValueError(f"decode_kernels: reads must be [{len(dec._pad)}, {len(READS)}] "
                             f"(got {tuple(dec._reads.shape)})")
