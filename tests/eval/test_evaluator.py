"""The Evaluator end to end: a scripted engine answering gold (accuracy 1, greedy, batched),
and the real HF engine on the tiny random model."""

from __future__ import annotations

import json
import shutil

import pytest

from compassplay.engines.generation.base import GenerationEngine, SamplingParams
from compassplay.eval import eval_prompts
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
            key = it.code if kind.startswith("cruxeval") or kind == "livecodebench-exec" else it.problem
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
    ev = Evaluator(None, tok, ["livecodebench-exec", "cruxeval-o"], tmp_path, grader=grader,
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
               "--batch-size", "2", "--no-progress", "--workers", "1", "--out", str(out),
               "--samples", "2", "--temperature", "0.9"])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["decoding"] == "greedy + 2 samples at temperature 0.9"
    assert set(doc["benchmarks"]) == {"cruxeval-o", "humaneval", "amc23"}
    assert doc["dtype"] == "float32" and doc["versions"]["transformers"]
    assert doc["prompt_version"] and "git_commit" in doc
    for r in doc["benchmarks"].values():
        assert r["n"] == 2 and 0.0 <= r["accuracy"] <= 1.0 and r["seconds"] > 0
        assert "items" not in r and set(r["pass_at_k"]) == {"1", "2"}
        assert r["accuracy_stderr"] is not None and len(r["data_sha256"]) == 64
    preds = [json.loads(x) for x in (tmp_path / "res.predictions.jsonl").read_text().split("\n")
             if x]
    assert len(preds) == 18 and {p["benchmark"] for p in preds} == set(doc["benchmarks"])
    assert sorted({p["sample"] for p in preds}, key=str) == [0, 1, None]
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


def test_samples_give_pass_at_k_and_results_record_provenance(data_dir, tmp_path, grader):
    """Greedy answers gold on every item; sample j answers gold on items with index < j, so
    item i has samples - 1 - i correct samples out of `samples`."""
    from compassplay.eval.commands import write_results
    from compassplay.eval.pass_at_k import mean_pass_at_k
    from compassplay.eval.provenance import file_sha256, provenance

    tok = build_byte_tokenizer()
    items_by_code = {}

    class SampledEngine(ScriptedEngine):
        def generate(self, prompts, params):
            self.calls.append((len(prompts), params))
            out = []
            for p in prompts:
                text = self.tok.decode(p)
                i, it = next(v for k, v in items_by_code.items() if k in text)
                right = params.temperature == 0.0 or i < params.seed - 1
                reply = gold(it, "cruxeval-o") if right else "'wrong'"
                out.append(Generation(prompt_ids=p, completion_ids=[1], logprobs=[0.0],
                                      text=f"assert f({it.input}) == {reply}\n[/ANSWER]"))
            return out

    engine = SampledEngine(tok, {})
    ev = Evaluator(None, tok, ["cruxeval-o"], data_dir, grader=grader, chat=False,
                   engine=engine, samples=4, temperature=0.7)
    items, path = ev.items("cruxeval-o")
    items_by_code.update({it.code: (i, it) for i, it in enumerate(items)})
    (r,) = ev.evaluate()
    assert r.accuracy == 1.0 and r.accuracy_stderr == 0.0 and r.samples == 4
    assert {p.temperature for _, p in engine.calls} == {0.0, 0.7}
    assert sorted({p.seed for _, p in engine.calls}) == [0, 1, 2, 3, 4]
    hits = [sum(i < j for j in range(4)) for i in range(len(items))]  # 3, 2, 1 of 4
    assert set(r.pass_at_k) == {"1", "2", "4"}
    for k, v in r.pass_at_k.items():
        assert v == pytest.approx(mean_pass_at_k(4, hits, int(k)))
    assert r.pass_at_k["1"] == pytest.approx(sum(hits) / (4 * len(items)))
    assert len(r.items) == 5 * len(items)
    assert [o.sample for o in r.items[:len(items) + 1]] == [None] * len(items) + [0]
    assert r.data_sha256 == file_sha256(path)
    out = tmp_path / "res.json"
    write_results([r], out, provenance("bfloat16"))
    doc = json.loads(out.read_text())
    assert doc["dtype"] == "bfloat16" and doc["prompt_version"] == "1"
    assert doc["versions"]["torch"] and "git_commit" in doc
    b = doc["benchmarks"]["cruxeval-o"]
    assert b["pass_at_k"]["4"] == r.pass_at_k["4"] and b["accuracy_stderr"] == 0.0


def test_livecodebench_exec_is_prompted_like_cruxeval_o(data_dir, grader):
    """LiveCodeBench's execution scenario asks CRUXEval-O's question of its function."""
    tok = build_byte_tokenizer()
    engine = ScriptedEngine(tok, {})
    ev = Evaluator(None, tok, ["livecodebench-exec"], data_dir, grader=grader, chat=False,
                   engine=engine)
    (it,), _ = ev.items("livecodebench-exec")
    engine.answers[it.code] = f"assert {it.entry_point}({it.input}) == {it.output}\n[/ANSWER]"
    (r,) = ev.evaluate()
    assert r.accuracy == 1.0 and r.n == 1
    prompt = tok.decode(eval_prompts.encode(tok, eval_prompts.prompt_text(
        "livecodebench-exec", it, False), False))
    assert f"assert {it.entry_point}({it.input}) == ??" in prompt
    assert engine.calls[0][1].stop == ["[/ANSWER]"]
