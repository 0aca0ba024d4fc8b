"""One trainable model with its optimizer and LR schedule, as a learner backend provides it
(`Slot`: torch_learner, deepspeed), and the LR schedules they step (`lr_lambda`)."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path

import torch


def lr_lambda(schedule: str, warmup_steps: int, total_steps: int | None) -> Callable[[int], float]:
    """LR multiplier after `n` optimizer steps: linear warmup to 1 over `warmup_steps`, then
    constant, or cosine/linear decay to 0 at `total_steps` (required for those two)."""
    if schedule != "constant" and not total_steps:
        raise ValueError(f"learner.schedule={schedule!r} needs total_steps (pipeline.steps)")

    def fn(n: int) -> float:
        if warmup_steps and n < warmup_steps:
            return (n + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (n - warmup_steps) / max(1, total_steps - warmup_steps))
        return 0.5 * (1.0 + math.cos(math.pi * progress)) if schedule == "cosine" \
            else 1.0 - progress
    return fn


class NoOptimizerMetric(RuntimeError):
    """The learner backend cannot give the AdamW metric reward.kind=precond_cosine scores in."""


class Slot(ABC):
    """One trainable model with its optimizer and LR schedule (backend-specific)."""

    module: torch.nn.Module  # forward pass
    rank: int = 0  # in the learner group
    world_size: int = 1

    def begin_pass(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Before each micro-batch's forward whose loss `backward` takes (nothing to do for a
        backend whose forward needs no notice)."""

    @abstractmethod
    def backward(self, loss: torch.Tensor, last: bool) -> None:
        """Accumulate gradients; `last` marks the final micro-batch before `step`."""

    @abstractmethod
    def step(self) -> float:
        """Clip, optimizer step, schedule step, zero grads; returns the pre-clip grad norm."""

    @abstractmethod
    def lr(self) -> float: ...

    @abstractmethod
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """All weights with HF names, detached CPU copies."""

    def weights_view(self) -> dict[str, torch.Tensor]:
        """All weights with HF names, valid until the next `step` or `reset`: the live
        tensors (detached, any device) where the backend holds them whole, else
        `full_state_dict`'s copies. For a reader that copies them at once (`sync.packed`)."""
        return self.full_state_dict()

    @abstractmethod
    def reset(self, weights: dict[str, torch.Tensor]) -> None:
        """Back to `weights` (HF names) with a fresh optimizer and schedule, in place."""

    @abstractmethod
    def save(self, path: Path | None, weights_dir: Path | None) -> None:
        """Optimizer/scheduler state under `path`, the full weights as an HF folder in
        `weights_dir`; None: take part in a collective save, write nothing."""

    @abstractmethod
    def load(self, path: Path, weights_dir: Path) -> None:
        """Inverse of `save(path, weights_dir)`."""

    def preconditioner(self, names: list[str]) -> dict[str, torch.Tensor]:
        """Per parameter name (trainable parameters of `module`), the metric of this model's
        next AdamW step, M = 1 / (sqrt(v_hat) + eps) (`rewards.preconditioner.adamw_metric`,
        CPU float32, the parameter's shape); ones for a parameter the optimizer has not
        stepped yet (the plain metric). Backends that cannot read their optimizer state
        (DeepSpeed's partitioned one; the config refuses that pairing) raise
        `NoOptimizerMetric`."""
        raise NoOptimizerMetric(f"{type(self).__name__} cannot read its optimizer's second "
                                "moments (reward.kind=precond_cosine needs "
                                "learner.backend=torch)")
