"""Where a run writes: a directory of its own, never one that holds another run.

A new run claims `output_dir/name`; when that holds anything (an earlier run, a stray file)
it takes `name-2`, `name-3`, ... and says so. Claiming is atomic between concurrent runs: the
run that creates `run.json` (exclusive create) in an empty directory owns it. `run.json`
records the run's id; checkpoints carry it, so a restore only ever loads this run's weights.
`--resume DIR` reopens an existing run; `--overwrite` empties `output_dir/name` first.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
import uuid
from pathlib import Path

from compassplay.errors import RunError

log = logging.getLogger(__name__)

RUN_FILE = "run.json"
_MAX_SUFFIX = 10_000


def claim_run_dir(base: str | Path, overwrite: bool = False) -> Path:
    """Create and own a fresh run directory: `base` if it is absent or empty, else the first
    free `base-K` (K = 2, 3, ...). With `overwrite`, `base` is removed first and reused."""
    base = Path(base)
    if overwrite and base.exists():
        log.warning("--overwrite: removing the earlier run in %s", base)
        shutil.rmtree(base)
    for k in range(1, _MAX_SUFFIX):
        path = base if k == 1 else base.with_name(f"{base.name}-{k}")
        if _try_claim(path):
            if path != base:
                log.warning("%s holds another run: this run writes to %s (resume the earlier "
                            "one with --resume %s, or replace it with --overwrite)",
                            base, path, base)
            return path
    raise RunError(f"no free run directory next to {base} (tried {_MAX_SUFFIX - 1} names)")


def _try_claim(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        return False  # a file of that name
    if any(path.iterdir()):
        return False
    try:
        with (path / RUN_FILE).open("x") as f:
            f.write(_new_run_record())
    except FileExistsError:
        return False  # another run claimed it between the listing and the create
    return True


def _new_run_record() -> str:
    """The JSON of a new run's `run.json`: a fresh id and its creation time (Unix seconds)."""
    return json.dumps({"run_id": uuid.uuid4().hex, "created_unix": time.time()})


def open_run_dir(path: str | Path) -> Path:
    """The run directory to resume: it must exist and hold the run's `config.yaml`."""
    path = Path(path)
    if not path.is_dir():
        raise RunError(f"--resume {path}: no such run directory")
    if not (path / "config.yaml").is_file():
        raise RunError(f"--resume {path}: not a run directory (no config.yaml in it)")
    if read_run_id(path) is None:  # a run from before run ids: give it one now
        (path / RUN_FILE).write_text(_new_run_record())
    return path


def read_run_id(run_dir: str | Path) -> str | None:
    """The id in `run_dir/run.json`, or None when the directory has none (or it is unreadable)."""
    try:
        rid = json.loads((Path(run_dir) / RUN_FILE).read_text()).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None
    return rid if isinstance(rid, str) and rid else None
