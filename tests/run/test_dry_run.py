"""`compassplay run --dry-run`: every shipped config builds all but its models; a broken one
exits 2 naming the field."""

import json
from pathlib import Path

import pytest

from compassplay.cli import main
from compassplay.config import ConfigError, load_config
from compassplay.run.dry_run import dry_run

SHIPPED = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "compassplay"
                                  / "configs").glob("*.yaml"))


DATA_DIR = Path(__file__).resolve().parents[3] / "shared" / "data"


def _needs_data_dir(name: str) -> bool:
    """The config names seed files that live in $COMPASSPLAY_DATA_DIR (AZR's 7B seed sets)."""
    return any(s.strip().startswith("azr_")
               for s in load_config(name).task.seed_file.split(","))


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_config_passes_the_dry_run(name, capsys, monkeypatch):
    monkeypatch.delenv("COMPASSPLAY_DATA_DIR", raising=False)
    if _needs_data_dir(name):
        # without the data folder the dry run stops at the field; with it, it passes
        assert main(["run", "--config", name, "--dry-run"]) == 2
        assert "task.seed_file" in capsys.readouterr().err
        if not DATA_DIR.is_dir():
            pytest.skip(f"{name} needs AZR's seed sets in $COMPASSPLAY_DATA_DIR ({DATA_DIR})")
        monkeypatch.setenv("COMPASSPLAY_DATA_DIR", str(DATA_DIR))
    assert main(["run", "--config", name, "--dry-run"]) == 0
    out = capsys.readouterr().out
    report = json.loads(out[:out.rindex("}") + 1])
    assert report["resources"] and report["resources_total"]["CPU"] > 0
    if report["reward"] == "soar":
        assert report["soar_heldout_items"] >= 1 or report["environment"]["heldout_seeds"]


def test_soar_paper_config_measures_on_math_disjoint_from_the_reference():
    report = dry_run(load_config("baseline_soar_7b", ["task.seed_file=simple"]))
    assert report["soar_heldout_items"] == 32 and report["reference_items"] == 32


def test_dry_run_names_the_field_at_fault(tmp_path, capsys):
    assert main(["run", "--config", "micro", "--dry-run", "reward.kind=soar",
                 "reward.soar_heldout=seeds", "reward.soar_heldout_items=500"]) == 2
    assert "reward.soar_heldout_items=500" in capsys.readouterr().err
    same = tmp_path / "same.jsonl"
    ref = Path(__file__).resolve().parents[2] / "compassplay" / "data" / "reference_math.jsonl"
    same.write_text(ref.read_text())
    with pytest.raises(ConfigError, match="reward.soar_heldout: .* in the reference set"):
        dry_run(load_config("micro", ["reward.kind=soar", f"reward.soar_heldout={same}"]))
    assert main(["run", "--config", "micro", "--dry-run", "task.seed_file=/nonexistent"]) == 2
    assert "task.seed_file" in capsys.readouterr().err
