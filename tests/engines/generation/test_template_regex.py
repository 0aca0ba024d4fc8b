"""The regex of a template (`template_regex`, for vLLM's structured outputs) against the
`TemplateCursor` it stands for: over characters (one token per character, as the cursor tests
in test_templating.py use a byte tokenizer), the replies a cursor produces match it, and a
text matches it exactly when a cursor without caps would accept it character by character."""

from __future__ import annotations

import random
import re
import time

import pytest

from compassplay.config import TaskSection
from compassplay.engines.generation.base import Segment
from compassplay.engines.generation.template_regex import template_regex
from compassplay.engines.generation.templating import TemplateCursor
from compassplay.envs.code import CodeEnvironment

ALPHABET = "`\n a=1(x):+\tbEND;"  # fences, newlines, ordinary characters, other stops


def _env() -> CodeEnvironment:
    # templates and parsing never run code: no runner needed
    return CodeEnvironment(TaskSection(seed_file="simple"), None, seed=0)  # type: ignore[arg-type]


def _code_templates(max_tokens: int) -> dict[tuple[str, str], tuple[Segment, ...]]:
    env = _env()
    return {(role, tt): env.response_template(role, tt, max_tokens)
            for role in ("proposer", "solver") for tt in ("deduction", "abduction", "induction")}


def _cursor(template) -> TemplateCursor:
    return TemplateCursor(template, lambda s: [ord(c) for c in s],
                          lambda ids: "".join(map(chr, ids)), None)


def _run(template, rng: random.Random, fence: float = 1.0, newline: float = 1.0) -> str:
    """A reply a cursor produces when the 'model' samples characters of ALPHABET (weight 1
    each, `fence` for a backtick, `newline` for a newline)."""
    weights = [fence, newline] + [1.0] * (len(ALPHABET) - 2)
    c, comp = _cursor(template), []
    while not c.finished:
        tok = c.forced()
        if tok is None:
            banned = set(c.banned())
            choices = [(ch, w) for ch, w in zip(ALPHABET, weights, strict=True)
                       if ord(ch) not in banned]
            tok = ord(rng.choices([ch for ch, _ in choices], [w for _, w in choices])[0])
        comp.append(tok)
        c.advance(comp)
        assert len(comp) < 10_000
    return "".join(map(chr, comp))


def _accepts(template, text: str) -> bool:
    """Whether a cursor would produce `text`, sampling its free characters."""
    c, comp = _cursor(template), []
    for ch in text:
        if c.finished:
            return False
        forced = c.forced()
        if (forced is not None and forced != ord(ch)) or ord(ch) in c.banned():
            return False
        comp.append(ord(ch))
        c.advance(comp)
    return c.finished


def _mutations(text: str, rng: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        i = rng.randrange(len(text) + 1)
        ch = rng.choice(ALPHABET)
        out.append(rng.choice([text[:i] + ch + text[i:], text[:i] + text[i + 1:],
                               text[:i] + ch + text[i + 1:]]))
    return out


@pytest.mark.parametrize("caps", [3, 96])
def test_every_reply_of_a_cursor_over_the_code_templates_matches(caps):
    """Random replies (fence and newline characters frequent), small caps included (the cursor
    then forces the fence on its own line)."""
    rng = random.Random(caps)
    for (role, tt), tpl in _code_templates(caps).items():
        rx = re.compile(template_regex(tpl))
        for fence, newline in ((1, 1), (10, 5)):
            for _ in range(40):
                text = _run(tpl, rng, fence, newline)
                assert rx.fullmatch(text), (role, tt, text)


def test_the_regex_admits_exactly_what_a_cursor_without_caps_accepts():
    """Near misses of cursor replies (one character inserted, removed or replaced): the regex
    and the cursor agree on every one, in both directions."""
    rng = random.Random(0)
    templates = [*_code_templates(10_000).values(),
                 (Segment("END", "!", 10_000, ends=("\n\n", ";")),),
                 (Segment("ab", "", 10_000, ends=("ba",)), Segment("```", "x", 10_000))]
    seen = {True: 0, False: 0}
    for tpl in templates:
        rx = re.compile(template_regex(tpl))
        for _ in range(30):
            reply = _run(tpl, rng, 6, 4)
            for text in [reply, *_mutations(reply, rng, 8)]:
                want = _accepts(tpl, text)
                assert bool(rx.fullmatch(text)) == want, (tpl, text)
                seen[want] += 1
    assert min(seen.values()) > 100  # both kinds were checked


def test_code_env_replies_match_and_parse_and_malformed_ones_do_not():
    env = _env()
    tpl = env.response_template("proposer", "deduction", 96)
    rx = re.compile(template_regex(tpl))
    good = ["x):\n    return x + 1\n```\n```input\n3\n```",
            "x):\n    return x\n\n```\n```input\n[1, 2]\n```"]  # closed at the blank line
    for text in good:
        assert rx.fullmatch(text)
        task = env.parse_proposal("deduction", env.response_prefix("proposer", "deduction")
                                  + text, [], "t")
        assert task.invalid_reason == "", (text, task.invalid_reason)
    # a fence in mid-line closes the block too, as the cursor closes it
    assert rx.fullmatch("x):\n    return x```\n```input\n'a'\n```")
    bad = ["x):\n    return x\n",                                # no closing fence
           "x):\n    return x\n```",                             # no input block
           "```\n```input\n3\n```",                              # empty program block
           "\n```\n```input\n3\n```",                            # empty program block
           "x):\n    return x\n```\n```input\n\n```",            # empty input block
           "x):\n    return x\n```\n```input\n3\n```\nmore",     # text after the end
           "x):\n    return x\n```\n```input\n3\n4\n```",        # a two-line input
           "x):\n    ret```urn x\n```\n```input\n3\n```"]         # a fence inside the program
    for text in bad:
        assert not rx.fullmatch(text), text


def test_the_regex_is_compact_and_xgrammar_compiles_and_agrees():
    """vLLM's default grammar backend reads the same language, quickly."""
    xgr = pytest.importorskip("xgrammar")
    from xgrammar.testing import _is_grammar_accept_string

    env = _env()
    template = env.response_template("proposer", "induction", 96)
    ind = template_regex(template)
    assert len(ind) < 100 * len(template)  # induction_inputs + 1 segments
    t0 = time.perf_counter()
    grammar = xgr.Grammar.from_regex(ind)
    assert time.perf_counter() - t0 < 1.0
    inputs = ["1", "2", "'a'", *map(str, range(3, env.induction_inputs))]
    prefix_free = "\n```\n```input\n".join(inputs) + "\n```\n```message\nadds one\n```"
    rng = random.Random(1)
    for text in [prefix_free, *_mutations(prefix_free, rng, 30)]:
        want = bool(re.fullmatch(ind, text))
        assert _is_grammar_accept_string(grammar, text) == want, text
    assert re.fullmatch(ind, prefix_free)
