"""Graders on the real shared data (skipped when the folder is absent): on the first N items
of every benchmark, gold answers score 1 and perturbed answers 0."""

from __future__ import annotations

import pytest

from compassplay.eval.benchmarks import BENCHMARKS, find_data, load_items
from tests.eval.conftest import SHARED
from tests.eval.gold import gold, perturbed

N = 30


@pytest.mark.parametrize("name", [n for n in BENCHMARKS if n != "livecodebench-exec"])
def test_gold_and_perturbed_on_shared_data(name, grader):
    path, looked = find_data(name, SHARED)
    if path is None:
        pytest.skip(f"no data: {looked}")
    items = load_items(name, path, limit=N)
    kind = BENCHMARKS[name].kind
    good = grader.grade(name, items, [gold(it, kind) for it in items])
    assert [it.id for it, g in zip(items, good, strict=True) if not g.correct] == []
    bad = grader.grade(name, items, [perturbed(it, kind) for it in items])
    assert [it.id for it, g in zip(items, bad, strict=True) if g.correct] == []


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in BENCHMARKS if n != "livecodebench-exec"])
def test_gold_and_perturbed_on_all_shared_items(name, grader):
    """All items: measured grader accuracy is 1.0 on gold for every benchmark and 0.0 on
    perturbed answers except one Minerva item whose gold math-verify parses to a constant."""
    path, looked = find_data(name, SHARED)
    if path is None:
        pytest.skip(f"no data: {looked}")
    items = load_items(name, path)
    kind = BENCHMARKS[name].kind
    good = grader.grade(name, items, [gold(it, kind) for it in items])
    assert sum(g.correct for g in good) == len(items)
    bad = grader.grade(name, items, [perturbed(it, kind) for it in items])
    assert sum(g.correct for g in bad) <= (1 if name == "minerva" else 0)
