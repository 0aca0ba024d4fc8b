"""DeepSpeed learner backend: ZeRO stage from `learner.zero_stage`, same AdamW/LambdaLR/clipping
as the torch backend (so both give the same update on a float32 model).

On a machine without CUDA, DeepSpeed runs on its CPU accelerator (``DS_ACCELERATOR=cpu``, set
here when unset) over a gloo process group; on GPUs it uses NCCL. The process group is the
learner group of `RankInfo` (`engines.training.dist`): N ranks, data parallel, ZeRO sharding the
optimizer state (stage >= 1), gradients (>= 2) and parameters (3) over them; without one (a
single process) a world of 1 on 127.0.0.1 and a free port, unless a launcher set
RANK/WORLD_SIZE. bfloat16/float16 models enable DeepSpeed's bf16/fp16 mode.

Gradient accumulation: DeepSpeed is configured with gradient_accumulation_steps=1 and the
boundary is set by hand (`set_gradient_accumulation_boundary`) so that a step may have any
number of micro-batches; the loss is already normalized by the step's total token count.
DeepSpeed averages gradients over the ranks; `PolicyLearner` scales each rank's loss by the
world size so that the average is the full batch's gradient.

Checkpoints (`save`/`load`) are independent of the number of ranks: see `deepspeed_state`.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import torch

from compassplay.engines.training import deepspeed_state as dstate
from compassplay.engines.training.dist import RankInfo, free_port, init_group, leave_at_exit
from compassplay.engines.training.slot import Slot, lr_lambda
from compassplay.engines.training.torch_learner import make_adamw, save_weights

_TAG = "state"  # DeepSpeed's own checkpoint tag (older checkpoints, same rank count only)
# ZeRO-3 + gradient checkpointing + frozen parameters fails in backward (CheckpointError)
# before this release (fixed by deepspeed PR #8148); pyproject's floor is the same
ZERO3_CHECKPOINTING_FROZEN = (0, 19, 3)


def _release(version: str) -> tuple[int, ...]:
    """'0.19.3+abc' -> (0, 19, 3)."""
    out = []
    for part in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits or 0))
    return tuple(out)


def check_deepspeed_version(version: str, cfg: Any, frozen: bool) -> None:
    """ImportError when this DeepSpeed cannot run the configured learner: ZeRO-3 with
    gradient checkpointing and `frozen` parameters (learner.trainable) needs
    `ZERO3_CHECKPOINTING_FROZEN`."""
    if cfg.zero_stage == 3 and cfg.gradient_checkpointing and frozen \
            and _release(version) < ZERO3_CHECKPOINTING_FROZEN:
        need = ".".join(map(str, ZERO3_CHECKPOINTING_FROZEN))
        raise ImportError(f"learner.zero_stage=3 with learner.gradient_checkpointing and frozen "
                          f"parameters (learner.trainable={cfg.trainable!r}) fails in backward "
                          f"on DeepSpeed {version} (CheckpointError, fixed in {need}): "
                          f"pip install 'deepspeed>={need}'")


def make_optimizer(params: list[torch.nn.Parameter], cfg: Any) -> torch.optim.Optimizer:
    """torch AdamW (as the torch backend); DeepSpeedCPUAdam (same update, AdamW mode) when
    the optimizer is offloaded next to GPUs."""
    if cfg.offload_optimizer and torch.cuda.is_available():  # GPU only: never run on CPU CI
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(params, lr=cfg.lr, betas=(0.9, 0.999), eps=1e-8,
                                weight_decay=0.0, adamw_mode=True)
    return make_adamw(params, cfg.lr)


def _import_deepspeed() -> Any:
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        import deepspeed
    except ImportError as exc:
        raise ImportError("learner.backend='deepspeed' needs DeepSpeed: "
                          "pip install compassplay[deepspeed] (or learner.backend=torch)") from exc
    return deepspeed


def ensure_distributed(deepspeed: Any, info: RankInfo | None = None) -> None:
    """Join the learner group `info`; None: a world of 1 unless a launcher set
    RANK/WORLD_SIZE."""
    if info is not None:
        init_group(info, lambda **kw: deepspeed.init_distributed(verbose=False, **kw))
        return
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port("127.0.0.1")))
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    deepspeed.init_distributed(dist_backend=backend, verbose=False)
    leave_at_exit(backend)


def ds_config(cfg: Any, dtype: torch.dtype) -> dict[str, Any]:
    """The DeepSpeed config for a `LearnerSection` (micro-batch sizes are per rank; the
    learner sets the accumulation boundary itself)."""
    zero: dict[str, Any] = {"stage": cfg.zero_stage}
    pin = torch.cuda.is_available()
    if cfg.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": pin}
    if cfg.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": pin}
    conf: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": cfg.max_grad_norm,
        "zero_optimization": zero,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
        "zero_allow_untested_optimizer": True,
        # offload with the shared torch AdamW on a CPU-only machine (no DeepSpeedCPUAdam build)
        "zero_force_ds_cpu_optimizer": False,
    }
    if dtype == torch.bfloat16:
        conf["bf16"] = {"enabled": True}
    elif dtype == torch.float16:
        conf["fp16"] = {"enabled": True}
    return conf


class DeepSpeedSlot(Slot):
    """One model wrapped in a DeepSpeed engine (`module` is the engine; it forwards).
    Collective methods (every rank calls them): backward, step, full_state_dict, save, load."""

    def __init__(self, model: torch.nn.Module, cfg: Any, total_steps: int | None = None,
                 dist: RankInfo | None = None) -> None:
        ds = _import_deepspeed()
        ensure_distributed(ds, dist)
        self._ds, self.zero_stage = ds, cfg.zero_stage
        self._can_offload = cfg.zero_stage >= 1 and not cfg.offload_optimizer
        self._offloaded = False
        self.rank = torch.distributed.get_rank()
        self.world_size = torch.distributed.get_world_size()
        fn = lr_lambda(cfg.schedule, cfg.warmup_steps, total_steps)
        params = [p for p in model.parameters() if p.requires_grad]
        check_deepspeed_version(getattr(ds, "__version__", "0"), cfg,
                                frozen=len(params) < len(list(model.parameters())))
        self.engine, _, _, _ = ds.initialize(
            model=model, model_parameters=params,
            optimizer=lambda ps: make_optimizer(ps, cfg),
            lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, fn),
            config=ds_config(cfg, next(model.parameters()).dtype))
        self.module = self.engine
        self._schedule0 = copy.deepcopy(self.engine.lr_scheduler.state_dict())

    def begin_pass(self) -> None:
        """What `engine.forward` does first, for the learner's forwards that bypass it (on
        `base_model`, to take the head at the needed positions only): DeepSpeed 0.19's
        ZeRO optimizers advance their micro-step there (`clear_backward_seen_flag`: the
        first micro-batch's gradient is copied, each later one added). Without it every
        micro-batch of a ZeRO-3 step overwrote the one before (0.19.8; tests). Calling it
        twice before one forward changes nothing."""
        clear = getattr(self.engine.optimizer, "clear_backward_seen_flag", None)
        if clear is not None:
            clear()

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        self.reload_states()
        self.engine.set_gradient_accumulation_boundary(last)
        self.engine.backward(loss)

    def step(self) -> float:
        self.reload_states()
        self.engine.set_gradient_accumulation_boundary(True)
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    def lr(self) -> float:
        return float(self.engine.get_lr()[0])

    def release_memory(self) -> None:
        """Between steps on a GPU shared with engines (`LearnerWorker.release_cached_memory`):
        move the AdamW moments and fp32 master weights to pinned CPU memory
        (`engine.offload_states`, ZeRO >= 1 without `offload_optimizer`; the bf16 parameters
        stay, the engines load them by CUDA IPC) and free ZeRO-3's partition cache
        (`engine.empty_partition_cache()`, the gathered parameters torch's `empty_cache`
        alone cannot free). The next backward, step, save, load or reset reloads them
        (`reload_states`). GPU only; never run on a GPU (docs: never-run GPU lines)."""
        if self._can_offload and not self._offloaded and torch.cuda.is_available():
            from deepspeed.runtime.zero.offload_config import OffloadStateTypeEnum

            self.engine.offload_states(include=[OffloadStateTypeEnum.optim_states,
                                                OffloadStateTypeEnum.hp_params],
                                       pin_memory=True)
            self._offloaded = True
        self.engine.empty_partition_cache()

    def reload_states(self) -> None:
        """Bring states `release_memory` offloaded back to the GPU (no-op otherwise)."""
        if self._offloaded:
            self.engine.reload_states()
            self._offloaded = False

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Full weights on rank 0 ({} on the other ranks); collective."""
        return dstate.full_state_dict(self._ds, self.engine.module, self.zero_stage)

    def reset(self, weights: dict[str, torch.Tensor]) -> None:
        """Weights, fp32 master weights <- `weights`; empty AdamW state; schedule at step 0.
        Collective (ZeRO-3 re-partitions the parameters from rank 0)."""
        self.reload_states()
        dstate.reset(self._ds, self.engine, weights, self._schedule0)

    def save(self, path: Path | None, weights_dir: Path | None) -> None:
        """The full weights gathered from every rank as an HF folder in `weights_dir`
        (`save_weights`) and the rank-count-independent optimizer files
        (`deepspeed_state`) under `path`; rank 0 writes, the others pass None."""
        self.reload_states()
        state = self.full_state_dict()
        if path is not None:
            save_weights(self.engine.module, weights_dir, state_dict=state)
        dstate.save_state(self._ds, self.engine, path)

    def load(self, path: Path, weights_dir: Path) -> None:
        """Restore from `save` by any number of ranks (every rank reads `path`; a shared
        filesystem across nodes); older same-rank-count DeepSpeed checkpoints also load."""
        self.reload_states()
        if not (path / "optimizer.json").is_file() and (path / "deepspeed").is_dir():
            load_path, _ = self.engine.load_checkpoint(
                str(path / "deepspeed"), tag=_TAG, load_optimizer_states=True,
                load_lr_scheduler_states=True)
            if load_path is None:
                raise FileNotFoundError(f"{path / 'deepspeed'}: no DeepSpeed checkpoint")
            return
        from safetensors.torch import load_file

        dstate.load_state(self._ds, self.engine, path,
                          load_file(str(weights_dir / "model.safetensors")))
