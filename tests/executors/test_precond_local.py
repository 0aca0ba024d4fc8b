"""reward.kind=precond_cosine end to end on the local executor (micro_warm: real tiny model,
real sandbox): after the first update the scorer scores in the metric of the learner's AdamW
state at the weights it holds, delivered with those weights."""

from pathlib import Path

import pytest
import torch

from compassplay.config import load_config
from compassplay.executors.local import LocalExecutor
from compassplay.rewards.gradient import GradientScorer
from compassplay.rewards.preconditioner import adamw_metric
from compassplay.workers.learner_worker import metric_names

ROOT = Path(__file__).resolve().parents[2]
WARM = ROOT / "compassplay" / "configs" / "micro_warm.yaml"


@pytest.mark.slow
def test_precond_cosine_run_scores_in_the_learners_metric(tmp_path):
    cfg = load_config(WARM, ["reward.kind=precond_cosine", "pipeline.steps=2",
                             "learner.checkpoint_every=1", "learner.keep_last=3",
                             "logging.progress=false", "proposer.batch_size=2",
                             "solver.seed_tasks_per_step=1"])
    ex = LocalExecutor(cfg, tmp_path / "r")
    stats = ex.run()
    assert [s.weight_version for s in stats] == [1, 2]
    worker = ex.scorers[0]
    sc = worker.scorer
    # step 1 was scored at the weights after the first update, with their metric
    assert sc.weight_version == 1 and sc.metric is not None and sc.metric_version == 1
    names = metric_names(cfg, ex.learner.model)
    assert set(sc.metric) == set(sc.params) == set(names)
    # the metric is adamw_metric of the optimizer state the learner checkpointed at version 1
    opt = torch.load(tmp_path / "r" / "checkpoints" / "step_000000" / "learner" / "optimizer.pt",
                     weights_only=True)
    trainable = [n for n, p in ex.learner.model.named_parameters() if p.requires_grad]
    (group,) = opt["param_groups"]
    by_name = {trainable[i]: opt["state"][i] for i in group["params"]}
    away = 0
    for n in names:
        st = by_name[n]
        want = adamw_metric(st["exp_avg_sq"], int(st["step"]), group["betas"][1], group["eps"])
        assert int(st["step"]) == 1
        torch.testing.assert_close(sc.metric[n].cpu(), want, rtol=1e-6, atol=0)
        away += int((want != 1).sum())
    assert away > 0  # a non-identity metric
    # its cosines differ from the plain cosine at the same weights
    ref, cands = worker.reference, worker.reference[:3]
    sc.set_reference(ref)  # (the metric of version 1 is still the current one)
    assert sc.reference.metric
    got = [s.cosine for s in sc.score(cands)]
    plain = GradientScorer(sc.model, "all", pad_id=sc.pad_id)
    plain.set_reference(ref)
    want = [s.cosine for s in plain.score(cands)]
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) > 1e-3
