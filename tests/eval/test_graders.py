"""Graders on small fixtures: gold answers score 1, perturbed (known-wrong) answers 0."""

from __future__ import annotations

import threading

import pytest

from compassplay.eval.benchmarks import BENCHMARKS, find_data, load_items
from tests.eval.gold import gold, perturbed

ALL = list(BENCHMARKS)


@pytest.mark.parametrize("name", ALL)
def test_gold_scores_one_and_perturbed_zero(name, data_dir, grader):
    path, looked = find_data(name, data_dir)
    assert path is not None, looked
    items = load_items(name, path)
    kind = BENCHMARKS[name].kind
    good = grader.grade(name, items, [gold(it, kind) for it in items])
    assert [g.correct for g in good] == [True] * len(items), good
    bad = grader.grade(name, items, [perturbed(it, kind) for it in items])
    assert [g.correct for g in bad] == [False] * len(items), bad


CRUX_REPLIES_O = [
    ("[ANSWER]\nassert f([3, 1, 2]) == [3, 2, 1]\n[/ANSWER]", True),
    ("assert f([3, 1, 2]) == [3, 2, 1]", True),
    ("```python\nassert f([3, 1, 2]) == [3,2,1]\n```", True),
    ("[3, 2, 1]", True),
    ("assert f([3, 1, 2]) == f([3, 1, 2])", False),  # calls f: not a literal
    ("assert f([3, 1, 2]) == [1, 2, 3]", False),
    ("__import__('sys').exit(0)", False),  # exits early: no completion token
    ("", False),
]


@pytest.mark.parametrize("reply,ok", CRUX_REPLIES_O)
def test_cruxeval_o_reply_forms(reply, ok, data_dir, grader):
    item = load_items("cruxeval-o", data_dir / "cruxeval.jsonl")[0]
    assert grader.grade("cruxeval-o", [item], [reply])[0].correct is ok


@pytest.mark.parametrize("reply,ok", [
    ("[ANSWER]\nassert f([1, 2, 3]) == [3, 2, 1]\n[/ANSWER]", True),  # any valid input
    ("f([2, 3, 1])", True),
    ("[1, 3, 2]", True),
    ("assert f([1]) == [3, 2, 1]", False),
    ("f([1]) or f([1, 2, 3])", False),
])
def test_cruxeval_i_reply_forms(reply, ok, data_dir, grader):
    item = load_items("cruxeval-i", data_dir / "cruxeval.jsonl")[0]
    assert grader.grade("cruxeval-i", [item], [reply])[0].correct is ok


@pytest.mark.parametrize("reply,ok", [
    ("    return sum(xs)\n", True),
    ("```python\nfrom typing import List\n\ndef add(xs: List[int]) -> int:\n"
     "    return sum(xs)\n```", True),
    ("def add(xs):\n    return sum(xs)\n", True),
    ("    import sys\n    sys.exit(0)\n", False),
    ("    return 3\n", False),
])
def test_humaneval_reply_forms(reply, ok, data_dir, grader):
    item = load_items("humaneval", data_dir / "HumanEval.jsonl.gz")[0]
    assert grader.grade("humaneval", [item], [reply])[0].correct is ok


@pytest.mark.parametrize("reply,ok", [
    ("so it is $\\boxed{0.75}$", True),
    ("The final answer is 3/4", True),
    ("\\boxed{\\frac{6}{8}}", True),
    ("\\boxed{\\frac{3}{5}}", False),
    ("no idea", False),
])
def test_math_reply_forms(reply, ok, data_dir, grader):
    item = load_items("math500", data_dir / "math500.json")[0]
    assert grader.grade("math500", [item], [reply])[0].correct is ok


def test_math_grader_from_other_threads(data_dir, math_grader):
    """math-verify's own timeout needs the main thread; ours works from any thread."""
    items = load_items("math500", data_dir / "math500.json")
    out: dict[int, list[bool]] = {}

    def work(k: int) -> None:
        out[k] = [g.correct for g in math_grader.grade(items, [gold(it, "math") for it in items])]

    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert out == {k: [True] * len(items) for k in range(3)}
