"""Plain-torch learner backend: AdamW (weight decay 0) + LambdaLR + clip_grad_norm_."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from compassplay.engines.training.slot import Slot, lr_lambda
from compassplay.rewards.preconditioner import adamw_metric


def make_adamw(params, lr: float) -> torch.optim.AdamW:
    """The optimizer both backends use, so that they give the same update."""
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)


def save_weights(model: torch.nn.Module, path: Path,
                 state_dict: dict[str, torch.Tensor] | None = None) -> None:
    """model.safetensors + config.json + generation_config.json (the model's, else one made
    from its config), loadable by `from_pretrained(path)` and vLLM."""
    model.save_pretrained(str(path), state_dict=state_dict)
    if not (path / "generation_config.json").is_file():
        from transformers import GenerationConfig

        GenerationConfig.from_model_config(model.config).save_pretrained(str(path))


def load_weights_file(model: torch.nn.Module, path: Path) -> None:
    """Load `path/model.safetensors` into `model` (tied output embeddings may be absent)."""
    state = load_file(str(path / "model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("lm_head.weight")]
    if missing or unexpected:
        raise KeyError(f"{path}: weights do not match the model: missing={missing[:5]} "
                       f"unexpected={unexpected[:5]}")


class TorchSlot(Slot):
    """One model trained with plain torch; gradients accumulate across micro-batches."""

    def __init__(self, model: torch.nn.Module, cfg, total_steps: int | None = None) -> None:
        self.module, self.cfg, self.total_steps = model, cfg, total_steps
        self.max_grad_norm = cfg.max_grad_norm
        self._fresh_optimizer()

    def _fresh_optimizer(self) -> None:
        cfg = self.cfg
        self.optimizer = make_adamw([p for p in self.module.parameters() if p.requires_grad],
                                    cfg.lr)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(cfg.schedule, cfg.warmup_steps, self.total_steps))

    def reset(self, weights: dict[str, torch.Tensor]) -> None:
        self.module.load_state_dict(weights)
        self._fresh_optimizer()

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        loss.backward()

    def step(self) -> float:
        params = [p for p in self.module.parameters() if p.requires_grad]
        norm = torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def preconditioner(self, names: list[str]) -> dict[str, torch.Tensor]:
        """`adamw_metric` of each named parameter's AdamW state (its group's beta2 and eps;
        ones before its first step), CPU float32. A name that is not a trainable parameter
        of the model is a ValueError."""
        params = dict(self.module.named_parameters())
        group_of = {id(p): g for g in self.optimizer.param_groups for p in g["params"]}
        out = {}
        for n in names:
            p = params.get(n)
            if p is None or id(p) not in group_of:
                raise ValueError(f"{n!r} is not a parameter this learner trains")
            st, group = self.optimizer.state.get(p, {}), group_of[id(p)]
            if "exp_avg_sq" not in st:
                out[n] = torch.ones(p.shape, dtype=torch.float32)
                continue
            out[n] = adamw_metric(st["exp_avg_sq"], int(st["step"]), float(group["betas"][1]),
                                  float(group["eps"])).cpu()
        return out

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().to("cpu", copy=True) for k, v in self.module.state_dict().items()}

    def weights_view(self) -> dict[str, torch.Tensor]:
        return {k: v.detach() for k, v in self.module.state_dict().items()}

    def save(self, path: Path, weights_dir: Path) -> None:
        save_weights(self.module, weights_dir)
        torch.save(self.optimizer.state_dict(), path / "optimizer.pt")
        torch.save(self.scheduler.state_dict(), path / "scheduler.pt")

    def load(self, path: Path, weights_dir: Path) -> None:
        load_weights_file(self.module, weights_dir)
        self.optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
        self.scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
