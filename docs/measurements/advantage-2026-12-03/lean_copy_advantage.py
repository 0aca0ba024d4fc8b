"""Mean advantage of a Lean copy (cos x novelty, novelty 0) under normalize=all and gated_rank.

Batches of 16 proposals of the paper Lean config's classes (15% unparsed, 15% ill-posed, 30%
ineligible, 20% copies, 20% eligible with cos x novelty in [-0.05, 0.15] x U(0, 1)), seeded;
the learner's arithmetic (rewards/shaping.py, engines/training/advantages.py). Prints JSON.
    python docs/measurements/advantage-2026-12-03/lean_copy_advantage.py
"""
import json
import random
import statistics

from compassplay.config import load_config
from compassplay.engines.training.advantages import trajectory_advantages
from compassplay.records import Generation, Score, Trajectory
from compassplay.rewards.shaping import ScoreWindow, gate_levels, shape

GEN = Generation(prompt_ids=[1], completion_ids=[2], logprobs=[-1.0], text="x")
CLASSES = [(0.15, "unparsed", -1.0), (0.30, "invalid", -1.0), (0.60, "ineligible", -0.5),
           (0.80, "copy", 0.0), (1.01, "eligible", None)]


def batch(rng, n=16):
    out = []
    for i in range(n):
        u = rng.random()
        _, gate, r = next(c for c in CLASSES if u < c[0])
        r = rng.uniform(-0.05, 0.15) * rng.random() if r is None else r
        out.append(Score(task_id=f"t{i}", reward=r, kind="cos_novelty",
                         eligible=gate in ("copy", "eligible"), solve_rate=0.5, gate=gate))
    return out


def advantages(scores, cfg, window):
    shaped = None
    if cfg.normalize == "gated_rank":
        lv = gate_levels(cfg.format_penalty, cfg.invalid_penalty, cfg.ineligible_reward,
                         cfg.copy_reward)
        shaped = shape(scores, lv, window, cfg.rank_weight)
    trajs = [Trajectory(generation=GEN, reward=s.reward, role="proposer", task_type="lean_prove",
                        task_id=s.task_id, gate=shaped[s.task_id].gate if shaped else None,
                        direction=shaped[s.task_id].direction if shaped else 0.0)
             for s in scores]
    return trajectory_advantages(trajs)


cfg = load_config("paper_lean_7b").reward
out = {}
for norm in ("all", "gated_rank"):
    c = cfg.model_copy(update={"normalize": norm})
    rng, window, copy_adv, elig_adv = random.Random(1), ScoreWindow(c.rank_window), [], []
    for _ in range(500):
        sc = batch(rng)
        adv = advantages(sc, c, window)
        copy_adv += [a for s, a in zip(sc, adv, strict=True) if s.gate == "copy"]
        elig_adv += [a for s, a in zip(sc, adv, strict=True) if s.gate == "eligible"]
    out[norm] = {"copies": len(copy_adv), "copy_advantage_mean": statistics.mean(copy_adv),
                 "copy_advantage_positive_fraction": sum(a > 0 for a in copy_adv) / len(copy_adv),
                 "eligible_advantage_mean": statistics.mean(elig_adv)}
print(json.dumps(out, indent=1))
