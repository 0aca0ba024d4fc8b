"""`compassplay reference build`: a reference set ({"prompt", "solution"} jsonl, the format
`compassplay.rewards.reference_set` loads) sampled from MATH-style problems with worked solutions.

    compassplay reference build --from math_solutions.jsonl --n 32 --seed 0 \\
        [--levels 1,2,3] [--subjects Prealgebra,Geometry] [--exclude ref.jsonl] --out ref.jsonl
    compassplay reference build --hub EleutherAI/hendrycks_math --hub-config algebra \\
        --split train --n 32 --out ref.jsonl        (needs `datasets` and hub access)

Source rows need "problem" and "solution" (the gold worked solution); "level" ("Level 3" or
3) and "subject" (or MATH's "type") are used by the filters. MATH500 problems are always
dropped (matched by a hash of the whitespace-normalized problem text, shipped in
compassplay/data/math500_problem_hashes.txt), so a reference set never overlaps that benchmark;
`--exclude FILE` (repeatable) drops the prompts of other {prompt, solution} files too, e.g. to
draw SOAR's held-out problems disjoint from a reference set.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import sys
from pathlib import Path

from compassplay.eval.loaders import read_rows

MATH500_HASHES = Path(__file__).resolve().parents[1] / "data" / "math500_problem_hashes.txt"


class SourceError(RuntimeError):
    """The source could not be read (missing file, no `datasets`, hub unreachable)."""


def problem_hash(problem: str) -> str:
    return hashlib.sha256(re.sub(r"\s+", " ", problem).strip().encode()).hexdigest()[:16]


def math500_hashes() -> set[str]:
    return {ln.strip() for ln in MATH500_HASHES.read_text().splitlines()
            if ln.strip() and not ln.startswith("#")}


def read_file(path: str | Path) -> list[dict]:
    if not Path(path).is_file():
        raise SourceError(f"--from: file not found: {path}")
    return read_rows(path)


def read_hub(name: str, config: str | None, split: str) -> list[dict]:
    try:
        import datasets
    except ImportError:
        raise SourceError("--hub needs the `datasets` package: pip install 'compassplay[hub]' "
                          "(or use --from FILE with a local copy)") from None
    try:
        ds = datasets.load_dataset(name, config, split=split)
    except Exception as exc:  # offline, unknown name, ...: one clear message
        raise SourceError(f"could not load {name!r} (config {config!r}, split {split!r}) from "
                          f"the Hugging Face hub: {type(exc).__name__}: {str(exc)[:300]}. "
                          "Without hub access, download it elsewhere and use --from FILE.") \
            from None
    return [dict(r) for r in ds]


def _level(row: dict) -> str:
    m = re.search(r"\d+", str(row.get("level", "")))
    return m.group(0) if m else ""


def _subject(row: dict) -> str:
    return str(row.get("subject") or row.get("type") or "").strip().lower()


def excluded_hashes(paths: list[str | Path]) -> set[str]:
    """Problem hashes of the prompts of {prompt, ...} jsonl files (`--exclude`)."""
    out = set()
    for path in paths:
        if not Path(path).is_file():
            raise SourceError(f"--exclude: file not found: {path}")
        for line in Path(path).read_text().splitlines():
            if line.strip():
                out.add(problem_hash(json.loads(line)["prompt"]))
    return out


def select(rows: list[dict], n: int, seed: int, levels: list[str] | None = None,
           subjects: list[str] | None = None,
           exclude: set[str] | None = None) -> tuple[list[dict], dict[str, int]]:
    """(n rows drawn with `seed` after the filters, counts of what was dropped and why);
    `exclude`: problem hashes to drop besides MATH500's."""
    banned = math500_hashes()
    exclude = exclude or set()
    wanted_levels = {re.sub(r"\D", "", lv) for lv in levels} if levels else None
    wanted_subjects = {s.strip().lower() for s in subjects} if subjects else None
    dropped = {"math500": 0, "excluded": 0, "filtered": 0, "malformed": 0}
    pool = []
    for r in rows:
        if not (isinstance(r.get("problem"), str) and isinstance(r.get("solution"), str)
                and r["problem"].strip() and r["solution"].strip()):
            dropped["malformed"] += 1
        elif problem_hash(r["problem"]) in banned:
            dropped["math500"] += 1
        elif problem_hash(r["problem"]) in exclude:
            dropped["excluded"] += 1
        elif (wanted_levels and _level(r) not in wanted_levels) or \
                (wanted_subjects and _subject(r) not in wanted_subjects):
            dropped["filtered"] += 1
        else:
            pool.append(r)
    if len(pool) < n:
        raise SourceError(f"only {len(pool)} problems left after the filters; asked for {n}")
    return random.Random(seed).sample(pool, n), dropped


def write_reference(rows: list[dict], out: str | Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        for r in rows:
            f.write(json.dumps({"prompt": r["problem"].strip(),
                                "solution": r["solution"].strip()}) + "\n")
    return out


def _csv(text: str | None) -> list[str] | None:
    return [t for t in (s.strip() for s in text.split(",")) if t] if text else None


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--from", dest="source", metavar="FILE", help="json/jsonl of problems")
    src.add_argument("--hub", default=None, metavar="DATASET", help="a Hugging Face dataset")
    p.add_argument("--hub-config", default=None)
    p.add_argument("--split", default="train")
    p.add_argument("--n", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--levels", default=None, help="comma list, e.g. 1,2,3 or 'Level 2'")
    p.add_argument("--subjects", default=None, help="comma list, e.g. Prealgebra,Geometry")
    p.add_argument("--exclude", action="append", default=[], metavar="FILE",
                   help="a {prompt, solution} jsonl whose problems are left out (repeatable)")
    p.add_argument("--out", required=True)


def run(args: argparse.Namespace) -> int:
    from compassplay.rewards.reference_set import load_reference  # lazy: keeps the CLI start light

    if args.n < 1:
        print("error: --n must be >= 1", file=sys.stderr)
        return 2
    try:
        rows = read_file(args.source) if args.source else \
            read_hub(args.hub, args.hub_config, args.split)
        chosen, dropped = select(rows, args.n, args.seed, _csv(args.levels), _csv(args.subjects),
                                 excluded_hashes(args.exclude))
    except SourceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    out = write_reference(chosen, args.out)
    load_reference(out)  # the file must load as a reference set
    print(f"wrote {len(chosen)} problems to {out} (from {len(rows)}; dropped "
          + ", ".join(f"{k}: {v}" for k, v in dropped.items()) + ")")
    return 0
