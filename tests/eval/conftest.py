"""Fixtures for the eval tests: a code runner (the real sandbox; a subprocess runner only when
the sandbox is unavailable, as in tests/envs/code), a math grader, small benchmark files written
into a temp dir, and the optional shared data folder."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from compassplay.eval.grader import Grader
from compassplay.eval.math_grading import MathGrader
from tests.envs.code.conftest import make_runner

SHARED = Path(os.environ.get("COMPASSPLAY_DATA_DIR")
              or Path(__file__).resolve().parents[3] / "shared" / "data")

CRUX = [
    {"code": "def f(nums):\n    return sorted(nums)[::-1]", "input": "[3, 1, 2]",
     "output": "[3, 2, 1]", "id": "sample_0"},
    {"code": "def f(a, b):\n    return a + b", "input": "'ab', 'c'", "output": "'abc'",
     "id": "sample_1"},
    {"code": "def f(d):\n    return {k: len(v) for k, v in d.items()}",
     "input": "{'x': 'abc', 'y': ''}", "output": "{'x': 3, 'y': 0}", "id": "sample_2"},
]
HUMANEVAL = [
    {"task_id": "HumanEval/0", "entry_point": "add",
     "prompt": "from typing import List\n\n\ndef add(xs: List[int]) -> int:\n"
               "    \"\"\"Sum of xs.\"\"\"\n",
     "canonical_solution": "    return sum(xs)\n",
     "test": "def check(candidate):\n    assert candidate([1, 2]) == 3\n"
             "    assert candidate([]) == 0\n"},
    {"task_id": "HumanEval/1", "entry_point": "shout",
     "prompt": "def shout(s: str) -> str:\n    \"\"\"Upper case with a '!'.\"\"\"\n",
     "canonical_solution": "    return s.upper() + '!'\n",
     "test": "def check(candidate):\n    assert candidate('hi') == 'HI!'\n"},
]
LCB = [{"question_id": 7, "function_name": "maxPair", "code":
        "def maxPair(nums):\n    return max(a * b for a in nums for b in nums if a is not b)",
        "input": "[1, 5, 4]", "output": "20"}]
MATH500 = [
    {"problem": "What is $1/2 + 1/4$?", "answer": "\\frac{3}{4}", "unique_id": "t/a/1.json"},
    {"problem": "Solve $x+1=6$.", "answer": "x=5", "unique_id": "t/a/2.json"},
    {"problem": "Convert $(0,3)$ to polar.", "answer": "\\left( 3, \\frac{\\pi}{2} \\right)",
     "unique_id": "t/p/3.json"},
    {"problem": "Who won?", "answer": "\\text{Evelyn}", "unique_id": "t/p/4.json"},
    {"problem": "Interval?", "answer": "(-\\infty, 2]", "unique_id": "t/p/5.json"},
]
AMC = [{"problem": "m+n?", "answer": 142.0}, {"problem": "x?", "answer": 7.5}]
GSM8K = [{"question": "Eggs?", "answer": "16 - 3 - 4 = 9\n9 * 2 = 18\n#### 1,018"}]
MINERVA = [{"problem": "wavelength?", "answer": ["9.6\n"], "idx": 9},
           {"problem": "range?", "answer": ["0.01\n", "0.02\n"], "idx": 13}]
OLYMPIAD = [{"id": 1606, "problem": "moves?", "answer": ["$(-\\infty, 0)$."]}]


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """Tiny copies of every benchmark file, in the shared folder's layouts and names."""
    d = tmp_path_factory.mktemp("evaldata")
    (d / "cruxeval.jsonl").write_text(_jsonl(CRUX))
    with gzip.open(d / "HumanEval.jsonl.gz", "wt") as f:
        f.write(_jsonl(HUMANEVAL))
    (d / "livecodebench.jsonl").write_text(_jsonl(LCB))
    (d / "math500.json").write_text(json.dumps(MATH500))
    (d / "amc.json").write_text(json.dumps(AMC))
    (d / "gsm8k_test.jsonl").write_text(_jsonl(GSM8K))
    (d / "minerva.json").write_text(json.dumps(MINERVA))
    (d / "olympiad_bench.json").write_text(json.dumps(OLYMPIAD))
    return d


@pytest.fixture(scope="session")
def runner():
    r, sb = make_runner(5.0)
    yield r
    if sb is not None:
        sb.close()


@pytest.fixture(scope="session")
def math_grader():
    with MathGrader(workers=2, timeout_s=10.0) as g:
        yield g


@pytest.fixture(scope="session")
def grader(runner, math_grader):
    g = Grader(runner=runner, math=math_grader)
    yield g
    g.close()


@pytest.fixture
def shared():
    """`shared(name)` -> path of a shared data file (skips the test when absent)."""
    def get(name: str) -> Path:
        p = SHARED / name
        if not p.exists():
            pytest.skip(f"{p} not present")
        return p
    return get
