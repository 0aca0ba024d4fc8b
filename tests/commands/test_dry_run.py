"""`compassplay run --dry-run`: every shipped config builds all but its models; a broken one
exits 2 naming the field."""

import json
from pathlib import Path

import pytest

from compassplay.cli import main
from compassplay.commands.dry_run import dry_run
from compassplay.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p.stem for p in (ROOT / "compassplay" / "configs").glob("*.yaml"))
TARGETS = ROOT / "tests" / "envs" / "lean" / "targets.jsonl"
LEAN = [n for n in SHIPPED if load_config(n).task.domain == "lean"]


DATA_DIR = ROOT.parent / "shared" / "data"


def _needs_data_dir(name: str) -> bool:
    """The config names seed files that live in $COMPASSPLAY_DATA_DIR (AZR's 7B seed sets)."""
    return any(s.strip().startswith("azr_")
               for s in load_config(name).task.seed_file.split(","))


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_config_passes_the_dry_run(name, capsys, monkeypatch):
    monkeypatch.delenv("COMPASSPLAY_DATA_DIR", raising=False)
    # a Lean config's target set is the user's (the paper's is not shipped): the test targets
    extra = [f"task.lean.target_file={TARGETS}"] if name in LEAN else []
    if _needs_data_dir(name):
        # without the data folder the dry run stops at the field; with it, it passes
        assert main(["run", "--config", name, "--dry-run", *extra]) == 2
        assert "task.seed_file" in capsys.readouterr().err
        if not DATA_DIR.is_dir():
            pytest.skip(f"{name} needs AZR's seed sets in $COMPASSPLAY_DATA_DIR ({DATA_DIR})")
        monkeypatch.setenv("COMPASSPLAY_DATA_DIR", str(DATA_DIR))
    assert main(["run", "--config", name, "--dry-run", *extra]) == 0
    out = capsys.readouterr().out
    report = json.loads(out[:out.rindex("}") + 1])
    assert report["resources"] and report["resources_total"]["CPU"] > 0
    plan = report["memory_plan"]  # every shipped model's shape is known to the plan
    assert plan["model"]["params"] > 0
    if report["resources_total"]["GPU"]:  # GPU configs: every GPU checked, and they fit
        assert plan["gpus"] and all(g["fits"] for g in plan["gpus"])
        assert set(plan["roles"]) >= {"proposer", "solver"}
    else:
        assert plan["gpus"] == [] and "no role asks for a GPU" in plan["notes"][0]
    if report["reward"] == "soar":
        assert report["soar_heldout_items"] >= 1 or report["environment"]["heldout_seeds"]
    if name in LEAN:
        assert report["environment"]["targets"] == 3 and "lean-fleet" in report["resources"]


def test_lean_paper_configs_take_their_targets_from_the_data_dir(tmp_path, monkeypatch, capsys):
    assert {"paper_lean_7b", "ablation_lean_cos_7b", "baseline_lean_novelty_7b",
            "baseline_lean_difficulty_7b"} <= set(LEAN)
    monkeypatch.delenv("COMPASSPLAY_DATA_DIR", raising=False)
    assert main(["run", "--config", "paper_lean_7b", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "task.lean.target_file: paper_lean_targets.jsonl: target file not found" in err
    (tmp_path / "paper_lean_targets.jsonl").write_text(TARGETS.read_text())
    monkeypatch.setenv("COMPASSPLAY_DATA_DIR", str(tmp_path))
    report = dry_run(load_config("baseline_lean_difficulty_7b"))
    assert report["environment"]["targets"] == 3 and report["reward"] == "difficulty"


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
