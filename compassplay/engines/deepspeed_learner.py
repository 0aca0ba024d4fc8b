"""DeepSpeed learner backend: ZeRO stage from `learner.zero_stage`, same AdamW/LambdaLR/clipping
as the torch backend (so both give the same update on a float32 model).

On a machine without CUDA, DeepSpeed runs on its CPU accelerator (``DS_ACCELERATOR=cpu``, set
here when unset) over a gloo process group; on GPUs it uses NCCL. When torch.distributed is not
initialized (a single process, e.g. a Ray actor) a world of size 1 is created on 127.0.0.1 and
a free port. bfloat16/float16 models enable DeepSpeed's bf16/fp16 mode.

Gradient accumulation: DeepSpeed is configured with gradient_accumulation_steps=1 and the
boundary is set by hand (`set_gradient_accumulation_boundary`) so that a step may have any
number of micro-batches; the loss is already normalized by the step's total token count.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import torch

from compassplay.engines.learner import Slot, lr_lambda
from compassplay.engines.torch_learner import make_adamw

_TAG = "state"


def _import_deepspeed() -> Any:
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        import deepspeed
    except ImportError as exc:
        raise ImportError("learner.backend='deepspeed' needs DeepSpeed: "
                          "pip install compassplay[deepspeed] (or learner.backend=torch)") from exc
    return deepspeed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_distributed(deepspeed: Any) -> None:
    """Initialize torch.distributed (world of 1 unless the launcher set RANK/WORLD_SIZE)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    deepspeed.init_distributed(dist_backend=backend, verbose=False)


def ds_config(cfg: Any, dtype: torch.dtype) -> dict[str, Any]:
    """The DeepSpeed config for a `LearnerSection`."""
    conf: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": cfg.max_grad_norm,
        "zero_optimization": {"stage": cfg.zero_stage},
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
        "zero_allow_untested_optimizer": True,
    }
    if dtype == torch.bfloat16:
        conf["bf16"] = {"enabled": True}
    elif dtype == torch.float16:
        conf["fp16"] = {"enabled": True}
    return conf


class DeepSpeedSlot(Slot):
    """One model wrapped in a DeepSpeed engine (`module` is the engine; it forwards)."""

    def __init__(self, model: torch.nn.Module, cfg: Any, total_steps: int | None = None) -> None:
        ds = _import_deepspeed()
        ensure_distributed(ds)
        self._ds, self.zero_stage = ds, cfg.zero_stage
        fn = lr_lambda(cfg.schedule, cfg.warmup_steps, total_steps)
        params = [p for p in model.parameters() if p.requires_grad]
        self.engine, _, _, _ = ds.initialize(
            model=model, model_parameters=params,
            optimizer=lambda ps: make_adamw(ps, cfg.lr),
            lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, fn),
            config=ds_config(cfg, next(model.parameters()).dtype))
        self.module = self.engine

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        self.engine.set_gradient_accumulation_boundary(last)
        self.engine.backward(loss)

    def step(self) -> float:
        self.engine.set_gradient_accumulation_boundary(True)
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    def lr(self) -> float:
        return float(self.engine.get_lr()[0])

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        model = self.engine.module
        if self.zero_stage < 3:
            return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        with self._ds.zero.GatheredParameters(list(model.parameters()), modifier_rank=None):
            return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}

    def save(self, path: Path) -> None:
        """model.safetensors + config.json (full weights) and DeepSpeed's own checkpoint
        (optimizer partitions, scheduler) under path/deepspeed/."""
        self.engine.module.save_pretrained(str(path), state_dict=self.full_state_dict())
        self.engine.save_checkpoint(str(path / "deepspeed"), tag=_TAG, save_latest=False)

    def load(self, path: Path) -> None:
        load_path, _ = self.engine.load_checkpoint(
            str(path / "deepspeed"), tag=_TAG, load_optimizer_states=True,
            load_lr_scheduler_states=True)
        if load_path is None:
            raise FileNotFoundError(f"{path / 'deepspeed'}: no DeepSpeed checkpoint '{_TAG}'")
