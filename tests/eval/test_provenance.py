"""What a results JSON records: versions, commit, hashes, prompt version; the renamed
benchmark; the exit code when nothing was evaluated."""

from __future__ import annotations

import hashlib
import json
import subprocess

import pytest

from compassplay.cli import main
from compassplay.eval import eval_prompts
from compassplay.eval.benchmarks import check_name, parse_names
from compassplay.eval.provenance import file_sha256, git_commit, package_versions


def test_versions_and_hashes(tmp_path):
    v = package_versions()
    assert v["torch"] and v["transformers"] and v["compassplay"]
    assert "vllm" not in v or v["vllm"]
    f = tmp_path / "d.jsonl"
    f.write_bytes(b"abc\n")
    assert file_sha256(f) == hashlib.sha256(b"abc\n").hexdigest()


def test_git_commit_in_and_outside_a_checkout(tmp_path):
    pkg = tmp_path / "repo" / "compassplay"
    pkg.mkdir(parents=True)
    (pkg.parent / "pyproject.toml").write_text("")
    assert git_commit(pkg) is None  # no repository
    git = ["git", "-C", str(pkg.parent), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert git_commit(pkg) == head
    (pkg.parent / "pyproject.toml").write_text("changed")
    assert git_commit(pkg) == head + "-dirty"
    (pkg.parent / "pyproject.toml").unlink()  # not a source checkout (an installed package)
    assert git_commit(pkg) is None


def test_prompt_version_pins_the_prompt_text():
    assert eval_prompts.PROMPT_VERSION == "1"
    digest = eval_prompts.prompt_sha256()
    assert len(digest) == 64
    old = eval_prompts.MATH
    try:
        eval_prompts.MATH = old + " "
        assert eval_prompts.prompt_sha256() != digest
    finally:
        eval_prompts.MATH = old


def test_livecodebench_is_renamed():
    assert parse_names("livecodebench-exec") == ["livecodebench-exec"]
    for fn in (check_name, parse_names):
        with pytest.raises(ValueError, match="'livecodebench-exec'"):
            fn("livecodebench")


def test_cli_old_name_errors_and_all_skipped_exits_1(tmp_path, capsys):
    assert main(["eval", "--model", "tiny", "--benchmarks", "livecodebench"]) == 2
    assert "livecodebench-exec" in capsys.readouterr().err
    p = tmp_path / "p.jsonl"
    p.write_text(json.dumps({"id": "0", "prediction": "1"}) + "\n")
    assert main(["eval", "--predictions", str(p), "--benchmark", "livecodebench",
                 "--data-dir", str(tmp_path)]) == 2
    assert "livecodebench-exec" in capsys.readouterr().err
    # no data for any benchmark: exit 1 before generating, naming what was looked for
    assert main(["eval", "--model", "tiny", "--benchmarks", "cruxeval-o,math500",
                 "--data-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "every benchmark" in err and str(tmp_path / "cruxeval.jsonl") in err
