"""Loading a miniF2F-style target set: one JSON object per line with `name` and
`formal_statement` (required), `header`, `split`, `informal_prefix`, `goal` (optional).

Each target becomes a `Task(task_type="lean_prove", source="seed")` whose id is
"target:<name>" and whose `statement` is the normalised theorem header (no proof). Errors name
the file and line (`TargetFileError`). `task.lean.target_file` is a path, or the name of a file
in $COMPASSPLAY_DATA_DIR (`resolve_target_file`; e.g. minif2f.jsonl).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from compassplay.envs.lean.statements import parse_statement
from compassplay.records import Task

TARGET_PREFIX = "target:"
DATA_DIR_ENV = "COMPASSPLAY_DATA_DIR"


class TargetFileError(ValueError):
    """A target file that cannot be used; the message names file:line."""


def resolve_target_file(path: str | Path) -> Path:
    """`path` if it is a file, else the file of that name in $COMPASSPLAY_DATA_DIR."""
    if not str(path):
        raise TargetFileError("task.lean.target_file is empty: a lean run needs a target set")
    p = Path(path)
    if p.is_file():
        return p
    data_dir = os.environ.get(DATA_DIR_ENV, "")
    if data_dir and (Path(data_dir) / p).is_file():
        return Path(data_dir) / p
    where = f"${DATA_DIR_ENV}={data_dir}" if data_dir else f"${DATA_DIR_ENV} (unset)"
    raise TargetFileError(f"{p}: target file not found (a path, or a file name in {where})")


def load_targets(path: str | Path, split: str = "all", max_targets: int = 0
                 ) -> tuple[list[Task], str]:
    """(targets of `split` in file order, the first header seen, '' if none)."""
    p = resolve_target_file(path)
    tasks: list[Task] = []
    names: set[str] = set()
    header = ""
    for lineno, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{p}:{lineno}"
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise TargetFileError(f"{where}: not valid JSON ({exc})") from None
        if not isinstance(row, dict):
            raise TargetFileError(f"{where}: expected a JSON object")
        for key in ("name", "formal_statement"):
            if not isinstance(row.get(key), str) or not row[key].strip():
                raise TargetFileError(f"{where}: missing or empty string field {key!r}")
        if row["name"] in names:
            raise TargetFileError(f"{where}: duplicate name {row['name']!r}")
        names.add(row["name"])
        statement, reason = parse_statement(row["formal_statement"])
        if reason:
            raise TargetFileError(f"{where}: formal_statement is not a theorem with ':=' "
                                  f"({reason})")
        if split != "all" and row.get("split", "") != split:
            continue
        header = header or str(row.get("header") or "")
        tasks.append(Task(task_id=TARGET_PREFIX + row["name"], task_type="lean_prove",
                          statement=statement, source="seed", valid=True))
    if not tasks:
        raise TargetFileError(f"{p}: no targets (split={split!r})")
    return (tasks[:max_targets] if max_targets else tasks), header
