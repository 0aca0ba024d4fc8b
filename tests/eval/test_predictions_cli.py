"""`compassplay eval --predictions FILE --benchmark NAME`: grading without a model."""

from __future__ import annotations

import json

import pytest

from compassplay.cli import main
from compassplay.eval.benchmarks import BENCHMARKS, load_items
from tests.eval.gold import gold, perturbed


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("name,file", [("cruxeval-o", "cruxeval.jsonl"),
                                       ("math500", "math500.json")])
def test_gold_one_perturbed_zero(name, file, data_dir, tmp_path, capsys):
    items = load_items(name, data_dir / file)
    kind = BENCHMARKS[name].kind
    for fn, want in ((gold, "accuracy: 1.000000"), (perturbed, "accuracy: 0.000000")):
        p = _write(tmp_path / "p.jsonl", [{"id": it.id, "prediction": fn(it, kind)}
                                          for it in items])
        assert main(["eval", "--predictions", str(p), "--benchmark", name, "--data-dir",
                     str(data_dir), "--workers", "1"]) == 0
        assert want in capsys.readouterr().out.splitlines()


def test_unknown_id_and_missing_benchmark(data_dir, tmp_path, capsys):
    p = _write(tmp_path / "p.jsonl", [{"id": "nope", "prediction": "1"}])
    with pytest.raises(ValueError, match="ids not in"):
        main(["eval", "--predictions", str(p), "--benchmark", "cruxeval-o", "--data-dir",
              str(data_dir)])
    assert main(["eval", "--predictions", str(p), "--data-dir", str(data_dir)]) == 2
    assert main(["eval", "--predictions", str(p), "--benchmark", "livecodebench-exec",
                 "--data-dir", str(tmp_path)]) == 1
    assert "looked for" in capsys.readouterr().err
