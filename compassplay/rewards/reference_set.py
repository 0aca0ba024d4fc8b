"""The reference set whose loss gradient g_ref points the proposer (paper: 32 MATH problems).

File format: JSON lines, one object per line with two string fields:
    {"prompt": "<problem text shown to the solver>", "solution": "<gold worked solution>"}
Blank lines are skipped; any other malformed line is an error naming the file and line number.
The shipped default (`compassplay/data/reference_math.jsonl`) holds 32 short math word problems
with worked solutions written for this project.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

SHIPPED_REFERENCE = Path(__file__).resolve().parents[1] / "data" / "reference_math.jsonl"


class ReferenceFormatError(ValueError):
    """A reference file that does not follow the documented jsonl format."""


@dataclass(frozen=True)
class ReferenceItem:
    """One reference problem and its gold solution (plain text)."""

    prompt: str
    solution: str


def load_reference(path: str | Path = "", max_items: int | None = None) -> list[ReferenceItem]:
    """Read a reference jsonl (`''` = the shipped set, a bare file name = a file shipped in
    compassplay/data, e.g. `reference_math_paper32.jsonl`); keep the first `max_items` items."""
    p = Path(path) if path else SHIPPED_REFERENCE
    if not p.is_file() and p.parent == Path(".") and (SHIPPED_REFERENCE.parent / p).is_file():
        p = SHIPPED_REFERENCE.parent / p
    if not p.is_file():
        raise ReferenceFormatError(f"reference.path: file not found: {p}")
    items: list[ReferenceItem] = []
    for lineno, line in enumerate(p.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ReferenceFormatError(f"{p}:{lineno}: not valid JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise ReferenceFormatError(f"{p}:{lineno}: expected an object with prompt, solution")
        for key in ("prompt", "solution"):
            if not isinstance(obj.get(key), str) or not obj[key].strip():
                raise ReferenceFormatError(f"{p}:{lineno}: field '{key}' must be a non-empty string")
        items.append(ReferenceItem(prompt=obj["prompt"], solution=obj["solution"]))
    if not items:
        raise ReferenceFormatError(f"{p}: the reference set is empty")
    return items[:max_items] if max_items else items
