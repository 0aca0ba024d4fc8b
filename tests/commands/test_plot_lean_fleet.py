"""The Lean fleet's timeline file (lean_fleet.jsonl) read back and plotted."""

import json

import pytest

from compassplay.commands.plot import plot_lean_fleet, read_lean_timeline


def _row(unix, backlog, actors, placed, nodes, waits=()):
    return {"t": unix - 100.0, "unix": unix, "backlog": backlog, "actors": actors,
            "placed": placed, "nodes": nodes, "start_waits": list(waits)}


def test_a_timeline_is_plotted_and_a_run_without_one_is_not(tmp_path):
    assert plot_lean_fleet(tmp_path) is None  # a coding run has no Lean fleet
    rows = [_row(100.0, 0, 0, 0, {"head": 1}), _row(101.0, 12, 6, 0, {"head": 1}),
            _row(115.5, 12, 6, 4, {"head": 1, "lean_repl": 1}, [14.2, 14.4, 14.5, 14.5]),
            _row(121.0, 3, 6, 6, {"head": 1, "lean_repl": 2}, [19.9, 20.0]),
            _row(122.0, 0, 0, 0, {"head": 1, "lean_repl": 2}),
            _row(131.0, 0, 0, 0, {"head": 1})]
    (tmp_path / "lean_fleet.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert read_lean_timeline(tmp_path / "lean_fleet.jsonl") == rows
    out = plot_lean_fleet(tmp_path)
    assert out == tmp_path / "lean_fleet.png"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_a_bad_timeline_row_is_named_by_file_and_line(tmp_path):
    path = tmp_path / "lean_fleet.jsonl"
    path.write_text(json.dumps(_row(1.0, 0, 0, 0, {})) + "\n" + '{"unix": 2.0}\n')
    with pytest.raises(ValueError, match=r"lean_fleet.jsonl:2: not a Lean fleet timeline row"):
        plot_lean_fleet(tmp_path)
