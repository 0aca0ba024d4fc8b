"""How much of the proposer's advantage variance the cosine decides, under `reward.normalize`
(all, eligible, gated_rank).

`python -m compassplay.eval.advantage_share SAMPLES.jsonl [...] [--per-type 64]` reads recorded
proposals (a run's samples.jsonl rows: task_type, valid, invalid_reason, solve_rate, cosine;
a row is an eligible candidate when its cosine is set), recomputes their cosine-arm rewards
under the given penalties, and prints JSON: per normalisation the cosine's share of the
advantage variance over the recorded batches (one per file and step, a group per task type as
the learner forms them) and over batches of `--per-type` proposals per task type drawn with
replacement from the recorded ones (seeded).

share = sum over eligible candidates of (A_i - mean of A over them)^2 / sum over all proposals
of (A_i - mean A)^2, pooled over groups: the part of the advantages that differs between
eligible candidates, which only the cosine decides; the rest contrasts the classes (parse
failure, ill-posed, ineligible, eligible). Under gated_rank (advantage = gate z-score + rank term)
the share is sum of rank term^2 / (sum of gate z^2 + sum of rank term^2), so an eligible
candidate alone in its group, whose rank term the first form would miss, counts too. The learner logs the same figure per
step (`StepStats.score_advantage_share`).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from compassplay.config import RewardSection
from compassplay.engines.training.advantages import gated_score_share, group_normalized, score_share
from compassplay.records import Score
from compassplay.rewards.functions import proposer_reward
from compassplay.rewards.shaping import ScoreWindow, gate_levels, gate_of, shape

NORMALIZATIONS = ("all", "eligible", "gated_rank")


@dataclass(frozen=True)
class Proposal:
    """One recorded proposal: `batch` (file and step), its task type, and what sets its reward
    (`cosine` None: not an eligible candidate)."""

    batch: str
    task_type: str
    valid: bool
    parse_fail: bool
    solve_rate: float
    cosine: float | None


def load_rows(paths: Sequence[str | Path]) -> list[Proposal]:
    """The proposals of samples.jsonl files, batched by (file, step)."""
    out = []
    for path in paths:
        for line in Path(path).read_text().splitlines():
            if not line.strip():
                continue
            r = json.loads(line)
            out.append(Proposal(f"{path}:{r['step']}", r["task_type"], bool(r["valid"]),
                                str(r.get("invalid_reason") or "").startswith("parse:"),
                                float(r.get("solve_rate") or 0.0), r.get("cosine")))
    return out


def reward_of(p: Proposal, cfg: RewardSection) -> float:
    """The cosine arm's reward of `p` under `cfg`'s penalties and ineligible reward."""
    return proposer_reward("cosine", solve_rate=p.solve_rate, well_formed=p.valid,
                           eligible=p.cosine is not None, cosine=p.cosine,
                           ineligible_reward=cfg.ineligible_reward,
                           penalty=cfg.format_penalty if p.parse_fail else cfg.invalid_penalty)


def cosine_share(rewards: Sequence[float], eligible: Sequence[bool], groups: Sequence[str],
                 normalize: str) -> tuple[float, float]:
    """(sum of squares of the advantages among eligible candidates around their group's
    eligible mean, total sum of squares around the group means), pooled over groups, for
    normalize all / eligible (`engines.training.advantages.score_share`)."""
    subs = ["eligible" if e and normalize == "eligible" else "" for e in eligible]
    return score_share(group_normalized(rewards, groups, subgroups=subs), eligible, groups)


def gated_share(rows: Sequence[Proposal], cfg: RewardSection, window: ScoreWindow
                ) -> tuple[float, float]:
    """The cosine's share of one batch under normalize=gated_rank (advantage: the gate's
    z-score per group plus the rank direction against `window`, which the batch's cosines then
    join): the rank term's sum of squares over the total (`gated_score_share`)."""
    scores = [Score(task_id=str(i), reward=reward_of(p, cfg), kind="cosine",
                    eligible=p.cosine is not None, solve_rate=p.solve_rate,
                    gate=gate_of(parse_fail=p.parse_fail, valid=p.valid,
                                 eligible=p.cosine is not None, kind="cosine", novelty=None))
              for i, p in enumerate(rows)]
    levels = gate_levels(cfg.format_penalty, cfg.invalid_penalty, cfg.ineligible_reward,
                         cfg.copy_reward)
    shaped = shape(scores, levels, window, cfg.rank_weight)
    groups = [p.task_type for p in rows]
    z = group_normalized([shaped[s.task_id].gate for s in scores], groups)
    dirs = [shaped[s.task_id].direction for s in scores]
    return gated_score_share(z, dirs)


