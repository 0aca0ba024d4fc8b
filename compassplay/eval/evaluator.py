"""`Evaluator`: greedy, batched generation on benchmarks, graded; plain Python (no Ray), so a
Ray actor can own one and call `evaluate()` after each weight update.

    with Evaluator(model, tokenizer, ["cruxeval-o", "math500"], data_dir) as ev:
        results = ev.evaluate()          # list[EvalResult], skipped ones included
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from compassplay.engines.base import GenerationEngine, SamplingParams
from compassplay.eval import eval_prompts
from compassplay.eval.benchmarks import BENCHMARKS, find_data, load_items
from compassplay.eval.eval_records import EvalItem, EvalResult
from compassplay.eval.grader import Grader, outcomes


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
    tokenizer has one); progress: tqdm bars."""

    def __init__(self, model: Any, tokenizer: Any, benchmarks: list[str],
                 data_dir: str | Path | None = None, *, data_files: dict[str, str] | None = None,
                 batch_size: int = 8, max_new_tokens: int | None = None,
                 limit: int | None = None, engine: GenerationEngine | None = None,
                 grader: Grader | None = None, chat: bool | None = None,
                 progress: bool = False) -> None:
        unknown = [b for b in benchmarks if b not in BENCHMARKS]
        if unknown:
            raise ValueError(f"unknown benchmarks {unknown}; known: {', '.join(BENCHMARKS)}")
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.benchmarks = list(benchmarks)
        self.tokenizer = tokenizer
        self.data_dir, self.data_files = data_dir, data_files or {}
        self.batch_size, self.max_new_tokens, self.limit = batch_size, max_new_tokens, limit
        if engine is None:
            from compassplay.engines.hf_generation import HFGenerationEngine

            engine = HFGenerationEngine(model, tokenizer)
        self.engine = engine
        self._grader, self._own_grader = grader or Grader(), grader is None
        self.chat = eval_prompts.has_chat_template(tokenizer) if chat is None else chat
        self.progress = progress
        self._items: dict[str, tuple[list[EvalItem], str] | str] = {}

    def items(self, name: str) -> tuple[list[EvalItem], str] | str:
        """(items, data path) of a benchmark, or the skip reason (cached)."""
        if name not in self._items:
            path, looked = find_data(name, self.data_dir, self.data_files)
            self._items[name] = (load_items(name, path, self.limit), str(path)) if path \
                else f"data not found; looked for: {', '.join(looked)}"
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
        return EvalResult(benchmark=name, accuracy=correct / len(items) if items else 0.0,
                          n=len(items), correct=correct, data_path=path, seconds=t2 - t0,
                          generate_seconds=t1 - t0, grade_seconds=t2 - t1,
                          items_per_s=len(items) / (t2 - t0) if t2 > t0 else 0.0,
                          items=outcomes(items, texts, grades, finish))

    def generate(self, name: str, items: list[EvalItem]) -> tuple[list[str], list[str]]:
        """Greedy completions (stop strings cut off) and finish reasons, in item order.
        Prompts are batched by length to waste little padding."""
        bench = BENCHMARKS[name]
        stop = eval_prompts.stop_strings(bench.kind, self.chat)
        params = SamplingParams(max_new_tokens=self.max_new_tokens or bench.max_new_tokens,
                                temperature=0.0, stop=stop, seed=0)
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
