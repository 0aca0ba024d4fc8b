"""A real micro run's final checkpoint is a complete HF folder: from_pretrained and
AutoTokenizer load it as it is and give the learner's logits; eval --model takes it; the
end-of-run text names it."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from compassplay.commands.summary import final_model
from compassplay.config import load_config
from compassplay.eval.model_spec import load_eval_model
from compassplay.executors.local import LocalExecutor
from compassplay.rundir.checkpoint import latest_checkpoint, verify_checkpoint

MICRO = Path(__file__).resolve().parents[2] / "compassplay" / "configs" / "micro.yaml"
TEXT = "def f(x):\n    return x + 1\n"


def test_the_final_checkpoint_loads_with_transformers_and_eval(tmp_path):
    from compassplay.cli import _summary_text

    cfg = load_config(MICRO, ["pipeline.steps=2", "logging.progress=false", "run.name=hf"])
    run = tmp_path / "hf"
    ex = LocalExecutor(cfg, run)
    ex.run()
    ckpt = latest_checkpoint(run)
    assert ckpt.name == "step_000001" and final_model(run) == ckpt / "model"
    verify_checkpoint(ckpt)  # the manifest covers model/ too
    model_dir = ckpt / "model"
    loaded = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    assert tok.encode(TEXT) == ex.learner.tok.encode(TEXT)
    assert tok.eos_token == ex.learner.tok.eos_token
    ids = torch.tensor([tok.encode(TEXT)])
    learner_model = ex.learner.model.eval()
    with torch.no_grad():
        want = learner_model(ids).logits.float()
        torch.testing.assert_close(loaded(ids).logits.float(), want)
        evaluated, etok = load_eval_model(str(model_dir))
        assert etok.encode(TEXT) == tok.encode(TEXT)
        torch.testing.assert_close(evaluated(ids).logits.float(), want)
    assert f"final model (HF folder: from_pretrained, vllm, `compassplay eval --model`): " \
           f"{model_dir}" in _summary_text(run)
