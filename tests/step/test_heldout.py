"""SOAR's held-out problems: sources, graders, and disjointness from the reference set."""

from __future__ import annotations

import json

import pytest

from compassplay.config import load_config
from compassplay.models import load_model
from compassplay.rewards.soar import check_disjoint
from compassplay.step.heldout import final_answer, jsonl_heldout, make_heldout
from compassplay.workers.builders import make_env, make_reference


@pytest.fixture(scope="module")
def tok():
    return load_model(load_config(None).model, seed=0)[1]


def test_final_answer():
    assert final_answer("so x = \\boxed{\\frac{1}{2}}.") == "\\frac{1}{2}"
    assert final_answer("24 - 18 = 6. The answer is 6.") == "6"
    assert final_answer("we get 3 then 41") == "41"
    assert final_answer("no digits") == ""


def test_jsonl_items_grade_their_final_answer(tmp_path, tok):
    p = tmp_path / "held.jsonl"
    p.write_text(json.dumps({"prompt": "2+2?", "solution": "2+2=4. The answer is 4."}) + "\n"
                 + json.dumps({"prompt": "1/2?", "solution": "half", "answer": "$1/2$"}) + "\n")
    a, b = jsonl_heldout(str(p), tok, 8)
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    assert a.grade(enc("The answer is 4")) and not a.grade(enc("The answer is 5"))
    assert b.grade(enc("\\boxed{1/2}")) and not b.grade(enc("half"))
    assert jsonl_heldout(str(p), tok, 1)[0].example == a.example


def test_reference_set_as_held_out_is_an_error(tok):
    cfg = load_config(None, ["reward.kind=soar", "reward.soar_heldout=reference_math.jsonl"])
    held = make_heldout(cfg, make_env(cfg, None), tok)
    with pytest.raises(ValueError, match="overlaps the reference set"):
        check_disjoint(make_reference(cfg, tok), [h.example for h in held])
    # the paper configs' reference (MATH) and the default one share no problem
    cfg2 = load_config(None, ["reward.kind=soar",
                              "reward.soar_heldout=reference_math_paper32.jsonl"])
    check_disjoint(make_reference(cfg2, tok),
                   [h.example for h in make_heldout(cfg2, make_env(cfg2, None), tok)])


def test_seed_items_are_the_held_out_seeds_as_deduction(tok):
    cfg = load_config(None, ["reward.kind=soar", "reward.soar_heldout_items=2"])
    env = make_env(cfg, None)
    items = make_heldout(cfg, env, tok)
    assert len(items) == 2
    for it, task in zip(items, env.heldout, strict=True):
        right = tok.encode(env.gold_answer_text(task.model_copy(
            update={"task_type": "deduction"})), add_special_tokens=False)
        assert it.grade(right) and not it.grade(tok.encode("```output\n'nope'\n```",
                                                           add_special_tokens=False))


def test_bootstrap_examples_leave_the_held_out_seeds_out(tok):
    import random

    from compassplay.warmup.bootstrap import examples

    cfg = load_config(None, ["reward.kind=soar", "reward.soar_heldout_items=4"])
    held = make_heldout(cfg, make_env(cfg, None), tok)
    exs = examples(cfg, tok, random.Random(0))
    rendered = {tuple(e.prompt) for e in exs}
    assert not any(tuple(h.example.prompt_ids) in rendered for h in held)
    plain = {tuple(e.prompt) for e in examples(load_config(None), tok, random.Random(0))}
    assert any(tuple(h.example.prompt_ids) in plain for h in held)  # they would be there
