"""Every role's model lives on the device its actor was given, in the configured dtype."""

import pytest
import torch

from compassplay.config import load_config
from compassplay.workers import builders
from compassplay.workers.generator_workers import SolverWorker
from compassplay.workers.scorer_worker import ScorerWorker


def test_role_device_is_cpu_without_gpus_or_without_cuda(monkeypatch):
    cfg = load_config(None, ["cluster.scorer.num_gpus=1"])
    assert builders.role_device(cfg, "learner") == torch.device("cpu")  # num_gpus 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert builders.role_device(cfg, "scorer") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert builders.role_device(cfg, "scorer") == torch.device("cuda")
    assert builders.role_device(cfg, "solver") == torch.device("cpu")


def test_scorer_honours_its_dtype_and_generators_their_device():
    cfg = load_config(None, ["scorer.dtype=bfloat16"])
    scorer = ScorerWorker(cfg)
    params = list(scorer.scorer.params.values())
    assert {p.dtype for p in params} == {torch.bfloat16}
    assert scorer.scorer.device == builders.role_device(cfg, "scorer")
    solver = SolverWorker(load_config(None, []))
    assert solver.engine.device == torch.device("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_roles_put_their_models_on_cuda():
    cfg = load_config(None, ["cluster.scorer.num_gpus=1", "cluster.solver.num_gpus=1",
                             "scorer.dtype=bfloat16"])
    assert ScorerWorker(cfg).scorer.device.type == "cuda"
    assert SolverWorker(cfg).engine.device.type == "cuda"
