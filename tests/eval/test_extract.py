"""Answer extraction from CRUXEval-style replies."""

from __future__ import annotations

from compassplay.eval.evaluator import cut_at_stop
from compassplay.eval.extract import crux_input_call, crux_output


def test_crux_output_forms():
    assert crux_output("[ANSWER]\nassert f(17) == 17\n[/ANSWER]") == "17"
    assert crux_output("assert f('a == b') == 'x == y'") == "'x == y'"
    assert crux_output("```python\nassert f(1) == [1, 2]\n```\nbecause...") == "[1, 2]"
    assert crux_output("'abc'\nmore text") == "'abc'"
    assert crux_output("") == ""


def test_crux_input_forms():
    assert crux_input_call("assert f([1, 2]) == 3") == "f([1, 2])"
    assert crux_input_call("[ANSWER]\nassert f('a', 'b') == 'ab'\n[/ANSWER]") == "f('a', 'b')"
    assert crux_input_call("'a', 'b'") == "f('a', 'b')"
    assert crux_input_call("f(1) + f(2)") == "f(f(1) + f(2))"  # one call only
    assert crux_input_call("g(3)", fn="g") == "g(3)"


def test_cut_at_stop():
    assert cut_at_stop("assert f(1) == 2\n[/ANSWER]", ["[/ANSWER]"]) == "assert f(1) == 2\n"
    assert cut_at_stop("    return 1\ndef g", ["\ndef ", "\n#"]) == "    return 1"
    assert cut_at_stop("abc", []) == "abc"


def test_several_assertions_pick_the_one_about_this_item():
    echo = ("assert f(17) == 17\nassert f(\"x9j\") == ??\nassert f([1, 2]) == [2, 1]\n")
    assert crux_output(echo, call="f([1,2])") == "[2, 1]"
    assert crux_output(echo) == "17"  # no target: the first one
    assert crux_input_call(echo, output="[2,1]") == "f([1, 2])"
    assert crux_input_call("assert f(??) == 3\nassert f(4) == 3", output="3") == "f(4)"
