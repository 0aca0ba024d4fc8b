"""The warm micro model (compassplay/data/micro_warm): loadable from any cwd, and a micro run
on it produces valid proposals, eligible candidates and a nonzero loss."""

import json
import random
from pathlib import Path

import pytest
import torch

from compassplay.config import ModelSection, load_config
from compassplay.envs.code.parsing import find_blocks
from compassplay.executors.local import LocalExecutor
from compassplay.models import load_model
from compassplay.models.byte_tokenizer import build_byte_tokenizer
from compassplay.records import Task
from compassplay.step.prompting import chat_ids
from compassplay.warmup.warm_micro import build_warm_micro, io_proposal_text
from compassplay.workers.builders import make_env

ROOT = Path(__file__).resolve().parents[2]
MICRO_WARM = ROOT / "compassplay" / "configs" / "micro_warm.yaml"
PACKAGED = "compassplay/data/micro_warm"


def test_shipped_model_loads_from_a_relative_path_in_any_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not the repo root: resolved against the package root
    model, tok = load_model(ModelSection(source="local", name_or_path=PACKAGED))
    assert not model.training
    assert model.config.vocab_size == len(tok)
    assert tok.eos_token == "<|im_end|>" and tok.padding_side == "left"
    size = (ROOT / PACKAGED / "model.safetensors").stat().st_size
    assert size < 3_000_000
    # trained, not random: greedy proposal for a deduction prompt opens a python block
    env = make_env(load_config(MICRO_WARM), None)
    text, _ = env.proposer_prompt("deduction", random.Random(0))
    assert chat_ids(tok, text) == chat_ids(build_byte_tokenizer(), text)  # same ids as trained
    ids = torch.tensor([chat_ids(tok, text)])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=16, do_sample=False,
                             pad_token_id=tok.pad_token_id)
    assert tok.decode(out[0, ids.shape[1]:]).startswith("```python\ndef f(")


@pytest.mark.slow
def test_two_step_run_has_valid_and_eligible_proposals(tmp_path):
    cfg = load_config(MICRO_WARM, ["pipeline.steps=2", "run.name=warm",
                                   f"run.output_dir={tmp_path}"])
    LocalExecutor(cfg, tmp_path / "warm").run()
    rows = [json.loads(x) for x in (tmp_path / "warm" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    assert sum(r["valid"] for r in rows) >= 1
    assert sum(r["eligible"] for r in rows) >= 1
    assert any(r["loss"] != 0.0 for r in rows)
    samples = [json.loads(x)
               for x in (tmp_path / "warm" / "samples.jsonl").read_text().splitlines()]
    assert any(s["cosine"] is not None for s in samples)  # reward.kind=cosine scored some


@pytest.mark.slow
def test_build_script_writes_a_loadable_model(tmp_path):
    out = build_warm_micro(tmp_path / "m", steps=5, seed=0)
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    model, tok = load_model(ModelSection(source="local", name_or_path=str(out)))
    assert model.config.hidden_size == 128
    assert tok.decode(tok.encode("def f(x):\n    return x\n")) == "def f(x):\n    return x\n"
    # the proposal format the script trains on is what the parser reads
    text = io_proposal_text(Task(task_id="t", task_type="deduction",
                                 program="def f(x):\n    return x", inputs=["1"]))
    assert [b.tag for b in find_blocks(text, ("python", "input"))] == ["python", "input"]
