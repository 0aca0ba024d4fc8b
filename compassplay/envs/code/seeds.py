"""Seed programs: the shipped seed set and a loader for AZR-style seed jsonl.

One schema serves both (AZR's): a deduction/abduction seed has `snippet`, `input`, `output`,
`imports`; an induction seed has `snippet`, `inputs`, `outputs`, `message`, `imports`. Extra
fields are ignored. `imports` lines missing from the snippet are prepended.

Seeds are checked statically here (program checks, literal inputs; induction pairs with a
non-literal input are dropped); their outputs are trusted as given. `validate` can re-derive
them through the sandbox (the tests do so for the shipped set).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from importlib import resources
from pathlib import Path

from compassplay.envs.code.pairs import MIN_PAIRS
from compassplay.envs.code.programs import check_input, check_program
from compassplay.records import Task

SHIPPED_SEED_FILE = "seed_programs.jsonl"


# Seed sets shipped with the package, by `task.seed_file` name: the AZR-style set, and 36
# one-to-five-line programs (6 of them induction seeds) for small models (the laptop default: SmolLM2-135M imitates what
# its prompt shows, and can predict the outputs of programs this short).
SHIPPED_SEED_SETS = {"": SHIPPED_SEED_FILE, "simple": "seed_programs_simple.jsonl"}


def shipped_seed_path(name: str = "") -> Path:
    """Path of a seed set shipped with the package (`compassplay/data/`), by name."""
    return Path(str(resources.files("compassplay").joinpath("data", SHIPPED_SEED_SETS[name])))


def data_path(name: str, data_dir: str | os.PathLike | None = None) -> Path | None:
    """`name` inside `data_dir` or $COMPASSPLAY_DATA_DIR, if that file exists."""
    base = data_dir or os.environ.get("COMPASSPLAY_DATA_DIR", "")
    if not base:
        return None
    p = Path(base) / name
    return p if p.exists() else None


def _program(d: dict) -> str:
    snippet = str(d.get("snippet") or d.get("code") or "")
    imports = [str(x).strip() for x in d.get("imports") or [] if str(x).strip()]
    missing = [line for line in imports if line not in snippet]
    return "\n".join(missing + [snippet]) if missing else snippet


def seed_to_task(d: dict, task_id: str, banned: list[str]) -> tuple[Task | None, str]:
    """One seed line as a valid Task, or (None, reason)."""
    program = _program(d)
    reason = check_program(program, banned)
    if reason:
        return None, reason
    if "inputs" in d:
        pairs = [(str(i), str(o)) for i, o in zip(d["inputs"], d.get("outputs", []), strict=False)
                 if not check_input(str(i))]
        if len(pairs) < MIN_PAIRS:
            return None, "too_few_inputs"
        return Task(task_id=task_id, task_type="induction", program=program,
                    inputs=[i for i, _ in pairs], outputs=[o for _, o in pairs],
                    message=str(d.get("message", "")), source="seed", valid=True), ""
    inp, out = str(d.get("input", "")), str(d.get("output", ""))
    reason = check_input(inp) or ("" if out.strip() else "empty_output")
    if reason:
        return None, reason
    return Task(task_id=task_id, task_type="deduction", program=program, inputs=[inp],
                outputs=[out], source="seed", valid=True), ""


def load_seed_file(path: str | os.PathLike, banned: list[str],
                   prefix: str | None = None) -> tuple[list[Task], Counter]:
    """Tasks from an AZR-style seed jsonl, and the count of skipped lines by reason."""
    path = Path(path)
    prefix = prefix if prefix is not None else f"seed-{path.stem}"
    tasks: list[Task] = []
    skipped: Counter = Counter()
    with path.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError:
                skipped["bad_json"] += 1
                continue
            task, reason = seed_to_task(d, f"{prefix}-{n}", banned)
            if task is None:
                skipped[reason] += 1
            else:
                tasks.append(task)
    return tasks, skipped


def load_seeds(seed_file: str, banned: list[str]) -> tuple[list[Task], Counter]:
    """The configured seeds: comma-separated sources, each the name of a shipped set ('' =
    the AZR-style set, 'simple' = the short programs; `SHIPPED_SEED_SETS`), a path, or the
    name of a file in $COMPASSPLAY_DATA_DIR (AZR's own seed sets live there, not in the
    package)."""
    tasks: list[Task] = []
    skipped: Counter = Counter()
    for source in (s.strip() for s in seed_file.split(",")):
        if source in SHIPPED_SEED_SETS:
            prefix = "seed" if not source else f"seed-{source}"
            got = load_seed_file(shipped_seed_path(source), banned, prefix=prefix)
        else:
            path = Path(source) if Path(source).exists() else data_path(source)
            if path is None:
                where = os.environ.get("COMPASSPLAY_DATA_DIR", "") or "unset"
                raise FileNotFoundError(
                    f"task.seed_file: {source} is neither a file nor in $COMPASSPLAY_DATA_DIR "
                    f"({where}); a path, a data file name, or one of the shipped sets: "
                    f"{', '.join(map(repr, SHIPPED_SEED_SETS))}")
            got = load_seed_file(path, banned)
        tasks += got[0]
        skipped.update(got[1])
    return tasks, skipped
