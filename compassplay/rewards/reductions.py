"""The scorer's numerics: per-sample sums that do not depend on the thread count, and matrix
products of low-precision operands with float32 results."""

from __future__ import annotations

import torch

LOW_PRECISION = (torch.bfloat16, torch.float16)


def bmm32(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """`bmm(x, y)` as float32. Low-precision operands are multiplied in their dtype with
    float32 accumulation: on CUDA with a float32 result (`out_dtype`); on other devices, which
    lack that overload, the result is rounded to the operand dtype and widened."""
    if x.dtype not in LOW_PRECISION:
        return torch.bmm(x, y)
    if x.is_cuda:  # GPU only: bf16 tensor cores, float32 output
        return torch.bmm(x, y, out_dtype=torch.float32)
    return torch.bmm(x, y).float()


def mm32(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """`mm(x, y)` as float32, like `bmm32`."""
    if x.dtype not in LOW_PRECISION:
        return torch.mm(x, y)
    if x.is_cuda:  # GPU only
        return torch.mm(x, y, out_dtype=torch.float32)
    return torch.mm(x, y).float()


def rowsq(flat: torch.Tensor) -> torch.Tensor:
    """Squared L2 norm of each row of (c, m), float64 (c,), by `rowsum` (under CPU
    oversubscription many small calls are much slower; `vector_norm` is inaccurate)."""
    return rowsum(flat.square())


ROW_BLOCK = 4096
"""Elements per block of `rowsum`'s first stage (below torch's parallel grain, 32768)."""


def rowsum(x: torch.Tensor) -> torch.Tensor:
    """Sum of each row of `x` (c, ...) as float64 (c,), bitwise independent of the thread count
    and of which other rows are in `x`.

    A plain `x.sum(1)` is not: on CPU, a reduction to a single output (one row, e.g. a chunk of
    one sample) above torch's grain size is split over the threads and the per-thread partial
    sums are combined, so 1 and 2 threads give results ~1e-8 apart (a Ray actor and the driver
    then disagree). Here each row is cut into blocks of `ROW_BLOCK` contiguous elements, each
    block summed in float32 on its own (many outputs: torch parallelizes over outputs, every
    output reduced serially), then the blocks are summed in float64 (at most m / ROW_BLOCK + 1
    per row, serial or parallel over rows). Accuracy: pairwise within a block, float64 across.
    """
    c = x.shape[0]
    x = x.reshape(c, -1)
    m, acc = x.shape[1], torch.float64 if x.dtype == torch.float64 else torch.float32
    k = m // ROW_BLOCK
    parts = [x[:, :k * ROW_BLOCK].reshape(c, k, ROW_BLOCK).sum(2, dtype=acc)] if k else []
    if m > k * ROW_BLOCK or not parts:
        parts.append(x[:, k * ROW_BLOCK:].sum(1, keepdim=True, dtype=acc))
    blocks = torch.cat(parts, 1).double() if len(parts) > 1 else parts[0].double()
    if c == 1 and blocks.shape[1] > ROW_BLOCK:  # keep the second stage serial as well
        return rowsum(blocks)
    return blocks.sum(1)
