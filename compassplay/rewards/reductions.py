"""The scorer's numerics: per-sample sums that do not depend on the thread count, and matrix
products of low-precision operands with float32 results.

All per-row reductions work on blocks of `ROW_BLOCK` contiguous elements (each block reduced in
float32 on its own, the blocks summed in float64), so a row's result does not depend on the
thread count (`rowsum` and `rowsq` not on the other rows in the batch either; `rowdot`'s GEMV
kernel differs for one row and several, within float32 block accuracy). `rowdot` and `rowsq` reduce without
writing an elementwise product of the row's size (at the SmolLM2 shape that product was most of
the scorer's per-layer time: a 1536 x 576 weight's 16 per-sample gradients are 57 MB, and a
product plus a sum reads and writes it three times)."""

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


def _blocks(x: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """(x as (c, m), k = full blocks per row, m)."""
    x = x.reshape(x.shape[0], -1)
    return x, x.shape[1] // ROW_BLOCK, x.shape[1]


def _finish(parts: list[torch.Tensor]) -> torch.Tensor:
    """Sum per-block float64 partials (c, blocks) over blocks, like `rowsum`'s second stage."""
    blocks = torch.cat(parts, 1) if len(parts) > 1 else parts[0]
    if blocks.shape[0] == 1 and blocks.shape[1] > ROW_BLOCK:
        return rowsum(blocks)
    return blocks.sum(1)


def rowdot(x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """`<x_i, v>` for each row of `x` (c, ...) against one `v` (same element count per row),
    float64 (c,). Per block one batched matrix-vector product (k GEMVs of (c, ROW_BLOCK) by
    (ROW_BLOCK,), float32 accumulation): no (c, m) product is written."""
    x, k, m = _blocks(x)
    v = v.reshape(-1).to(x.dtype)
    if v.numel() != m:
        raise ValueError(f"rowdot: rows of {m} elements against a vector of {v.numel()}")
    parts = []
    if k:
        xb = x[:, :k * ROW_BLOCK].reshape(x.shape[0], k, ROW_BLOCK).transpose(0, 1)
        vb = v[:k * ROW_BLOCK].reshape(k, ROW_BLOCK, 1)
        parts.append(torch.bmm(xb, vb).squeeze(2).t().double())
    if m > k * ROW_BLOCK or not parts:
        parts.append((x[:, k * ROW_BLOCK:] * v[k * ROW_BLOCK:]).sum(1, keepdim=True).double())
    return _finish(parts)


def rowsq(x: torch.Tensor) -> torch.Tensor:
    """Squared L2 norm of each row of `x` (c, ...), float64 (c,): per block `vector_norm` (many
    outputs, each reduced serially), squared in float64. Relative error ~2e-8 in float32 (a
    single `vector_norm` over millions of elements measured 3e-3)."""
    x, k, m = _blocks(x)
    parts = []
    if k:
        xb = x[:, :k * ROW_BLOCK].reshape(x.shape[0], k, ROW_BLOCK)
        parts.append(torch.linalg.vector_norm(xb, dim=2).double().square())
    if m > k * ROW_BLOCK or not parts:
        tail = torch.linalg.vector_norm(x[:, k * ROW_BLOCK:], dim=1, keepdim=True)
        parts.append(tail.double().square())
    return _finish(parts)
