"""Reading leanprover-community/repl responses: messages, sorries, verdicts, statement checks.

A command response looks like
    {"env": 1, "messages": [{"severity": "warning", "pos": {"line": 1, "column": 8},
      "endPos": {"line": 1, "column": 9}, "data": "declaration uses 'sorry'"}],
     "sorries": [{"pos": ..., "endPos": ..., "goal": "⊢ 1 + 1 = 2", "proofState": 0}]}
(empty `messages`/`sorries` may be omitted); an error response is {"message": "..."}, e.g.
{"message": "Unknown environment."}.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

# Statuses a verdict can carry. The first four come from a REPL response (`lean_verdict`), the
# rest from the pool when the process failed (see lean_pool.py); none of them is an exception.
RESPONSE_STATUSES = ("accepted", "sorry", "error", "repl_error")
FAILURE_STATUSES = ("timeout", "crash", "memory", "protocol", "header_error", "statement_changed")
STATUSES = RESPONSE_STATUSES + FAILURE_STATUSES

_SORRY_WARNING = re.compile(r"declaration uses ['`]sorry['`]")


@dataclass(frozen=True)
class LeanMessage:
    """One Lean message; positions are (line, column), lines 1-based, columns 0-based."""

    severity: str
    data: str
    pos: tuple[int, int] | None = None
    end_pos: tuple[int, int] | None = None

    def __str__(self) -> str:
        where = f"{self.pos[0]}:{self.pos[1]}: " if self.pos else ""
        return f"{where}{self.severity}: {self.data}"


@dataclass(frozen=True)
class LeanVerdict:
    """Outcome of one check. `accepted` iff status == "accepted"; `errors` are readable lines."""

    accepted: bool
    status: str
    errors: list[str] = field(default_factory=list)
    sorries: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def failure(cls, status: str, why: str) -> LeanVerdict:
        if status not in FAILURE_STATUSES:
            raise ValueError(f"unknown failure status {status!r}; expected {FAILURE_STATUSES}")
        return cls(False, status, [why], 0)


def _pos(raw: Any) -> tuple[int, int] | None:
    if isinstance(raw, Mapping) and "line" in raw and "column" in raw:
        return int(raw["line"]), int(raw["column"])
    return None


def _check_response(resp: Any) -> Mapping[str, Any]:
    if not isinstance(resp, Mapping):
        raise TypeError(f"a REPL response is a dict, got {type(resp).__name__}")
    return resp


def parse_messages(resp: Mapping[str, Any]) -> list[LeanMessage]:
    """The `messages` of a command response as LeanMessage objects (empty when absent)."""
    out = []
    for m in _check_response(resp).get("messages") or []:
        if not isinstance(m, Mapping):
            raise ValueError(f"malformed REPL message: {m!r}")
        out.append(LeanMessage(severity=str(m.get("severity", "error")),
                               data=str(m.get("data", "")),
                               pos=_pos(m.get("pos")), end_pos=_pos(m.get("endPos"))))
    return out


def is_error_response(resp: Mapping[str, Any]) -> bool:
    """True for {"message": ...} replies (unknown env, unparsable JSON, Lean exception)."""
    resp = _check_response(resp)
    return "message" in resp and "env" not in resp and "messages" not in resp


def lean_verdict(resp: Mapping[str, Any]) -> LeanVerdict:
    """Judge a command response: accepted iff no error message, no sorries, no "declaration
    uses 'sorry'" warning and not an error response."""
    resp = _check_response(resp)
    if is_error_response(resp):
        return LeanVerdict(False, "repl_error", [str(resp["message"])], 0)
    if "env" not in resp and "messages" not in resp and "sorries" not in resp:
        return LeanVerdict(False, "protocol", [f"unexpected REPL response: {dict(resp)!r}"[:500]])
    msgs = parse_messages(resp)
    errors = [str(m) for m in msgs if m.severity == "error"]
    sorry_warnings = [m for m in msgs if m.severity == "warning" and _SORRY_WARNING.search(m.data)]
    sorries = max(len(resp.get("sorries") or []), len(sorry_warnings))
    if errors:
        return LeanVerdict(False, "error", errors, sorries)
    if sorries:
        return LeanVerdict(False, "sorry", [str(m) for m in sorry_warnings], sorries)
    return LeanVerdict(True, "accepted", [], 0)


def elaborates_with_sorry(resp: Mapping[str, Any]) -> bool:
    """A conjecture is well formed iff `theorem ... := by sorry` elaborates with only sorries:
    no error messages, not an error response, at least one sorry."""
    return lean_verdict(resp).status == "sorry"


# ----------------------------------------------------------------------------- statements
_COMMENT = re.compile(r"/-.*?-/|--[^\n]*", re.S)
_DECL = re.compile(r"\b(theorem|lemma)\s+([^\s:({\[]+)")
_OPEN = "([{⟨"
_CLOSE = ")]}⟩"


_LET = re.compile(r"(let|have)\s")
_IDENT_CHAR = re.compile(r"[\w'.!?]")


def _header_end(text: str, start: int) -> int:
    """Index of the first `:=` at bracket depth 0 at or after `start` that does not close a
    `let`/`have` inside the statement's type (`theorem t : let k : ℕ := 2; k = 2 := by`), or
    -1."""
    depth, binders = 0, 0
    for i in range(start, len(text)):
        ch = text[i]
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth = max(0, depth - 1)
        elif depth == 0 and text.startswith(":=", i):
            if not binders:
                return i
            binders -= 1
        elif depth == 0 and _LET.match(text, i) and (i == 0 or not _IDENT_CHAR.match(text[i - 1])):
            binders += 1
    return -1


def _normalise(header: str) -> str:
    return " ".join(header.split()).replace("lemma ", "theorem ", 1)


def declaration_header(text: str, name: str | None = None) -> tuple[str, str]:
    """(name, normalised header up to `:=`) of the first theorem/lemma in `text` (or the one
    named `name`). Comments are dropped and whitespace is collapsed."""
    text = _COMMENT.sub(" ", text)
    for m in _DECL.finditer(text):
        if name is not None and m.group(2) != name:
            continue
        end = _header_end(text, m.end())
        if end < 0:
            raise ValueError(f"theorem {m.group(2)} has no ':='")
        return m.group(2), _normalise(text[m.start():end])
    what = f"theorem {name}" if name else "a theorem or lemma declaration"
    raise ValueError(f"no {what} found")


def check_statement_preserved(target_statement: str, proof_text: str) -> bool:
    """True iff `proof_text` declares the target's theorem (same name) with the same statement
    (everything before `:=`, whitespace and comments normalised) exactly once. `target_statement`
    is e.g. "theorem t (n : ℕ) : n + 0 = n := by sorry" or the same without `:= ...`."""
    if not isinstance(target_statement, str) or not isinstance(proof_text, str):
        raise TypeError("target_statement and proof_text must be str")
    target = target_statement if ":=" in target_statement else target_statement + " :="
    name, header = declaration_header(target)
    try:
        _, got = declaration_header(proof_text, name)
    except ValueError:
        return False
    clean = _COMMENT.sub(" ", proof_text)
    same_name = [m for m in _DECL.finditer(clean) if m.group(2) == name]
    return got == header and len(same_name) == 1
