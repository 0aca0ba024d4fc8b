"""The host-side timeout of MathGrader: a hung worker is killed and replaced, from a thread."""

from __future__ import annotations

import threading

from compassplay.eval.eval_records import EvalItem
from compassplay.eval.math_grading import MathGrader
from compassplay.eval.math_worker import check


def test_hung_worker_times_out_and_is_replaced_off_the_main_thread():
    items = [EvalItem("m", str(i), answer="7") for i in range(3)]
    out = {}

    def work() -> None:
        with MathGrader(workers=1, timeout_s=0.5, startup_s=5.0,
                        module="tests.eval.stub_math_worker") as g:
            g.check("7", ["7"])  # warm: the next checks get timeout_s only
            first = g._all[0].proc.pid
            out["grades"] = g.grade(items, ["7", "hang", "7"])
            out["timeouts"] = g.timeouts
            out["replaced"] = g._all[-1].proc.pid != first

    t = threading.Thread(target=work)
    t.start()
    t.join(30)
    assert not t.is_alive()
    assert [g.correct for g in out["grades"]] == [True, False, True]
    assert "timeout" in out["grades"][1].error
    assert out["timeouts"] == 1 and out["replaced"]


def test_check_in_process_without_signals_off_main_thread():
    """`check(timeouts=False)` never touches signals, so it runs in any thread."""
    out = {}
    t = threading.Thread(target=lambda: out.update(r=check("\\boxed{2}", ["2"], timeouts=False)))
    t.start()
    t.join(30)
    assert out["r"] == (True, "2")
