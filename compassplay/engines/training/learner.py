"""The learner interface and the backend-independent policy-gradient step.

One `step(trajectories)` = task-relative REINFORCE++ advantages (`advantages.py`), teacher-
forced log-probs at temperature 1 (`logprobs.py`), the clipped PPO token-mean loss
(`policy_loss.py`) accumulated over micro-batches of `micro_batch` trajectories, then one
optimizer step per model (gradient clipping + LR schedule) per mini-batch of
`mini_batch_size` trajectories (`mini_batches`: AZR takes several per batch; 0 = one), and
`weight_version += 1` per batch. Advantages come from the whole batch; each mini-batch's loss
is its own token mean.

Models: with a shared model ("policy") both roles update it; with separate models the
proposer trajectories update "proposer" and the solver trajectories update "solver", each with
its own optimizer and schedule. Backends (`torch_learner`, `deepspeed_learner`) provide the
per-model `Slot`: backward, clipped optimizer step, full weights, save/load.

Learner group (data parallel, deepspeed backend): every rank gets the same trajectories and
runs `step` on them together. The micro-batches are the ones one rank would make; rank r
takes micro-batches r, r+N, ... and all ranks make as many passes (a rank short of
micro-batches repeats one with weight 0: under ZeRO-3 every forward is collective). Each loss
is normalized by the step's global token count and multiplied by N, so DeepSpeed's average
of the ranks' gradients is the full batch's gradient: N ranks give the 1-rank update up to
float summation order. Stats are summed over the ranks; every rank returns the same stats.
Weights and checkpoints are collective: rank 0 returns/writes them, the other ranks take
part in the gathers and return {} / write nothing.
"""

from __future__ import annotations

import json
import logging
import math
import random
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from compassplay.engines.dtype_choice import resolve_autocast
from compassplay.engines.frozen_states import FrozenStates, states_key
from compassplay.engines.training.advantages import broadcast_to_tokens, trajectory_advantages
from compassplay.engines.training.dist import sum_over_ranks
from compassplay.engines.training.frozen_start import FrozenStart
from compassplay.engines.training.logprobs import (
    pack,
    token_logprobs,
    token_logprobs_entropy,
    unwrapped,
)
from compassplay.engines.training.model_dirs import model_dirs
from compassplay.engines.training.policy_loss import ppo_loss
from compassplay.engines.training.shared_prefix import prefix_chunks
from compassplay.engines.training.slot import NoOptimizerMetric, Slot
from compassplay.records import Role, Trajectory

log = logging.getLogger(__name__)


@dataclass
class LearnerStats:
    """One learner step. loss: token-mean over all trained tokens; grad_norm: pre-clip L2 norm
    over all updated models; clip_frac/kl: per-token means (kl is k3, 0 without a reference);
    lr: the learning rate this update used (the first model's); entropy: the policy's mean
    token entropy (nats, temperature 1, before the update) over the completion tokens of the
    trajectories the learner forwarded (zero-advantage trajectories are skipped when there is
    no KL term); response_length_mean: mean completion length (tokens) over all trajectories."""

    loss: float
    grad_norm: float
    lr: float
    clip_frac: float
    kl: float
    n_tokens: int
    weight_version: int
    by_model: dict[str, dict[str, float]] = field(default_factory=dict)
    entropy: float = 0.0
    response_length_mean: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


class Learner(ABC):
    """What the pipeline calls."""

    @abstractmethod
    def step(self, trajectories: list[Trajectory], states: FrozenStates | None = None
             ) -> LearnerStats:
        """One update. states: the generators' hidden states of the sequences
        (`engines.frozen_states`), which a learner may start its forward from."""

    @abstractmethod
    def state_dict_for_sync(self, role: Role = "solver") -> dict[str, torch.Tensor]:
        """Full weights (HF names, CPU) of the model that plays `role`."""

    def weights_view(self, role: Role = "solver") -> dict[str, torch.Tensor]:
        """`state_dict_for_sync(role)`, or the live weights where no copy is needed
        (`Slot.weights_view`): read them before the next `step`."""
        return self.state_dict_for_sync(role)

    @property
    @abstractmethod
    def weight_version(self) -> int: ...

    def preconditioner(self, names: list[str], role: Role = "solver") -> dict[str, torch.Tensor]:
        """The AdamW metric {name: M} (CPU float32) of the model that plays `role`, for the
        parameter `names` (`Slot.preconditioner`)."""
        raise NoOptimizerMetric(f"{type(self).__name__} has no optimizer metric "
                                "(reward.kind=precond_cosine needs learner.backend=torch)")

    @abstractmethod
    def save(self, path: str | Path, model_dir: str | Path | None = None) -> None: ...

    @abstractmethod
    def load(self, path: str | Path, model_dir: str | Path | None = None) -> None: ...


