"""Read answers out of model text: CRUXEval assertions and code blocks.

CRUXEval replies are `assert f(X) == Y` (inside [ANSWER] tags, a code block, or bare). For
cruxeval-o the answer is Y, for cruxeval-i it is the call `f(X)`. A reply that is already the
bare answer (a predictions file holding just `Y`, `X` or `f(X)`) is taken as it is.
"""

from __future__ import annotations

import ast
import re

_FENCE = re.compile(r"```[a-zA-Z0-9_+-]*\n(.*?)(?:```|$)", re.S)


def answer_block(text: str) -> str:
    """The text inside [ANSWER]...[/ANSWER] (or after [ANSWER]; or the first code block;
    or the whole text), stripped."""
    if "[ANSWER]" in text:
        text = text.split("[ANSWER]", 1)[1]
    text = text.split("[/ANSWER]", 1)[0]
    m = _FENCE.search(text)
    if m:
        text = m.group(1)
    return text.strip()


def _assertion(text: str) -> tuple[str, str] | None:
    """(left, right) source of the first `assert L == R` line in `text`, if any."""
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("assert"):
            continue
        try:
            node = ast.parse(line).body[0]
        except (SyntaxError, IndexError, ValueError):
            if "==" in line:  # CRUXEval's own fallback
                left, right = line[len("assert"):].split("==", 1)
                return left.strip(), right.strip()
            continue
        test = getattr(node, "test", None)
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and \
                isinstance(test.ops[0], ast.Eq):
            return ast.get_source_segment(line, test.left) or "", \
                ast.get_source_segment(line, test.comparators[0]) or ""
    return None


def crux_output(text: str) -> str:
    """The predicted output literal of a cruxeval-o reply."""
    block = answer_block(text)
    pair = _assertion(block)
    if pair is not None:
        return pair[1]
    return block.splitlines()[0].strip() if block else ""


def crux_input_call(text: str, fn: str = "f") -> str:
    """The predicted call `fn(X)` of a cruxeval-i reply (bare `X` becomes `fn(X)`)."""
    block = answer_block(text)
    pair = _assertion(block)
    expr = pair[0] if pair is not None else (block.splitlines()[0].strip() if block else "")
    if re.match(rf"^{re.escape(fn)}\s*\(", expr) and _balanced_call(expr):
        return expr
    return f"{fn}({expr})"


def _balanced_call(expr: str) -> bool:
    """Whether `expr` is one call `name(...)` and nothing more (not `f(1) + f(2)`)."""
    try:
        node = ast.parse(expr, mode="eval").body
    except SyntaxError:
        return True  # let execution report the error
    return isinstance(node, ast.Call)


def code_block(text: str) -> str | None:
    """The first fenced code block of `text`, if there is one."""
    m = _FENCE.search(text)
    return m.group(1) if m else None
