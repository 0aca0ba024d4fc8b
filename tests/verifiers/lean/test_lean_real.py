"""The same checks against real Lean 4 + leanprover-community/repl (skipped without them).

To run it (needs a few GB of disk and network for the Mathlib cache):

    curl https://elan.lean-lang.org/elan-init.sh -sSf | sh -s -- -y --default-toolchain none
    git clone --depth 1 --branch v4.19.0 https://github.com/leanprover-community/repl ~/lean/repl
    (cd ~/lean/repl && lake build) && ln -s ~/lean/repl/.lake/build/bin/repl ~/.local/bin/repl
    git clone --depth 1 --branch v4.19.0 https://github.com/leanprover-community/mathlib4 \
        ~/lean/mathlib4 && (cd ~/lean/mathlib4 && lake exe cache get)
    LEAN_PROJECT_DIR=~/lean/mathlib4 pytest -q tests/verifiers/lean/test_lean_real.py

Use the same tag for repl and mathlib4 (both follow Lean's version tags). Optional:
LEAN_REPL_COMMAND (default "lake env repl"), LEAN_TEST_HEADER (default "import Mathlib").
"""

from __future__ import annotations

import os
import shlex
import shutil

import pytest

from compassplay.verifiers.lean.repl import LeanRepl, lean_verdict
from compassplay.verifiers.lean.repl_pool import LeanCheck, LeanPool

PROJECT = os.path.expanduser(os.environ.get("LEAN_PROJECT_DIR", ""))
COMMAND = shlex.split(os.environ.get("LEAN_REPL_COMMAND", "lake env repl"))
HEADER = os.environ.get("LEAN_TEST_HEADER", "import Mathlib")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which(COMMAND[0]) is None or not os.path.isdir(PROJECT),
                       reason="needs `lake` on PATH and LEAN_PROJECT_DIR (see module docstring)"),
]


def test_real_repl_protocol_and_verdicts() -> None:
    with LeanRepl(COMMAND, cwd=PROJECT, timeout_s=600) as repl:
        head = repl.send({"cmd": HEADER})
        assert isinstance(head.get("env"), int), head
        env = head["env"]
        ok = repl.send({"cmd": "theorem t : 1 + 1 = 2 := by decide", "env": env}, 120)
        assert lean_verdict(ok).status == "accepted", ok
        s = repl.send({"cmd": "theorem z (n : Nat) : n + 0 = n := by sorry", "env": env}, 120)
        assert lean_verdict(s).status == "sorry" and lean_verdict(s).sorries == 1, s
        bad = repl.send({"cmd": "theorem f : 1 = 2 := by decide", "env": env}, 120)
        assert lean_verdict(bad).status == "error", bad
        assert lean_verdict(repl.send({"cmd": "#check 1", "env": 10_000})).status == "repl_error"


def test_real_pool() -> None:
    with LeanPool(COMMAND, cwd=PROJECT, processes=2, timeout_s=120) as pool:
        target = "theorem add_z (n : Nat) : n + 0 = n := by sorry"
        verdicts = pool.check_many([
            LeanCheck("theorem add_z (n : Nat) : n + 0 = n := by simp", HEADER, target),
            LeanCheck("theorem add_z (n : Nat) : True := trivial", HEADER, target),
            LeanCheck("theorem w : (2 : Nat) ≤ 3 := by norm_num", HEADER),
        ])
        assert [v.status for v in verdicts] == ["accepted", "statement_changed", "accepted"]
