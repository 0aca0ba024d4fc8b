"""Read answers out of model text: CRUXEval assertions and code blocks.

CRUXEval replies are `assert f(X) == Y` (inside [ANSWER] tags, a code block, or bare). For
cruxeval-o the answer is Y, for cruxeval-i it is the call `f(X)`. A reply that is already the
bare answer (a predictions file holding just `Y`, `X` or `f(X)`) is taken as it is. With several
assertions (small models echo the few-shot examples), the one about this item is taken: the one
whose call is `f(<input>)` (cruxeval-o) or whose value is the given output (cruxeval-i).
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


def _assertions(text: str) -> list[tuple[str, str]]:
    """(left, right) source of every `assert L == R` line in `text`, in order."""
    pairs = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("assert"):
            continue
        try:
            node = ast.parse(line).body[0]
        except (SyntaxError, IndexError, ValueError):
            if "==" in line:  # CRUXEval's own fallback
                left, right = line[len("assert"):].split("==", 1)
                pairs.append((left.strip(), right.strip()))
            continue
        test = getattr(node, "test", None)
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and \
                isinstance(test.ops[0], ast.Eq):
            pairs.append((ast.get_source_segment(line, test.left) or "",
                          ast.get_source_segment(line, test.comparators[0]) or ""))
    return pairs


def _same(a: str, b: str) -> bool:
    """Equal as Python expressions (layout and quotes aside)."""
    try:
        return ast.dump(ast.parse(a, mode="eval")) == ast.dump(ast.parse(b, mode="eval"))
    except SyntaxError:
        return a.strip() == b.strip()


def _pick(pairs: list[tuple[str, str]], side: int, target: str | None) -> tuple[str, str] | None:
    """The assertion that answers this item: with several (a model that echoes the few-shot
    examples), the first whose `side` matches `target` (the call or output the prompt gave),
    else the first one."""
    pairs = [p for p in pairs if "??" not in p[0] + p[1]]
    if target is not None:
        for p in pairs:
            if _same(p[side], target):
                return p
    return pairs[0] if pairs else None


def crux_output(text: str, call: str | None = None) -> str:
    """The predicted output literal of a cruxeval-o reply; `call` (`f(<input>)`) picks the
    assertion about this item when the reply has several."""
    block = answer_block(text)
    pair = _pick(_assertions(block), 0, call)
    if pair is not None:
        return pair[1]
    return block.splitlines()[0].strip() if block else ""


def crux_input_call(text: str, fn: str = "f", output: str | None = None) -> str:
    """The predicted call `fn(X)` of a cruxeval-i reply (bare `X` becomes `fn(X)`); `output`
    picks the assertion about this item when the reply has several."""
    block = answer_block(text)
    pair = _pick(_assertions(block), 1, output)
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
