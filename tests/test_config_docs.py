"""The documented config: descriptions on every field, docs/config.md in sync, the JSON schema,
`config show` resolving the same default as `run`, and `--version`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from pydantic import Field

from compassplay import cli
from compassplay.config import Section, load_config
from compassplay.config.reference_docs import config_markdown, config_schema, iter_fields

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "config.md"


def test_every_field_has_a_description():
    fields = list(iter_fields())
    assert len([f for f in fields if not f.section]) >= 177
    missing = [f.dotted for f in fields if not f.description.strip()]
    assert not missing, f"config fields without a description: {missing}"


def test_docs_config_md_is_up_to_date():
    want = config_markdown()
    assert DOC.is_file(), "docs/config.md missing: compassplay config docs > docs/config.md"
    assert DOC.read_text() == want, ("docs/config.md is out of date: regenerate it with "
                                     "`compassplay config docs > docs/config.md`")


def test_docs_list_every_field_with_type_default_range():
    md = config_markdown()
    for f in iter_fields():
        row = f"\n## `{f.dotted}`\n" if "." not in f.dotted else f"| `{f.dotted}` |"
        assert row in md, f.dotted
    assert "| `learner.lr` | float | `1e-06` | > 0.0 | peak AdamW" in md
    assert "| `model.tiny.arch` | qwen2 \\| llama \\| gpt2 | `\"qwen2\"` |" in md


def test_walker_picks_up_a_new_field_and_its_missing_description():
    class NewSection(Section):
        documented: int = Field(3, ge=1, description="a documented knob (s)")
        bare: bool = False

    docs = {f.dotted: f for f in iter_fields(NewSection, prefix="new.")}
    assert docs["new.documented"].default == "3" and docs["new.documented"].range == ">= 1"
    assert docs["new.bare"].description == ""  # what the description test catches


def test_schema_is_inlined_and_carries_a_configs_values():
    plain = config_schema()
    assert "$ref" not in json.dumps(plain) and "$defs" not in plain
    run = plain["properties"]["run"]["properties"]
    assert run["name"]["default"] == "run" and run["seed"]["minimum"] == 0
    prop = config_schema(load_config("default"))["properties"]
    assert prop["run"]["properties"]["name"]["default"] == "default"
    cluster = prop["cluster"]["properties"]
    assert cluster["proposer"]["properties"]["num_cpus"]["default"] == 0.25
    assert cluster["verifier"]["properties"]["num_cpus"]["default"] == 0.25
    assert prop["task"]["properties"]["types"]["default"] == ["deduction", "abduction",
                                                              "induction"]


def test_cli_config_schema(capsys):
    assert cli.main(["config", "schema", "--config", "micro", "pipeline.steps=7"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["properties"]["pipeline"]["properties"]["steps"]["default"] == 7
    assert schema["properties"]["pipeline"]["properties"]["steps"]["description"]


def test_config_show_resolves_the_default_run_uses(capsys):
    assert cli.main(["config", "show"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown == load_config(cli.DEFAULT_CONFIG).model_dump(mode="json")
    assert shown["run"]["name"] == "default" and shown["model"]["source"] == "smollm2-gguf"
    assert cli.main(["config", "show", "pipeline.steps=3"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["pipeline"]["steps"] == 3


def test_run_uses_the_same_default(monkeypatch):
    seen = {}

    def fake_launch(cfg, **kw):
        seen["cfg"] = cfg
        raise SystemExit(0)

    monkeypatch.setattr("compassplay.commands.launch.launch_run", fake_launch)
    with pytest.raises(SystemExit):
        cli.main(["run"])
    assert seen["cfg"] == load_config(cli.DEFAULT_CONFIG)


def test_version(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"compassplay {version('compassplay')}"
