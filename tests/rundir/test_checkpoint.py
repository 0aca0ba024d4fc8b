from __future__ import annotations

import json
import random
import shutil

import numpy as np
import pytest
import torch

from compassplay.config import LearnerSection
from compassplay.engines import make_learner
from compassplay.rundir.checkpoint import (
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from tests.tiny_models import synthetic_trajectories as on_policy_batch
from tests.tiny_models import tiny_causal_lm

CFG = LearnerSection(lr=1e-2, micro_batch=3, schedule="cosine", warmup_steps=1,
                    mini_batch_size=0)


def _train(learner, model, steps: range) -> list[float]:
    return [learner.step(on_policy_batch(model, n=5, seed=s)).loss for s in steps]


def test_resume_reproduces_uninterrupted_run(tmp_path):
    ref_model = tiny_causal_lm(seed=1)
    ref = make_learner(CFG, ref_model, total_steps=4)
    ref_losses = _train(ref, ref_model, range(4))

    m1 = tiny_causal_lm(seed=1)
    first = make_learner(CFG, m1, total_steps=4)
    losses = _train(first, m1, range(2))
    ckpt = save_checkpoint(tmp_path, 2, first, {"step": 2, "log_lines": 2})

    m2 = tiny_causal_lm(seed=99)  # different init: everything must come from the checkpoint
    second = make_learner(CFG, m2, total_steps=4)
    assert load_checkpoint(ckpt, second) == {"step": 2, "log_lines": 2}
    assert second.weight_version == 2
    losses += _train(second, m2, range(2, 4))
    assert losses == ref_losses
    for a, b in zip(ref_model.state_dict().values(), m2.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert second.slots["policy"].lr() == ref.slots["policy"].lr()


def test_rng_round_trip(tmp_path):
    learner = make_learner(CFG, tiny_causal_lm(), total_steps=4)
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    ckpt = save_checkpoint(tmp_path, 0, learner, {})
    want = (random.random(), np.random.rand(), torch.rand(3))
    random.seed(7), np.random.seed(7), torch.manual_seed(7)
    load_checkpoint(ckpt, learner)
    got = (random.random(), np.random.rand(), torch.rand(3))
    assert got[:2] == want[:2] and torch.equal(got[2], want[2])


def test_crash_mid_write_leaves_no_valid_checkpoint(tmp_path):
    learner = make_learner(CFG, tiny_causal_lm(), total_steps=4)
    good = save_checkpoint(tmp_path, 1, learner, {"step": 1})

    class Crash(RuntimeError):
        pass

    def boom(path, model_dir=None):
        learner_save(path, model_dir)
        raise Crash

    learner_save, learner.save = learner.save, boom
    with pytest.raises(Crash):
        save_checkpoint(tmp_path, 2, learner, {"step": 2})
    learner.save = learner_save
    # a half-written final dir (e.g. copied by hand) without manifest is ignored too
    (tmp_path / "checkpoints" / "step_000003" / "learner").mkdir(parents=True)
    assert latest_checkpoint(tmp_path) == good
    assert list_checkpoints(tmp_path) == [good]
    verify_checkpoint(good)
    (good / "state.json").write_text(json.dumps({"step": 666}))
    with pytest.raises(ValueError, match="state.json"):
        verify_checkpoint(good)


def test_pruning_keeps_last(tmp_path):
    learner = make_learner(CFG, tiny_causal_lm(), total_steps=4)
    for step in range(1, 5):
        save_checkpoint(tmp_path, step, learner, {"step": step}, keep_last=2)
    names = [p.name for p in list_checkpoints(tmp_path)]
    assert names == ["step_000003", "step_000004"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == names
    assert latest_checkpoint(tmp_path).name == "step_000004"
    assert latest_checkpoint(tmp_path / "nothing") is None


def test_weights_load_with_transformers(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from compassplay.models.byte_tokenizer import build_byte_tokenizer

    model = tiny_causal_lm(seed=4)
    learner = make_learner(CFG, model, total_steps=4)
    learner.step(on_policy_batch(model, n=4))
    ckpt = save_checkpoint(tmp_path, 1, learner, {}, tokenizer=build_byte_tokenizer())
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json"} <= {p.name for p in (ckpt / "model").iterdir()}
    # one copy of the weights: learner/ keeps the optimizer state only
    assert not list((ckpt / "learner").glob("*.safetensors"))
    manifest = json.loads((ckpt / "COMPLETE").read_text())["files"]
    assert {f"model/{p.name}" for p in (ckpt / "model").iterdir()} <= set(manifest)
    loaded = AutoModelForCausalLM.from_pretrained(ckpt / "model")
    tok = AutoTokenizer.from_pretrained(ckpt / "model")
    assert tok.decode(tok.encode("def f(x): return x")) == "def f(x): return x"
    x = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(x).logits, model(x).logits)
    other = make_learner(CFG, tiny_causal_lm(seed=9), total_steps=4)
    load_checkpoint(ckpt, other)
    a, b = learner.state_dict_for_sync(), other.state_dict_for_sync()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_checkpoints_written_before_model_dir_still_load(tmp_path):
    """Old layout: the weights in learner/ next to the optimizer state, no model/."""
    model = tiny_causal_lm(seed=4)
    learner = make_learner(CFG, model, total_steps=4)
    learner.step(on_policy_batch(model, n=4))
    ckpt = save_checkpoint(tmp_path, 1, learner, {})
    shutil.rmtree(ckpt / "model")
    learner.save(ckpt / "learner")  # no model_dir: the weights beside the optimizer files
    other = make_learner(CFG, tiny_causal_lm(seed=9), total_steps=4)
    load_checkpoint(ckpt, other, verify=False)
    a, b = learner.state_dict_for_sync(), other.state_dict_for_sync()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_separate_models_checkpoint(tmp_path):
    cfg = CFG.model_copy(update={"shared_model": False})
    model = tiny_causal_lm(seed=5)
    learner = make_learner(cfg, model, total_steps=4)
    learner.step(on_policy_batch(model, n=4, roles=("proposer", "solver")))
    ckpt = save_checkpoint(tmp_path, 1, learner, {})
    assert (ckpt / "proposer_model" / "model.safetensors").is_file()
    assert (ckpt / "model" / "model.safetensors").is_file()
    assert (ckpt / "learner" / "proposer" / "optimizer.pt").is_file()
    other = make_learner(cfg, tiny_causal_lm(seed=6), total_steps=4)
    load_checkpoint(ckpt, other)
    for role in ("proposer", "solver"):
        a, b = learner.state_dict_for_sync(role), other.state_dict_for_sync(role)
        assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match="shared_model"):
        load_checkpoint(ckpt, make_learner(CFG, tiny_causal_lm(), total_steps=4))
