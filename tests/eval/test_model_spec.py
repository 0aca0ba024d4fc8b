"""`--model` resolution: a checkpoint's model/ (tokenizer inside), else the run's tokenizer."""

from __future__ import annotations

import torch

from compassplay.config import ModelSection, RunConfig, dump_config
from compassplay.eval.model_spec import load_eval_model, weights_dir
from compassplay.models.loading import load_model
from compassplay.rundir.checkpoint import save_checkpoint


class _Learner:
    def __init__(self, model) -> None:
        self.model = model

    def save(self, path, model_dir=None) -> None:
        self.model.save_pretrained(str(model_dir or path))


def test_checkpoint_and_run_dir_load_with_the_run_tokenizer(tmp_path):
    run = tmp_path / "runs" / "x"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(dump_config(RunConfig()))  # model.source = tiny
    model, tok = load_model(ModelSection(source="tiny"), seed=3)
    ckpt = save_checkpoint(run, 2, _Learner(model), {"step": 2})  # no tokenizer files
    assert weights_dir(ckpt) == ckpt / "model" and weights_dir(run) == ckpt / "model"
    for spec in (ckpt, run, ckpt / "model"):
        loaded, ltok = load_eval_model(str(spec))
        assert ltok.encode("ab") == tok.encode("ab") and ltok.padding_side == "left"
        for (k, a), b in zip(model.state_dict().items(), loaded.state_dict().values(),
                             strict=True):
            assert torch.equal(a, b), k
        assert not loaded.training


def test_a_folder_without_weights_is_a_clear_error(tmp_path, capsys):
    from compassplay.cli import main

    assert main(["eval", "--model", str(tmp_path), "--benchmarks", "cruxeval-o"]) == 2
    assert "no config.json" in capsys.readouterr().err
