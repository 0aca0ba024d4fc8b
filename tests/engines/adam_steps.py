"""Comparing two AdamW first steps from the same weights.

Adam's first step moves a weight by lr * g / (|g| + eps): lr * sign(g) wherever |g| >> eps,
where two runs with equal gradients up to float order agree to rounding. A weight whose
gradient is within a few eps of 0 turns that rounding into up to a few percent of lr (machine
dependent: 1.03e-4 at lr 1e-2 on a 2-core EPYC), so such weights are held to a loose bound
while the sign-step weights, nearly all of them, are compared tightly."""

from __future__ import annotations

import torch


def assert_same_adam_step(after: torch.Tensor, expected: torch.Tensor, before: torch.Tensor,
                          lr: float, atol: float, name: str = "") -> tuple[int, int]:
    """Assert `after` equals `expected` (both one step from `before`) to `atol` where the
    expected step is a sign step (|step| > 0.9 lr) and to 0.05 lr elsewhere. Returns (sign-step
    elements, elements) so a caller can require that nearly all were compared tightly."""
    sign_step = (expected - before).abs() > 0.9 * lr
    torch.testing.assert_close(after[sign_step], expected[sign_step], atol=atol, rtol=0,
                               msg=lambda m: f"{name}: {m}")
    torch.testing.assert_close(after, expected, atol=0.05 * lr, rtol=0,
                               msg=lambda m: f"{name}: {m}")
    return int(sign_step.sum()), expected.numel()
