"""The analysis of `compassplay experiment utility`'s rows (`commands.utility_measure`): for every
realized utility (step x endpoint) and score, Spearman's rho pooled, within strata (task type
x pool), and partial (given target length and gradient norm, within strata), Holm over the
scores tested; each step's first-order check; the preconditioned cosine against the plain one.
"""

from __future__ import annotations

import numpy as np

from compassplay.commands.utility_measure import MEASURED, PREDICTED, STEPS
from compassplay.eval.rank_stats import detectable_rho, line_fit, rank_correlation
from compassplay.eval.utility_stats import (
    detectable_rho_eff,
    holm,
    partial_rho,
    rho_difference,
    within_rho,
)

SCORES = ("cos", "inner", "precond_cos", "difficulty", "novelty", "cos_novelty", "random",
          "heldout_cos")
"""Every score tested; heldout_cos (the endpoint's own gradient) is the positive control."""
TESTED = ("cos", "inner", "precond_cos", "difficulty", "novelty", "cos_novelty")
"""The scores Holm's correction runs over (random and the positive control are not claims)."""


def stratum(r: dict) -> str:
    return f"{r.get('pool', '')}/{r['task_type']}"


def analyse(rows: list[dict], boot: int = 1000, perms: int = 2000) -> dict:
    """The summary dict (JSON-able); `rows` from one or several pools."""
    pools: dict[str, int] = {}
    types: dict[str, int] = {}
    for r in rows:
        pools[r.get("pool", "")] = pools.get(r.get("pool", ""), 0) + 1
        types[stratum(r)] = types.get(stratum(r), 0) + 1
    out: dict = {"n": len(rows), "pools": pools, "strata": types,
                 "detectable_rho": detectable_rho(len(rows)), "utilities": {},
                 "first_order": {}, "precond_vs_plain": {}}
    strata = [stratum(r) for r in rows]
    covs = [[r["target_tokens"] for r in rows], [r["grad_norm"] for r in rows]]
    keys = [f"{kind}_{step}_{end}" for kind in ("drop", "pred") for step in STEPS
            for end in MEASURED]
    for key in keys:
        have = [i for i, r in enumerate(rows) if r.get(key) is not None]
        if len(have) < 4:
            continue
        sub = [rows[i] for i in have]
        y = [r[key] for r in sub]
        st = [strata[i] for i in have]
        cv = [[c[i] for i in have] for c in covs]
        per_score = {}
        for s in SCORES:
            x = [r[f"score_{s}"] for r in sub]
            w = within_rho(x, y, st, boot=boot, perms=perms)
            per_score[s] = {"pooled": rank_correlation(x, y, boot, perms).as_dict(),
                            "within": w.as_dict(),
                            "partial": partial_rho(x, y, cv, st, boot=boot,
                                                   perms=perms).as_dict()}
        for kind in ("within", "partial"):
            adj = holm({s: per_score[s][kind]["p"] for s in TESTED})
            for s in TESTED:
                per_score[s][kind]["p_holm"] = adj[s]
        n_eff = per_score["cos"]["within"]["n_eff"]
        out["utilities"][key] = {"n": len(sub), "mean": float(np.mean(y)),
                                 "detectable_within": detectable_rho_eff(n_eff),
                                 "scores": per_score}
        out["precond_vs_plain"][key] = rho_difference(
            [r["score_precond_cos"] for r in sub], [r["score_cos"] for r in sub], y, st,
            boot=boot).as_dict()
    for step in STEPS:
        for end in MEASURED:
            real = [r.get(f"drop_{step}_{end}") for r in rows]
            pred = [r.get(f"pred_{step}_{end}") for r in rows]
            pairs = [(p, q) for p, q in zip(pred, real, strict=True) if q is not None]
            if len(pairs) >= 4:
                p, q = zip(*pairs, strict=True)
                out["first_order"][f"{step}_{end}"] = line_fit(p, q)
    momentum = [r["momentum_drop"] for r in rows if r.get("momentum_drop")]
    if momentum:
        out["momentum_drop"] = momentum[0]
    out["predicted_only"] = list(PREDICTED)
    return out
