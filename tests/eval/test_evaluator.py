"""The Evaluator end to end: a scripted engine answering gold (accuracy 1, greedy, batched),
and the real HF engine on the tiny random model."""

from __future__ import annotations

import json
import shutil

import pytest

from compassplay.engines.base import GenerationEngine, SamplingParams
from compassplay.eval.benchmarks import BENCHMARKS
from compassplay.eval.eval_records import EvalMetric
from compassplay.eval.evaluator import Evaluator
from compassplay.models.byte_tokenizer import build_byte_tokenizer
from compassplay.records import Generation
from tests.eval.gold import gold


class ScriptedEngine(GenerationEngine):
    """Replies with `answers[key]` for the first key found in the decoded prompt."""

    def __init__(self, tokenizer, answers: dict[str, str]) -> None:
        self.tok, self.answers, self.calls = tokenizer, answers, []

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        self.calls.append((len(prompts), params))
        out = []
        for p in prompts:
            text = self.tok.decode(p)
            reply = next(v for k, v in self.answers.items() if k in text)
            out.append(Generation(prompt_ids=p, completion_ids=[1], logprobs=[0.0], text=reply))
        return out

    def load_weights(self, state, version: int) -> None:  # pragma: no cover
        pass

    @property
    def weight_version(self) -> int:
        return 0


def _answers(ev: Evaluator, names: list[str]) -> dict[str, str]:
    answers = {}
    for name in names:
        items, _ = ev.items(name)
        kind = BENCHMARKS[name].kind
        for it in items:
            key = it.code if kind.startswith("cruxeval") or kind == "livecodebench" else it.problem
            reply = gold(it, kind)
            if kind == "cruxeval-o":
                reply = f"assert f({it.input}) == {reply}\n[/ANSWER]\njunk after the stop"
            answers[key] = reply
    return answers


def test_scripted_gold_engine_scores_one(data_dir, grader):
    tok = build_byte_tokenizer()
    names = ["cruxeval-o", "humaneval", "math500", "gsm8k"]
    engine = ScriptedEngine(tok, {})
    ev = Evaluator(None, tok, names, data_dir, batch_size=2, grader=grader, chat=False,
                   engine=engine)
    engine.answers.update(_answers(ev, names))
    results = ev.evaluate()
    assert [(r.benchmark, r.accuracy) for r in results] == [(n, 1.0) for n in names]
    assert all(n <= 2 for n, _ in engine.calls)  # batched
    assert all(p.temperature == 0.0 for _, p in engine.calls)  # greedy
    crux = results[0]
    assert crux.items[0].prediction.endswith("\n")  # cut at [/ANSWER]
    assert crux.n == 3 and crux.items_per_s > 0
    assert EvalMetric.from_result(crux, step=4, version=2).model_dump() == {
        "kind": "eval", "step": 4, "version": 2, "benchmark": "cruxeval-o", "accuracy": 1.0,
        "n": 3, "seconds": crux.seconds}


def test_missing_data_is_skipped_and_the_rest_runs(data_dir, grader, tmp_path):
    shutil.copy(data_dir / "cruxeval.jsonl", tmp_path / "cruxeval.jsonl")
    tok = build_byte_tokenizer()
    ev = Evaluator(None, tok, ["livecodebench", "cruxeval-o"], tmp_path, grader=grader,
                   chat=False, limit=1, engine=ScriptedEngine(tok, {"": "[1]"}))
    skipped, ran = ev.evaluate()
    assert skipped.accuracy is None and str(tmp_path / "livecodebench.jsonl") in skipped.skipped
    assert ran.n == 1 and ran.accuracy == 0.0
    with pytest.raises(ValueError, match="skipped"):
        EvalMetric.from_result(skipped, step=0)


def test_cli_eval_tiny_model_writes_results_and_predictions(data_dir, tmp_path, capsys):
    from compassplay.cli import main

    out = tmp_path / "res.json"
    rc = main(["eval", "--model", "tiny", "--benchmarks", "cruxeval-o,humaneval,amc23",
               "--data-dir", str(data_dir), "--limit", "2", "--max-new-tokens", "3",
               "--batch-size", "2", "--no-progress", "--workers", "1", "--out", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["decoding"] == "greedy" and set(doc["benchmarks"]) == {
        "cruxeval-o", "humaneval", "amc23"}
    for r in doc["benchmarks"].values():
        assert r["n"] == 2 and 0.0 <= r["accuracy"] <= 1.0 and r["seconds"] > 0
        assert "items" not in r
    preds = [json.loads(x) for x in (tmp_path / "res.predictions.jsonl").read_text().split("\n")
             if x]
    assert len(preds) == 6 and {p["benchmark"] for p in preds} == set(doc["benchmarks"])
    assert "accuracy" in capsys.readouterr().out


def test_evaluate_from_a_worker_thread(data_dir, grader):
    """As a Ray actor would call it: off the main thread, math grading included."""
    import threading

    tok = build_byte_tokenizer()
    engine = ScriptedEngine(tok, {})
    ev = Evaluator(None, tok, ["math500", "cruxeval-i"], data_dir, grader=grader, chat=False,
                   engine=engine)
    engine.answers.update(_answers(ev, ["math500", "cruxeval-i"]))
    out = {}
    t = threading.Thread(target=lambda: out.update(r=ev.evaluate()))
    t.start()
    t.join(120)
    assert [r.accuracy for r in out["r"]] == [1.0, 1.0]