class PolicyLearner(Learner):
    """Backend-independent step over `slots` ("policy", or "proposer" and "solver")."""

    def __init__(self, slots: dict[str, Slot], cfg, ref_model: torch.nn.Module | None = None,
                 backend: str = "torch") -> None:
        if cfg.kl_coef > 0 and ref_model is None:
            raise ValueError("learner.kl_coef > 0 needs a frozen reference model (ref_model)")
        self.slots, self.cfg, self.backend = slots, cfg, backend
        self.ref_model = ref_model.eval().requires_grad_(False) if ref_model is not None else None
        self._version = 0
        first = next(iter(slots.values()))
        self.rank, self.world_size = first.rank, first.world_size
        # learner.share_prefix on one rank only: ZeRO-3 ranks gather parameters per module
        # call, so a rank running a prefix pass where another does not would desynchronize them
        self.share_prefix = bool(getattr(cfg, "share_prefix", False)) and self.world_size == 1
        # the forward's autocast dtype (learner.autocast; None: the weights' own dtype)
        self.autocast = resolve_autocast(getattr(cfg, "autocast", "none"),
                                         unwrapped(first.module))
        if self.autocast is not None:
            log.info("learner: forward passes under torch.autocast(%s) (learner.autocast=%s); "
                     "the vocabulary head and log-softmax stay float32",
                     str(self.autocast).removeprefix("torch."), cfg.autocast)
        # learner.frozen_states: forwards from the generators' states (one rank, the torch
        # backend; checked once in the forward's own numerics)
        use = getattr(cfg, "frozen_states", "recompute") == "auto" and backend == "torch" \
            and self.world_size == 1
        self.frozen = {name: FrozenStart(unwrapped(slot.module), self.autocast) if use else None
                       for name, slot in slots.items()}

    @property
    def weight_version(self) -> int:
        return self._version

    def slot_for(self, role: Role) -> str:
        return "policy" if "policy" in self.slots else role

    def state_dict_for_sync(self, role: Role = "solver") -> dict[str, torch.Tensor]:
        return self.slots[self.slot_for(role)].full_state_dict()

    def weights_view(self, role: Role = "solver") -> dict[str, torch.Tensor]:
        return self.slots[self.slot_for(role)].weights_view()

    def preconditioner(self, names: list[str], role: Role = "solver") -> dict[str, torch.Tensor]:
        return self.slots[self.slot_for(role)].preconditioner(names)

    def step(self, trajectories: list[Trajectory], states: FrozenStates | None = None
             ) -> LearnerStats:
        """One update on `trajectories`. None (a step where solver.train_on=selected chose no
        proof and there were no proposals): the weights stay, and their version still advances
        so that every step has one. states: see `Learner.step` (`FrozenStart` takes a
        micro-batch's from them when every row has its own)."""
        if not trajectories:
            self._version += 1
            first = next(iter(self.slots.values()))
            return LearnerStats(loss=0.0, grad_norm=0.0, lr=first.lr(), clip_frac=0.0, kl=0.0,
                                n_tokens=0, weight_version=self._version)
        adv = trajectory_advantages(trajectories)
        stats: dict[str, dict[str, float]] = {}
        norms: list[float] = []
        for batch in mini_batches(len(trajectories), self.cfg.mini_batch_size, self._version):
            by_slot: dict[str, list[int]] = {}
            for i in batch:
                by_slot.setdefault(self.slot_for(trajectories[i].role), []).append(i)
            sq = 0.0
            for name in sorted(by_slot):
                got = self._train_slot(name, by_slot[name], trajectories, adv, states or {})
                sq += got["grad_norm"] ** 2
                stats[name] = _add_stats(stats.get(name), got)
            norms.append(math.sqrt(sq))
        self._version += 1
        n_tok = sum(s["n_tokens"] for s in stats.values())
        per_tok = max(n_tok, 1.0)
        return LearnerStats(
            loss=sum(s["loss"] * s["n_tokens"] for s in stats.values()) / per_tok,
            grad_norm=sum(norms) / len(norms),
            lr=stats[sorted(stats)[0]]["lr"],
            clip_frac=sum(s["clipped"] for s in stats.values()) / per_tok,
            kl=sum(s["kl_sum"] for s in stats.values()) / per_tok,
            n_tokens=int(n_tok), weight_version=self._version, by_model=stats,
            entropy=sum(s["entropy_sum"] for s in stats.values())
            / max(sum(s["entropy_tokens"] for s in stats.values()), 1.0),
            response_length_mean=n_tok / len(trajectories))

    def _train_slot(self, name: str, idx: list[int], trajs: list[Trajectory],
                    adv: list[float], states: FrozenStates) -> dict[str, float]:
        slot, frozen = self.slots[name], self.frozen[name]
        total = float(sum(len(trajs[i].generation.completion_ids) for i in idx))
        dev = next(slot.module.parameters()).device
        slot.module.train()
        if self.ref_model is None or not self.cfg.kl_coef:
            # A zero advantage gives a zero policy-gradient term: leave those trajectories out
            # of the passes (same update; the normalizer still counts their tokens). One is kept
            # if all are zero so the optimizer steps on zero gradients exactly as before.
            idx = [i for i in idx if adv[i] != 0.0] or idx[:1]
        loss_sum = clipped = kl_sum = ent_sum = ent_tok = 0.0
        # rows with a common prompt prefix in one micro-batch; planned the same way whether
        # or not this learner shares prefixes, so one rank and several see the same batches
        gens = [trajs[i].generation for i in idx]
        chunks = [[idx[k] for k in chunk] for chunk in prefix_chunks(
            [g.prompt_ids for g in gens],
            [len(g.prompt_ids) + len(g.completion_ids) for g in gens], self.cfg.micro_batch)]
        mine = [(chunk, 1.0) for chunk in chunks[self.rank::self.world_size]]
        passes = -(-len(chunks) // self.world_size)
        mine += [(chunks[0], 0.0)] * (passes - len(mine))  # weight 0: collective passes only
        for c, (chunk, weight) in enumerate(mine):
            gens = [trajs[i].generation for i in chunk]
            b = pack(gens, device=dev)
            a = broadcast_to_tokens(torch.tensor([adv[i] for i in chunk]), b["mask"])
            slot.begin_pass()
            start = None if frozen is None else frozen.states_for(
                [states.get(states_key(g.prompt_ids, g.completion_ids)) for g in gens], b)
            logp, ent = token_logprobs_entropy(slot.module, b["input_ids"], b["attention_mask"],
                                               b["targets"], b["mask"], autocast=self.autocast,
                                               share_prefix=self.share_prefix, states=start,
                                               from_layer=frozen.k if frozen else 0)
            ref = None
            if self.ref_model is not None:
                with torch.no_grad():
                    ref = token_logprobs(self.ref_model, b["input_ids"].to(self._ref_dev()),
                                         b["attention_mask"].to(self._ref_dev()),
                                         b["targets"].to(self._ref_dev()),
                                         b["mask"].to(self._ref_dev()),
                                         autocast=self.autocast).to(dev)
            terms = ppo_loss(logp, b["old_logp"], a, b["mask"], self.cfg.clip_eps, ref,
                             self.cfg.kl_coef, normalizer=max(total, 1.0))
            slot.backward(terms.loss * (weight * self.world_size), last=c == len(mine) - 1)
            loss_sum += weight * float(terms.loss.detach().item())
            clipped += weight * terms.clipped_tokens
            kl_sum += weight * terms.kl_sum
            ent_sum += weight * float((ent * b["mask"]).sum().item())
            ent_tok += weight * terms.n_tokens
        if self.world_size > 1:
            loss_sum, clipped, kl_sum, ent_sum, ent_tok = sum_over_ranks(
                [loss_sum, clipped, kl_sum, ent_sum, ent_tok], dev)
        lr = slot.lr()  # the LR this update uses
        grad_norm = slot.step()
        return {"loss": loss_sum, "grad_norm": grad_norm, "lr": lr, "clipped": clipped,
                "kl_sum": kl_sum, "n_tokens": total, "entropy_sum": ent_sum,
                "entropy_tokens": ent_tok}

    def _ref_dev(self) -> torch.device:
        return next(self.ref_model.parameters()).device

    def reset(self, weights: dict[str, torch.Tensor]) -> None:
        """Every model back to `weights` (the initial policy), fresh optimizers, version 0."""
        for slot in self.slots.values():
            slot.reset(weights)
        self._version = 0

    def save(self, path: str | Path | None, model_dir: str | Path | None = None) -> None:
        """Optimizer and scheduler per model (the proposer's under proposer/ when separate)
        and learner.json (version, backend) under `path`; each model's full weights as an HF
        folder (model.safetensors + config.json + generation_config.json, `model_dirs`):
        under `model_dir` (the proposer's in its sibling `proposer_model/`), or with the
        optimizer files when `model_dir` is None. Collective in a learner group: only rank 0
        writes (the others ignore `path`)."""
        if self.rank != 0:
            for slot in self.slots.values():
                slot.save(None, None)
            return
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        weights = model_dirs(path, model_dir)
        for name, slot in self.slots.items():
            state = path / "proposer" if name == "proposer" else path
            for d in (state, weights[name]):
                d.mkdir(parents=True, exist_ok=True)
            slot.save(state, weights[name])
        meta = {"weight_version": self._version, "backend": self.backend,
                "models": sorted(self.slots)}
        (path / "learner.json").write_text(json.dumps(meta, indent=1))

    def load(self, path: str | Path, model_dir: str | Path | None = None) -> None:
        """Inverse of `save(path, model_dir)` (the same `model_dir`)."""
        path = Path(path)
        meta = json.loads((path / "learner.json").read_text())
        if meta["models"] != sorted(self.slots):
            raise ValueError(f"checkpoint has models {meta['models']}, learner has "
                             f"{sorted(self.slots)} (learner.shared_model differs?)")
        weights = model_dirs(path, model_dir)
        for name, slot in self.slots.items():
            slot.load(path / "proposer" if name == "proposer" else path, weights[name])
        self._version = int(meta["weight_version"])


def mini_batches(n: int, size: int, seed: int) -> list[list[int]]:
    """Indices 0..n-1 in optimizer-step mini-batches of `size` (0 = one batch, in order): a
    permutation seeded by `seed` (the weight version: every rank draws the same), cut into
    near-equal contiguous parts of at most `size` each."""
    if not size or n <= size:
        return [list(range(n))]
    order = list(range(n))
    random.Random(seed).shuffle(order)
    parts = -(-n // size)
    return [order[(n * k) // parts:(n * (k + 1)) // parts] for k in range(parts)]


def _add_stats(acc: dict[str, float] | None, new: dict[str, float]) -> dict[str, float]:
    """One model's stats summed over its mini-batches (loss token-weighted, the LR of the
    first, the grad norm of the last: `step` reports the mean over optimizer steps)."""
    if acc is None:
        return dict(new)
    tok = acc["n_tokens"] + new["n_tokens"]
    out = {k: acc[k] + new[k] for k in ("clipped", "kl_sum", "entropy_sum",
                                        "entropy_tokens", "n_tokens")}
    out["loss"] = (acc["loss"] * acc["n_tokens"] + new["loss"] * new["n_tokens"]) / max(tok, 1.0)
    out["lr"], out["grad_norm"] = acc["lr"], new["grad_norm"]
    return out
