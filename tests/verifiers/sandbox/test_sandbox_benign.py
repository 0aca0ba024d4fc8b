"""Benign CRUXEval-style programs produce exactly the expected output; API behaviour."""

from __future__ import annotations

import logging

import pytest

from compassplay.verifiers.sandbox import isolation
from compassplay.verifiers.sandbox.pool import (
    UNSAFE_OPT_OUT,
    PythonSandbox,
    SandboxUnavailableError,
)

CRUX = [
    ("def f(text):\n    return ''.join(reversed(text.split()))\nprint(repr(f('a bc d')))",
     "'dbca'\n"),
    ("def f(nums):\n    out = {}\n    for n in nums:\n        out[n % 3] = out.get(n % 3, 0) + n\n"
     "    return sorted(out.items())\nprint(f([1, 2, 3, 4, 5, 6]))", "[(0, 9), (1, 5), (2, 7)]\n"),
    ("def f(s, ch):\n    return s.count(ch), s.find(ch), s.rfind(ch)\nprint(f('banana', 'a'))",
     "(3, 1, 5)\n"),
    ("from collections import Counter\ndef f(xs):\n    return Counter(xs).most_common(2)\n"
     "print(f('abracadabra'))", "[('a', 5), ('b', 2)]\n"),
    ("import itertools\nprint(list(itertools.accumulate([3, 1, 4, 1, 5], max)))",
     "[3, 3, 4, 4, 5]\n"),
    ("def f(d):\n    return {v: k for k, v in d.items()}\nprint(f({'a': 1, 'b': 2}))",
     "{1: 'a', 2: 'b'}\n"),
    ("def f(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n"
     "print(f(90))", "2880067194370816120\n"),
    ("import re\nprint(re.sub(r'(\\d+)', lambda m: str(int(m.group()) * 2), 'a1b22c'))",
     "a2b44c\n"),
    ("def f(xs):\n    xs.sort(key=lambda t: (-t[1], t[0]))\n    return xs\n"
     "print(f([('b', 2), ('a', 2), ('c', 3)]))", "[('c', 3), ('a', 2), ('b', 2)]\n"),
    ("import math, json, heapq\nh = [5, 1, 4]\nheapq.heapify(h)\n"
     "print(json.dumps({'g': math.gcd(12, 18), 'h': heapq.nsmallest(2, h)}))",
     '{"g": 6, "h": [1, 4]}\n'),
    ("import subprocess, decimal, fractions\nprint(fractions.Fraction(1, 3) + 1,"
     " decimal.Decimal('1.10') * 2)", "4/3 2.20\n"),
    ("print('héllo ✓', end='')", "héllo ✓"),
    ("import sys\nprint('to err', file=sys.stderr)\nprint(input.__name__)", "input\n"),
]


@pytest.mark.parametrize("code,expected", CRUX, ids=[f"crux{i}" for i in range(len(CRUX))])
def test_crux_style_programs(sandbox: PythonSandbox, code: str, expected: str) -> None:
    r = sandbox.run(code)
    assert (r.status, r.stdout, r.exit_code) == ("ok", expected, 0), r
    assert r.duration_s < 1.0


def test_run_many_keeps_input_order(sandbox: PythonSandbox) -> None:
    codes = [f"import time\ntime.sleep({(7 - i) % 4} * 0.01)\nprint({i})" for i in range(24)]
    codes[5] = "raise ValueError('boom')"
    rs = sandbox.run_many(codes)
    assert [r.stdout for i, r in enumerate(rs) if i != 5] == [f"{i}\n" for i in range(24) if i != 5]
    assert rs[5].status == "error" and "ValueError: boom" in rs[5].stderr
    assert "sandbox_worker" not in rs[5].stderr


def test_errors_and_exit_codes(sandbox: PythonSandbox) -> None:
    assert sandbox.run("1/0").status == "error"
    assert sandbox.run("def f(:\n").status == "error"
    r = sandbox.run("import sys\nsys.exit('bad')")
    assert (r.status, r.exit_code, r.stderr) == ("error", 1, "bad\n")
    with pytest.raises(TypeError):
        sandbox.run(b"print(1)")  # type: ignore[arg-type]


def test_stats_track_runs(sandbox: PythonSandbox) -> None:
    before = sandbox.stats.snapshot()
    sandbox.run_many(["print(1)", "1/0", "print(2)"])
    after = sandbox.stats.snapshot()
    assert after["runs_total"] - before["runs_total"] == 3
    assert after["counts"]["error"] - before["counts"]["error"] == 1
    assert after["counts"]["ok"] - before["counts"]["ok"] == 2
    assert after["queue_depth"] == 0 and after["latency_s"]["p50"] > 0


def test_refuses_without_bubblewrap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(isolation.shutil, "which", lambda name: None)
    with pytest.raises(SandboxUnavailableError, match="apt-get install -y bubblewrap"):
        PythonSandbox(workers=1).start()


def test_refuses_unknown_isolation() -> None:
    with pytest.raises(ValueError, match=UNSAFE_OPT_OUT):
        PythonSandbox(isolation="none")


def test_unsafe_opt_out_is_loud(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        with PythonSandbox(workers=1, timeout_s=1.0, isolation=UNSAFE_OPT_OUT) as sb:
            assert sb.run("print(6 * 7)").stdout == "42\n"
            assert sb.run("while True:\n    pass").status == "timeout"
    assert any("UNSAFE" in rec.getMessage() and "WITHOUT OS isolation" in rec.getMessage()
               for rec in caplog.records)
