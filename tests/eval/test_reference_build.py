"""`compassplay reference build`: sampling, filters, MATH500 exclusion, the output format."""

from __future__ import annotations

import json

import pytest

from compassplay.cli import main
from compassplay.eval.reference_build import math500_hashes, problem_hash
from compassplay.rewards.reference_set import load_reference

MATH500_PROBLEM = ("Convert the point $(0,3)$ in rectangular coordinates to polar coordinates.  "
                   "Enter your answer in the form $(r,\\theta),$ where $r > 0$ and "
                   "$0 \\le \\theta < 2 \\pi.$")  # MATH500's first item


def _rows(n: int) -> list[dict]:
    subjects = ["Prealgebra", "Geometry"]
    return [{"unique_id": f"test/x/{i}.json", "subject": subjects[i % 2],
             "level": f"Level {1 + i % 5}", "problem": f"What is {i} + {i}?",
             "solution": f"It is $\\boxed{{{2 * i}}}$.", "answer": str(2 * i)}
            for i in range(40)]


@pytest.fixture
def source(tmp_path):
    rows = _rows(40) + [{"problem": MATH500_PROBLEM, "solution": "$\\boxed{2}$",
                         "level": "Level 1", "subject": "Prealgebra"}]
    p = tmp_path / "src.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_build_from_file_with_filters(source, tmp_path, capsys):
    out = tmp_path / "ref.jsonl"
    assert main(["reference", "build", "--from", str(source), "--n", "4", "--seed", "1",
                 "--levels", "1,Level 2", "--subjects", "prealgebra", "--out", str(out)]) == 0
    items = load_reference(out)
    assert len(items) == 4
    for it in items:  # even i (Prealgebra) with level 1 or 2: i % 10 == 0 (L1) / 6 (L2)
        i = int(it.prompt.split()[2])
        assert i % 2 == 0 and i % 5 in (0, 1) and "\\boxed" in it.solution
    assert "math500: 1" in capsys.readouterr().out
    again = tmp_path / "again.jsonl"
    main(["reference", "build", "--from", str(source), "--n", "4", "--seed", "1",
          "--levels", "1,2", "--subjects", "Prealgebra", "--out", str(again)])
    assert again.read_text() == out.read_text()  # seeded


def test_never_math500_and_clear_errors(source, tmp_path, capsys):
    assert problem_hash(MATH500_PROBLEM) in math500_hashes() and len(math500_hashes()) == 500
    out = tmp_path / "ref.jsonl"
    assert main(["reference", "build", "--from", str(source), "--n", "40", "--out",
                 str(out)]) == 0
    assert MATH500_PROBLEM not in out.read_text()
    assert main(["reference", "build", "--from", str(source), "--n", "41", "--out",
                 str(out)]) == 1
    assert "only 40 problems" in capsys.readouterr().err
    assert main(["reference", "build", "--from", str(tmp_path / "none.jsonl"), "--out",
                 str(out)]) == 1
    assert "file not found" in capsys.readouterr().err


def test_hub_failure_is_a_clear_message(tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed
    assert main(["reference", "build", "--hub", "EleutherAI/hendrycks_math", "--out",
                 str(tmp_path / "r.jsonl")]) == 1
    assert "datasets" in capsys.readouterr().err


def test_build_from_the_shipped_solutions(shared, tmp_path):
    src = shared("math_solutions.jsonl")
    out = tmp_path / "ref.jsonl"
    assert main(["reference", "build", "--from", str(src), "--n", "32", "--out", str(out)]) == 0
    items = load_reference(out)
    assert len(items) == 32 and len({i.prompt for i in items}) == 32
    m500 = shared("math500.json")
    banned = {p["problem"].strip() for p in json.loads(m500.read_text())}
    assert not banned & {i.prompt for i in items}


def test_exclude_draws_a_set_disjoint_from_another(source, tmp_path, capsys):
    first = tmp_path / "ref.jsonl"
    assert main(["reference", "build", "--from", str(source), "--n", "30", "--out",
                 str(first)]) == 0
    held = tmp_path / "held.jsonl"
    assert main(["reference", "build", "--from", str(source), "--n", "10", "--exclude",
                 str(first), "--out", str(held)]) == 0
    assert "excluded: 30" in capsys.readouterr().out
    a = {it.prompt for it in load_reference(first)}
    b = {it.prompt for it in load_reference(held)}
    assert len(b) == 10 and not a & b
    assert main(["reference", "build", "--from", str(source), "--n", "11", "--exclude",
                 str(first), "--out", str(held)]) == 1  # only 10 are left
    assert main(["reference", "build", "--from", str(source), "--n", "1", "--exclude",
                 str(tmp_path / "none.jsonl"), "--out", str(held)]) == 1
    assert "--exclude: file not found" in capsys.readouterr().err
