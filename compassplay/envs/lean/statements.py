"""Lean statement text: parsing a conjecture from a reply, a solver's proof, alpha-normalisation.

A *statement* here is a theorem header without its proof, normalised as
`lean_messages.declaration_header` does (comments dropped, whitespace collapsed, `lemma` ->
`theorem`), e.g. "theorem t (n : ℕ) (h₀ : 0 < n) : n ≠ 0".

`alpha_normal(statement)` renames the theorem to `_` and every bound name (binder groups
`(a b : T)`, `{..}`, `[..]`, `⦃..⦄`, and the names after ∀ ∃ ∃! fun λ ∑ ∏) to x0, x1, ... in
order of first binding, so two statements equal up to renaming of bound variables and
hypotheses have equal normal forms (the rename-rate metric).
"""

from __future__ import annotations

import re

from compassplay.verifiers.lean.responses import declaration_header

IDENT = r"[^\W\d][\w'!?]*"
_DECLARES = re.compile(r"\b(theorem|lemma)\b")
_FENCE = re.compile(r"```[ \t]*(lean4?|)[ \t]*\n(.*?)(?:```|\Z)", re.S)
_GROUP = re.compile(rf"[(\{{\[⦃]\s*((?:{IDENT}\s+)*{IDENT})\s*:(?!=)")
_QUANT = re.compile(rf"(?:∀|∃!?|\bfun\b|λ|∑|∏)\s*((?:{IDENT}\s*)+?)\s*(?=[,:]|=>|↦|∈|\bin\b)")
_DECL_NAME = re.compile(r"^theorem\s+\S+")
# Commands and attributes that can make Lean accept a false statement, or run code while
# checking: never allowed in a conjecture or an attempt (status 'banned_<word>').
BANNED = ("axiom", "admit", "native_decide", "implemented_by", "extern", "unsafe", "opaque",
          "debug.skipKernelTC", "run_cmd", "run_tac", "elab", "macro", "syntax", "#eval",
          "local instance", "csimp", "ofReduceBool")
_BANNED = re.compile("|".join(rf"(?<![\w.]){re.escape(w)}(?![\w])" for w in BANNED))


def banned_word(code: str) -> str:
    """The first banned word in `code` ('' if none; comments are not exempt)."""
    m = _BANNED.search(code)
    return m.group(0) if m else ""


def lean_block(text: str) -> tuple[str, str]:
    """(code, '') from the reply's final answer: the last ```lean block that declares a theorem
    or lemma, else the last non-empty one (provers such as DeepSeek-Prover-V2 write a plan with
    code snippets first and the whole proof last); the whole text when it has no fence but
    declares a theorem; ('', reason) otherwise."""
    bodies = [m.group(2) for m in _FENCE.finditer(text)]
    if bodies:
        declaring = [b for b in bodies if _DECLARES.search(b)]
        filled = [b for b in bodies if b.strip()]
        return (declaring or filled or [""])[-1], "" if filled else "empty_block"
    if _DECLARES.search(text):
        return text, ""
    return "", "no_lean_block"


def parse_statement(code: str) -> tuple[str, str]:
    """(normalised statement header, '') of the first theorem/lemma in `code`; else
    ('', reason) with reason 'no_theorem' or 'no_assign' (no `:=` after the statement)."""
    try:
        _, header = declaration_header(code)
    except ValueError as exc:
        return "", "no_assign" if "has no ':='" in str(exc) else "no_theorem"
    if ":" not in _DECL_NAME.sub("", header):
        return "", "no_type"
    return header, ""


def rename(statement: str, name: str) -> str:
    """`statement` with its theorem renamed to `name`."""
    return _DECL_NAME.sub(f"theorem {name}", statement, count=1)


def signature(statement: str) -> str:
    """The statement without `theorem NAME` (binders and conclusion only)."""
    return _DECL_NAME.sub("", statement, count=1).strip()


def bound_names(statement: str) -> list[str]:
    """Names bound in `statement`, in order of first binding."""
    found: list[tuple[int, str]] = []
    for rx in (_GROUP, _QUANT):
        for m in rx.finditer(statement):
            names = m.group(1).split()
            found += [(m.start(1) + i, n) for i, n in enumerate(names)]
    out: list[str] = []
    for _, n in sorted(found):
        if n not in out and n != "_":
            out.append(n)
    return out


def alpha_normal(statement: str) -> str:
    """The statement with its name and bound names canonicalised (see module docstring)."""
    text = " ".join(signature(statement).split())
    mapping = {n: f"x{i}" for i, n in enumerate(bound_names(text))}
    if not mapping:
        return text
    rx = re.compile(rf"(?<![\w.'])({'|'.join(re.escape(n) for n in sorted(mapping, key=len, reverse=True))})(?![\w'!?])")
    return rx.sub(lambda m: mapping[m.group(1)], text)
