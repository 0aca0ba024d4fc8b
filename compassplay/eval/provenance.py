"""What an eval result was made with: package versions, the git commit of the code, data-file
hashes and the prompt version, so two results can be told comparable or not (the fields
lm-evaluation-harness and evalplus record)."""

from __future__ import annotations

import hashlib
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from compassplay.eval import eval_prompts

PACKAGES = ("torch", "transformers", "compassplay")
OPTIONAL_PACKAGES = ("vllm",)
PACKAGE_DIR = Path(__file__).resolve().parents[1]


def package_versions() -> dict[str, str | None]:
    """Installed versions of torch, transformers, compassplay (None if missing) and of vllm
    when it is installed."""
    out: dict[str, str | None] = {}
    for name in PACKAGES + OPTIONAL_PACKAGES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            if name not in OPTIONAL_PACKAGES:
                out[name] = None
    return out


def git_commit(where: Path = PACKAGE_DIR) -> str | None:
    """HEAD's commit hash of the git checkout holding `where` (with '-dirty' when tracked
    files differ from it); None outside a source checkout (an installed wheel in site-packages
    is not the code of whatever repository might enclose it) or without git."""
    if not (where.parent / "pyproject.toml").is_file():
        return None
    try:
        head = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(where), "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True,
                               timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file's bytes (read in 1 MiB blocks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def provenance(dtype: str | None) -> dict[str, Any]:
    """The fields every results JSON carries: versions, git_commit, dtype, prompt version."""
    return {"versions": package_versions(), "git_commit": git_commit(), "dtype": dtype,
            "prompt_version": eval_prompts.PROMPT_VERSION,
            "prompt_sha256": eval_prompts.prompt_sha256()}
