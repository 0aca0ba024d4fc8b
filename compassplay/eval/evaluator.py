"""`Evaluator`: greedy, batched generation on benchmarks, graded; plain Python (no Ray), so a
Ray actor can own one and call `evaluate()` after each weight update. With `samples=N` each
item also gets N sampled completions (at `temperature`), reported as unbiased pass@k.

    with Evaluator(model, tokenizer, ["cruxeval-o", "math500"], data_dir) as ev:
        results = ev.evaluate()          # list[EvalResult], skipped ones included
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from compassplay.engines.generation.base import GenerationEngine, SamplingParams
from compassplay.engines.generation.hf import HFGenerationEngine
from compassplay.eval import eval_prompts
from compassplay.eval.benchmarks import BENCHMARKS, check_name, find_data, load_items
from compassplay.eval.eval_records import EvalItem, EvalResult
from compassplay.eval.grader import Grader, outcomes
from compassplay.eval.pass_at_k import binomial_stderr, mean_pass_at_k, report_ks
from compassplay.eval.provenance import file_sha256


def cut_at_stop(text: str, stop: list[str]) -> str:
    """`text` up to the first stop string (engines keep the matched stop string)."""
    cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=-1)
    return text if cut < 0 else text[:cut]


class Evaluator:
    """Evaluate one model on `benchmarks` (names from `BENCHMARKS`).

    data_dir / data_files: where data lives (see `benchmarks.find_data`); limit: first N items
    per benchmark; max_new_tokens: None = each benchmark's default; engine: any
    `GenerationEngine` (default: the HF engine on `model`); grader: a `Grader` to share (else
    one is made and closed by close()); chat: use the chat template (None = when the
    tokenizer has one); progress: tqdm bars; samples: sampled completions per item besides
    the greedy one (0 = greedy only), drawn at `temperature` (> 0) with seeds 1..samples."""

    def __init__(self, model: Any, tokenizer: Any, benchmarks: list[str],
                 data_dir: str | Path | None = None, *, data_files: dict[str, str] | None = None,
                 batch_size: int = 8, max_new_tokens: int | None = None,
                 limit: int | None = None, engine: GenerationEngine | None = None,
                 grader: Grader | None = None, chat: bool | None = None,
                 progress: bool = False, samples: int = 0, temperature: float = 0.8) -> None:
        for b in benchmarks:
            check_name(b)
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if samples < 0 or (samples and temperature <= 0):
            raise ValueError(f"samples must be >= 0 and temperature > 0 with samples "
                             f"(samples={samples}, temperature={temperature})")
        self.samples, self.temperature = samples, temperature
        self.benchmarks = list(benchmarks)
        self.tokenizer = tokenizer
        self.data_dir, self.data_files = data_dir, data_files or {}
        self.batch_size, self.max_new_tokens, self.limit = batch_size, max_new_tokens, limit
        if engine is None:
            engine = HFGenerationEngine(model, tokenizer)
        self.engine = engine
        self._grader, self._own_grader = grader or Grader(), grader is None
        self.chat = eval_prompts.has_chat_template(tokenizer) if chat is None else chat
        self.progress = progress
        self._items: dict[str, tuple[list[EvalItem], str] | str] = {}
        self._sha256: dict[str, str] = {}

    def items(self, name: str) -> tuple[list[EvalItem], str] | str:
        """(items, data path) of a benchmark, or the skip reason (cached)."""
        if name not in self._items:
            path, looked = find_data(name, self.data_dir, self.data_files)
            self._items[name] = (load_items(name, path, self.limit), str(path)) if path \
                else f"data not found; looked for: {', '.join(looked)}"
            if path:
                self._sha256[name] = file_sha256(path)
        return self._items[name]

    def evaluate(self, benchmarks: list[str] | None = None) -> list[EvalResult]:
        """One EvalResult per benchmark (skipped ones carry the reason)."""
        return [self.evaluate_one(b) for b in (benchmarks or self.benchmarks)]

    def evaluate_one(self, name: str) -> EvalResult:
        got = self.items(name)
        if isinstance(got, str):
            return EvalResult(benchmark=name, skipped=got)
        items, path = got
        t0 = time.perf_counter()
        texts, finish = self.generate(name, items)
        t1 = time.perf_counter()
        grades = self._grader.grade(name, items, texts)
        t2 = time.perf_counter()
        correct = sum(g.correct for g in grades)
        acc = correct / len(items) if items else 0.0
        gen_s, grade_s = t1 - t0, t2 - t1
        outs = outcomes(items, texts, grades, finish)
        hits = [0] * len(items)
        for j in range(self.samples):
            t3 = time.perf_counter()
            s_texts, s_finish = self.generate(name, items, self.temperature, seed=j + 1)
            t4 = time.perf_counter()
            s_grades = self._grader.grade(name, items, s_texts)
            gen_s, grade_s = gen_s + t4 - t3, grade_s + time.perf_counter() - t4
            hits = [h + g.correct for h, g in zip(hits, s_grades, strict=True)]
            outs += [o.model_copy(update={"sample": j})
                     for o in outcomes(items, s_texts, s_grades, s_finish)]
        secs = time.perf_counter() - t0
        pass_k = {str(k): mean_pass_at_k(self.samples, hits, k)
                  for k in report_ks(self.samples)} if self.samples else {}
        return EvalResult(benchmark=name, accuracy=acc,
                          accuracy_stderr=binomial_stderr(acc, len(items)), n=len(items),
                          correct=correct, samples=self.samples,
                          temperature=self.temperature if self.samples else None,
                          pass_at_k=pass_k, data_path=path,
                          data_sha256=self._sha256.get(name, ""), seconds=secs,
                          generate_seconds=gen_s, grade_seconds=grade_s,
                          items_per_s=len(items) / secs if secs > 0 else 0.0, items=outs)

    def generate(self, name: str, items: list[EvalItem], temperature: float = 0.0,
                 seed: int = 0) -> tuple[list[str], list[str]]:
        """Completions (stop strings cut off) and finish reasons, in item order: greedy at
        temperature 0, else sampled with `seed`. Prompts are batched by length to waste
        little padding."""
        bench = BENCHMARKS[name]
        stop = eval_prompts.stop_strings(bench.kind, self.chat)
        params = SamplingParams(max_new_tokens=self.max_new_tokens or bench.max_new_tokens,
                                temperature=temperature, stop=stop, seed=seed)
        texts_in = [eval_prompts.prompt_text(bench.kind, it, self.chat) for it in items]
        ids = [eval_prompts.encode(self.tokenizer, t, self.chat) for t in texts_in]
        order = sorted(range(len(items)), key=lambda i: len(ids[i]))
        texts, finish = [""] * len(items), [""] * len(items)
        bar = None
        if self.progress:
            from tqdm import tqdm

            bar = tqdm(total=len(items), desc=name, unit="item")
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            for i, g in zip(chunk, self.engine.generate([ids[i] for i in chunk], params),
                            strict=True):
                texts[i], finish[i] = cut_at_stop(g.text, stop), g.finish_reason
            if bar is not None:
                bar.update(len(chunk))
        if bar is not None:
            bar.close()
        return texts, finish

    def close(self) -> None:
        if self._own_grader:
            self._grader.close()

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
