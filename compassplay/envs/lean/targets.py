"""Loading a target set: miniF2F-style JSON lines (one object per line with `name` and
`formal_statement` (required), `header`, `split`, `informal_prefix`, `goal` (optional)), or
SGS's target file (`D_3k_prover_dataset.json` of github.com/LukeBailey181/sgs: one JSON
object whose `target_statements` maps an id to {`id`, `header`, `theorem`, ...}; 3,323
statements, the paper's target set), recognised by its `.json` suffix.

Each target becomes a `Task(task_type="lean_prove", source="seed")` whose id is
"target:<name>" and whose `statement` is the normalised theorem header (no proof). Errors name
the file and line (`TargetFileError`). `task.lean.target_file` is a path, or the name of a file
in $COMPASSPLAY_DATA_DIR (`resolve_target_file`; e.g. minif2f.jsonl).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections import Counter
from pathlib import Path

from compassplay.envs.lean.statements import parse_statement
from compassplay.records import Task

log = logging.getLogger(__name__)
TARGET_PREFIX = "target:"
# a `let`/`have` in a statement's type: the one-line statement this project checks
# (`statements`: comments dropped, whitespace collapsed) loses the line break that ends it
_LOCAL_DEF = re.compile(r"(?<![\w.'])(let|have)\s")
_UNUSABLE = {"no ':='": "no ':=' that Lean would see: it ends a line comment, or the "
             "statement is cut off",
             "let": "a let or have in the statement's type, which needs the line break this "
             "project's one-line statements drop"}
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
    """(targets of `split` in file order, their header, '' if none). One header serves every
    target: the first a JSON-lines file gives, the most common one of an SGS file (a warning
    counts the targets that declare another). A statement that is not a theorem with ':='
    is an error naming its line, except in an SGS file, whose unusable statements (that, or
    a `let`/`have` in the type) are left out with warnings that count them."""
    p = resolve_target_file(path)
    sgs = p.suffix == ".json"
    rows = _sgs_rows(p) if sgs else _jsonl_rows(p)
    unusable: dict[str, list[str]] = {}
    tasks: list[Task] = []
    names: set[str] = set()
    headers: list[str] = []
    for where, row in rows:
        if not isinstance(row, dict):
            raise TargetFileError(f"{where}: expected a JSON object")
        for key in ("name", "formal_statement"):
            if not isinstance(row.get(key), str) or not row[key].strip():
                raise TargetFileError(f"{where}: missing or empty string field {key!r}")
        if row["name"] in names:
            raise TargetFileError(f"{where}: duplicate name {row['name']!r}")
        names.add(row["name"])
        statement, reason = parse_statement(row["formal_statement"])
        if sgs and (reason or _LOCAL_DEF.search(statement)):
            unusable.setdefault("let" if not reason else "no ':='", []).append(row["name"])
            continue
        if reason:
            raise TargetFileError(f"{where}: formal_statement is not a theorem with ':=' "
                                  f"({reason})")
        if split != "all" and row.get("split", "") != split:
            continue
        headers.append(str(row.get("header") or ""))
        tasks.append(Task(task_id=TARGET_PREFIX + row["name"], task_type="lean_prove",
                          statement=statement, source="seed", valid=True))
    for why, ids in unusable.items():
        log.warning("%s: %d statements left out (%s): %s%s", p, len(ids), _UNUSABLE[why],
                    ", ".join(ids[:5]), ", ..." if len(ids) > 5 else "")
    if not tasks:
        raise TargetFileError(f"{p}: no targets (split={split!r})")
    header = _one_header(p, headers)
    return (tasks[:max_targets] if max_targets else tasks), header


def _jsonl_rows(p: Path):
    for lineno, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield f"{p}:{lineno}", json.loads(line)
        except ValueError as exc:
            raise TargetFileError(f"{p}:{lineno}: not valid JSON ({exc})") from None


def _sgs_rows(p: Path):
    """SGS's file as miniF2F-style rows (name = its id, formal_statement = its theorem)."""
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise TargetFileError(f"{p}: not valid JSON ({exc})") from None
    statements = doc.get("target_statements") if isinstance(doc, dict) else None
    if not isinstance(statements, dict):
        raise TargetFileError(f"{p}: a .json target file needs an object 'target_statements' "
                              "(SGS's format); use JSON lines (.jsonl) for miniF2F-style rows")
    for key, entry in statements.items():
        if not isinstance(entry, dict):
            raise TargetFileError(f"{p}: target_statements[{key!r}]: expected a JSON object")
        yield f"{p}: target_statements[{key!r}]", {
            "name": str(entry.get("id") or key), "formal_statement": entry.get("theorem"),
            "header": entry.get("header", "")}


def _one_header(p: Path, headers: list[str]) -> str:
    """The first header of a JSON-lines file, the most common one of an SGS file."""
    given = [h for h in headers if h]
    if not given:
        return ""
    if p.suffix != ".json":
        return given[0]
    header, n = Counter(given).most_common(1)[0]
    if n < len(headers):
        log.warning("%s: %d of %d targets declare another header than the most common one, "
                    "which every target is checked under", p, len(headers) - n, len(headers))
    return header
