"""Huge pages for torch's large CPU tensors (`compassplay.host_memory`): set by default where
the kernel honours them, never over a value the user set, and effective in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from compassplay.host_memory import ENV, prefer_huge_pages, thp_mode

# A fresh process: the default applied (or not), then 64 MB allocated and written.
_PROBE = """
import json, os, resource, sys
from compassplay.host_memory import prefer_huge_pages
if sys.argv[1] == "default":
    prefer_huge_pages()
import torch
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
torch.empty(16 << 20).fill_(1.0)
print(json.dumps({"faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before,
                  "env": os.environ.get("THP_MEM_ALLOC_ENABLE")}))
"""


def _probe(mode: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True,
                         env=env, timeout=120, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_the_mode_is_the_bracketed_word(tmp_path):
    f = tmp_path / "enabled"
    f.write_text("always [madvise] never\n")
    assert thp_mode(f) == "madvise"
    f.write_text("always madvise [never]\n")
    assert thp_mode(f) == "never"
    assert thp_mode(tmp_path / "missing") is None


def test_a_value_already_set_is_kept():
    env = {ENV: "0"}
    assert prefer_huge_pages(env) is False and env == {ENV: "0"}


@pytest.mark.skipif(thp_mode() not in ("always", "madvise"),
                    reason="the kernel has no transparent huge pages to ask for")
def test_the_default_cuts_the_page_faults_of_a_large_tensor():
    """64 MB is 16,384 pages of 4 KiB: without huge pages each is a fault (the kernel in
    `always` mode may already use some), with them a few dozen 2 MB ones."""
    plain, default = _probe("plain"), _probe("default")
    assert default["env"] == "1" and plain["env"] is None
    assert default["faults"] * 10 < 16384, default
    if thp_mode() == "madvise":  # without the hint the kernel keeps 4 KiB pages
        assert plain["faults"] > 16384 * 0.9, plain


def test_the_cli_sets_it_before_torch_is_imported():
    source = (Path(__file__).parents[1] / "compassplay" / "cli.py").read_text()
    body = source.split("def main(")[1]
    assert body.index("prefer_huge_pages()") < body.index("parse_args")
    code = ("import sys; import compassplay.cli; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.strip()
    assert out == "False"  # the CLI module itself allocates no tensor before main runs
