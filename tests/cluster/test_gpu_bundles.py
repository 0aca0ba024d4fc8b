"""GPU bundles as placed on the autoscaling cluster: `cluster.placement=pack_scorers_with_learner`
(one STRICT_PACK placement group) with `learner.num_ranks=2` (DeepSpeed ZeRO-3 over gloo) puts
both learner ranks and the scorer on one gpu_worker node, each in a bundle with a GPU of its
own; the GPUs are fake (the roles compute on CPU), the placement and the autoscaler's launch
for a placement group's demand are real."""

import json

import pytest

from compassplay.config import load_config
from compassplay.executors.local import LocalExecutor
from compassplay.executors.ray.pipeline_runner import run_pipeline

pytest.importorskip("deepspeed")
pytestmark = [pytest.mark.slow, pytest.mark.ray]

SHAPE = ["proposer.batch_size=2", "solver.n_samples=4", "solver.seed_tasks_per_step=1",
         "logging.progress=false", "pipeline.steps=2"]
PACKED = ["cluster.placement=pack_scorers_with_learner", "learner.backend=deepspeed",
          "learner.zero_stage=3", "learner.num_ranks=2",
          # 2 ranks + 1 scorer share the node's one trainer_node
          "cluster.learner={num_cpus: 0.25, num_gpus: 1, resources: {trainer_node: 0.25}}",
          "cluster.scorer={num_cpus: 0.25, num_gpus: 1, resources: {trainer_node: 0.25}}"]


def test_scorers_packed_with_a_two_rank_learner_on_gpu_bundles_of_one_node(fake_cluster,
                                                                          tmp_path):
    pipe = run_pipeline(load_config("cluster_local", SHAPE + PACKED), tmp_path / "ray")
    placed = json.loads((tmp_path / "ray/placement.json").read_text())
    packed = {r: loc for r, loc in placed.items() if r.startswith(("learner", "scorer"))}
    assert set(packed) == {"learner-0", "learner-1", "scorer-0"}, sorted(placed)
    assert len({loc["node_id"] for loc in packed.values()}) == 1  # STRICT_PACK: one node
    assert {loc["node_type"] for loc in packed.values()} == {"gpu_worker"}
    for loc in packed.values():
        assert loc["resources"]["GPU"] == 1 and loc["resources"]["trainer_node"] == 0.25
    gpus = [loc["cuda_visible_devices"] for loc in packed.values()]
    assert len(set(gpus)) == 3 and all(gpus), gpus  # a GPU of its own each
    # the same steps with one torch learner in process: same rollouts, same update
    LocalExecutor(load_config("cluster_local", SHAPE), tmp_path / "local").run()
    want = [json.loads(x) for x in (tmp_path / "local/metrics.jsonl").read_text().splitlines()]
    got = pipe.recorded
    assert [s.step for s in got] == [0, 1]
    for s, w in zip(got, [r for r in want if r.get("kind", "step") == "step"], strict=True):
        assert s.loss == pytest.approx(w["loss"], rel=1e-4, abs=1e-6)
        assert s.grad_norm == pytest.approx(w["grad_norm"], rel=1e-4)