def batch_shares(props: Sequence[Proposal], cfg: RewardSection) -> dict[str, float]:
    """Per normalisation, the cosine's share pooled over `props`' batches (in order; under
    gated_rank one window runs through them, as in a run)."""
    out = {}
    by_batch: dict[str, list[Proposal]] = defaultdict(list)
    for p in props:
        by_batch[p.batch].append(p)
    for norm in NORMALIZATIONS:
        if norm == "gated_rank" and not _orders_gates(cfg):
            continue
        within = total = 0.0
        window = ScoreWindow(cfg.rank_window)
        for rows in by_batch.values():
            if norm == "gated_rank":
                w, t = gated_share(rows, cfg, window)
            else:
                w, t = cosine_share([reward_of(p, cfg) for p in rows],
                                    [p.cosine is not None for p in rows],
                                    [p.task_type for p in rows], norm)
            within, total = within + w, total + t
        out[norm] = within / total if total else 0.0
    return out


def _orders_gates(cfg: RewardSection) -> bool:
    """Whether `cfg`'s penalties are valid gate levels (gated_rank's validator)."""
    try:
        RewardSection.model_validate({**cfg.model_dump(), "normalize": "gated_rank"})
    except ValueError:
        return False
    return True


def resampled(props: Sequence[Proposal], per_type: int, batches: int, seed: int = 0
              ) -> list[Proposal]:
    """`batches` batches of `per_type` proposals per task type, drawn with replacement from
    the recorded proposals of that type (random.Random(seed))."""
    rng = random.Random(seed)
    by_type: dict[str, list[Proposal]] = defaultdict(list)
    for p in props:
        by_type[p.task_type].append(p)
    out = []
    for b in range(batches):
        for tt in sorted(by_type):
            for p in rng.choices(by_type[tt], k=per_type):
                out.append(Proposal(f"resampled:{b}", tt, p.valid, p.parse_fail, p.solve_rate,
                                    p.cosine))
    return out


def measure(props: Sequence[Proposal], cfg: RewardSection, per_type: int = 64,
            batches: int = 200, seed: int = 0) -> dict:
    """The recorded and the resampled shares, with what they were computed from."""
    cos = [p.cosine for p in props if p.cosine is not None]
    mean = sum(cos) / len(cos) if cos else 0.0
    return {
        "proposals": len(props), "eligible": len(cos),
        "batches": len({p.batch for p in props}),
        "cosine_mean": mean,
        "cosine_sd": (sum((c - mean) ** 2 for c in cos) / len(cos)) ** 0.5 if cos else 0.0,
        "rewards": {"format_penalty": cfg.format_penalty, "invalid_penalty": cfg.invalid_penalty,
                    "ineligible_reward": cfg.ineligible_reward},
        "recorded": batch_shares(props, cfg),
        f"resampled_{per_type}_per_type": batch_shares(
            resampled(props, per_type, batches, seed), cfg),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("samples", nargs="+", help="samples.jsonl files of cosine-arm runs")
    p.add_argument("--per-type", type=int, default=64)
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    props = load_rows(a.samples)
    settings = {"defaults": RewardSection(),
                "before_2026_12_01": RewardSection(invalid_penalty=-0.5, ineligible_reward=0.0,
                                                   normalize="all")}
    out = {name: measure(props, cfg, a.per_type, a.batches, a.seed)
           for name, cfg in settings.items()}
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
