"""LeanRepl against the stand-in REPL, verdicts on recorded REPL responses, statement checks."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest

from compassplay.verifiers.lean.repl import (
    LeanCrash,
    LeanMemory,
    LeanProtocolError,
    LeanRepl,
    LeanTimeout,
    check_statement_preserved,
    elaborates_with_sorry,
    lean_verdict,
    parse_messages,
)

FAKE = [sys.executable, str(Path(__file__).parents[1] / "fake_lean_repl.py")]
FIXTURES = Path(__file__).parents[1] / "fixtures" / "lean"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# ----------------------------------------------------------------------------- fixtures
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_verdicts_on_recorded_repl_responses(name: str) -> None:
    resp = json.loads((FIXTURES / name).read_text())
    want = EXPECTED[name]
    v = lean_verdict(resp)
    assert (v.accepted, v.status, v.sorries) == (want["accepted"], want["status"], want["sorries"])
    assert v.accepted == (v.status == "accepted")
    assert bool(v.errors) == (want["status"] in ("error", "repl_error", "sorry"))


def test_fixture_verdict_accuracy_is_total() -> None:
    hits = sum(lean_verdict(json.loads((FIXTURES / n).read_text())).status == e["status"]
               for n, e in EXPECTED.items())
    print(f"verdict accuracy on {len(EXPECTED)} recorded responses: {hits}/{len(EXPECTED)}")
    assert hits == len(EXPECTED) >= 10


def test_parse_messages_reads_positions_and_multiline_data() -> None:
    msgs = parse_messages(json.loads((FIXTURES / "error_type_mismatch.json").read_text()))
    assert len(msgs) == 1 and msgs[0].severity == "error"
    assert msgs[0].pos == (1, 23) and msgs[0].end_pos == (1, 26)
    assert msgs[0].data.startswith("type mismatch\n  rfl")
    assert str(msgs[0]).startswith("1:23: error: type mismatch")


def test_sorry_helpers() -> None:
    load = lambda n: json.loads((FIXTURES / n).read_text())  # noqa: E731
    assert elaborates_with_sorry(load("sorry_tactic.json"))
    assert elaborates_with_sorry(load("sorry_term_warning_only.json"))
    assert not elaborates_with_sorry(load("error_with_sorry.json"))
    assert not elaborates_with_sorry(load("accepted_decide.json"))
    assert not elaborates_with_sorry(load("unknown_environment.json"))
    # Newer Lean quotes with backticks.
    v = lean_verdict({"env": 1, "messages": [{"severity": "warning",
                                              "data": "declaration uses `sorry`"}]})
    assert v.status == "sorry" and not v.accepted


def test_bad_responses_give_clear_answers() -> None:
    with pytest.raises(TypeError, match="dict"):
        lean_verdict("{}")  # type: ignore[arg-type]
    assert lean_verdict({"weird": 1}).status == "protocol"
    with pytest.raises(ValueError, match="malformed REPL message"):
        lean_verdict({"env": 0, "messages": ["oops"]})


# ----------------------------------------------------------------------------- statements
def test_statement_preserved() -> None:
    target = "theorem add_zero' (n : ℕ) : n + 0 = n := by sorry"
    assert check_statement_preserved(target, "theorem add_zero' (n : ℕ) : n + 0 = n := by simp")
    assert check_statement_preserved(
        target, "lemma helper : True := trivial\n\ntheorem add_zero'  (n : ℕ) :\n"
                "    n + 0 = n := by -- comment\n  simp")
    assert check_statement_preserved("theorem t (h : a = b) : b = a", "theorem t (h : a = b) : "
                                      "b = a := by\n  exact h.symm")
    # Weakened statement, renamed theorem, or stated twice: rejected.
    assert not check_statement_preserved(target, "theorem add_zero' (n : ℕ) : True := trivial")
    assert not check_statement_preserved(target, "theorem other (n : ℕ) : n + 0 = n := by simp")
    assert not check_statement_preserved(target, "theorem add_zero' (n : ℕ) : n + 0 = n := by "
                                         "simp\ntheorem add_zero' : True := trivial")
    with pytest.raises(ValueError, match="no a theorem"):
        check_statement_preserved("def f := 1", "theorem t : True := trivial")
    with pytest.raises(TypeError):
        check_statement_preserved(None, "x")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- live client
def test_repl_header_env_reuse_and_judging() -> None:
    with LeanRepl(FAKE, timeout_s=10) as repl:
        head = repl.send({"cmd": "import Mathlib"})
        assert head == {"env": 0}
        ok = repl.send({"cmd": "theorem t : 1 + 1 = 2 := by decide", "env": 0})
        assert lean_verdict(ok).accepted
        s = repl.send({"cmd": "theorem z (n : ℕ) : n + 0 = n := by sorry", "env": 0})
        assert lean_verdict(s).status == "sorry" and s["sorries"][0]["goal"] == "⊢ n + 0 = n"
        bad = repl.send({"cmd": "theorem f : 1 = 2 := by exact foo", "env": 0})
        assert lean_verdict(bad).status == "error"
        assert lean_verdict(repl.send({"cmd": "#check 1", "env": 77})).errors == \
            ["Unknown environment."]
        # A multi-line reply arriving in many small pieces, then the next one intact.
        chunked = repl.send({"cmd": "theorem z : 3 = 3 := by sorry -- FAKE_CHUNKED", "env": 0})
        assert lean_verdict(chunked).status == "sorry" and chunked["env"] == 4
        assert lean_verdict(repl.send({"cmd": "theorem q : 1 = 1 := rfl", "env": 0})).accepted


def test_fake_replies_span_several_lines() -> None:
    import subprocess

    out = subprocess.run(FAKE, input='{"cmd": "theorem z : 1 = 1 := by sorry"}\n\n',
                         capture_output=True, text=True, timeout=10).stdout
    block = out.split("\n\n")[0]
    assert block.count("\n") > 5 and json.loads(block)["sorries"][0]["goal"] == "⊢ 1 = 1"


def test_repl_timeout_off_the_main_thread_kills_the_group() -> None:
    out: dict = {}

    def worker() -> None:
        repl = LeanRepl(FAKE, timeout_s=0.5)
        out["pid"] = repl.pid
        t0 = time.monotonic()
        try:
            repl.send({"cmd": "FAKE_HANG"})
        except LeanTimeout as exc:
            out["exc"], out["took"] = exc, time.monotonic() - t0
        repl.close()

    th = threading.Thread(target=worker)
    th.start()
    th.join(10)
    assert isinstance(out.get("exc"), LeanTimeout) and 0.4 < out["took"] < 3
    assert not _alive(out["pid"])


def test_repl_failure_modes() -> None:
    with LeanRepl(FAKE, timeout_s=10) as repl:
        with pytest.raises(LeanCrash, match="code 134.*PANIC"):
            repl.send({"cmd": "FAKE_CRASH"})
    with LeanRepl(FAKE, timeout_s=10) as repl:
        with pytest.raises(LeanProtocolError, match="not JSON"):
            repl.send({"cmd": "FAKE_GARBAGE"})
        assert not repl.alive()
    with LeanRepl(FAKE, timeout_s=10, max_reply_bytes=100_000) as repl:
        assert len(repl.send({"cmd": "FAKE_HUGE:50000"})["messages"][0]["data"]) == 50000
        with pytest.raises(LeanProtocolError, match="exceeds 100000 bytes"):
            repl.send({"cmd": "FAKE_HUGE:3000000"})
    with LeanRepl(FAKE, timeout_s=20, memory_mb=300) as repl:
        with pytest.raises(LeanMemory, match="MemoryError"):
            repl.send({"cmd": "FAKE_OOM"})
    with LeanRepl(FAKE, timeout_s=20, rss_limit_mb=120) as repl:
        with pytest.raises(LeanMemory, match="RSS above 120 MiB"):
            repl.send({"cmd": "FAKE_GROW:200 FAKE_SLOW:5 theorem t : 1 = 1 := rfl"})


def test_repl_bad_input() -> None:
    with pytest.raises(TypeError, match="list of str"):
        LeanRepl("lake env repl")  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError, match="project directory"):
        LeanRepl(FAKE, cwd="/nonexistent/lean/project")
    with LeanRepl(FAKE) as repl:
        with pytest.raises(TypeError, match="JSON object"):
            repl.send("theorem t : True := trivial")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="no 'cmd'"):
            repl.send({"env": 0})
