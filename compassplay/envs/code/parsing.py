"""Robust extraction of fenced blocks and `<think>/<answer>` sections from model text.

Nothing here raises on model text: every function returns either a value or a failure reason
(a short string such as `no_input_block`), which callers count.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([A-Za-z0-9_+-]*)[^\n]*$", re.MULTILINE)
_ANSWER = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.DOTALL)
_THINK_CLOSE = "</think>"

CODE_TAGS = ("python", "py", "python3")


@dataclass
class Block:
    """A fenced block: its info-string tag (lowercased) and body; `closed` is False when the
    text ended before the closing fence."""

    tag: str
    body: str
    closed: bool = True


def fenced_blocks(text: str) -> list[Block]:
    """All fenced blocks in order. An opening fence closes on the same fence characters."""
    blocks: list[Block] = []
    pos = 0
    while True:
        m = _FENCE.search(text, pos)
        if m is None:
            return blocks
        fence, tag = m.group(1), m.group(2).lower()
        start = m.end() + 1
        close = re.compile(r"^[ \t]*" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}[ \t]*$",
                           re.MULTILINE)
        c = close.search(text, min(start, len(text)))
        if c is None:
            blocks.append(Block(tag, text[start:].strip("\n"), closed=False))
            return blocks
        blocks.append(Block(tag, text[start:c.start()].strip("\n")))
        pos = c.end()


def answer_section(text: str) -> tuple[str, str]:
    """The content of the last `<answer>...</answer>` (reason '' on success).

    An answer that is opened but never closed counts as `unclosed_answer`."""
    if "<answer>" not in text:
        return "", "no_answer_tag"
    tail = text[text.rfind("<answer>"):]
    m = _ANSWER.match(tail)
    if m is None:  # pragma: no cover - the regex always matches from '<answer>'
        return "", "no_answer_tag"
    if "</answer>" not in tail:
        return "", "unclosed_answer"
    body = m.group(1).strip()
    return body, "" if body else "empty_answer"


def strip_think(text: str) -> str:
    """Text after the last `</think>` (the whole text when there is none)."""
    i = text.rfind(_THINK_CLOSE)
    return text[i + len(_THINK_CLOSE):] if i >= 0 else text


def find_blocks(text: str, tags: tuple[str, ...]) -> list[Block]:
    """Closed blocks whose tag is one of `tags` ('' matches an untagged block)."""
    return [b for b in fenced_blocks(text) if b.tag in tags and b.closed]


def extract_block(text: str, tags: tuple[str, ...], kind: str,
                  untagged_ok: bool = True) -> tuple[str, str]:
    """The last block tagged with one of `tags` (or, failing that and when allowed, the last
    untagged block). Returns (body, reason)."""
    blocks = fenced_blocks(text)
    tagged = [b for b in blocks if b.tag in tags]
    pool = tagged or ([b for b in blocks if b.tag == ""] if untagged_ok else [])
    if not pool:
        return "", f"no_{kind}_block"
    block = pool[-1]
    if not block.closed:
        return "", f"unclosed_{kind}_block"
    if not block.body.strip():
        return "", f"empty_{kind}"
    return block.body, ""


def solver_answer(text: str, kind: str, answer_format: str) -> tuple[str, str]:
    """The solver's answer of `kind` ('output', 'input' or 'code') from a completion.

    fenced: the last ```output / ```input / ```python block. think_answer: the content of the
    last <answer> tag, itself unwrapped from a fence when it contains one.
    """
    tags = CODE_TAGS if kind == "code" else (kind,)
    if answer_format == "think_answer":
        body, reason = answer_section(text)
        if reason:
            return "", reason
        if "```" in body or "~~~" in body:
            inner, r = extract_block(body, tags, kind)
            return (inner, "") if not r else ("", r)
        return body, ""
    return extract_block(text, tags, kind)


def proposal_section(text: str, answer_format: str) -> tuple[str, str]:
    """The part of a proposal completion that holds its blocks (the <answer> in think mode)."""
    if answer_format == "think_answer":
        return answer_section(text)
    return strip_think(text), ""
