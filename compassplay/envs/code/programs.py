"""Static checks on programs and inputs, and the harness that runs `f` on inputs.

Programs follow AZR's convention: a top-level entry function named `f`. Inputs are argument
lists written as Python literals (`'hello', 3` means `f('hello', 3)`).

The harness executes the program in its own namespace with stdout/stdin replaced, calls
`f(<input>)` for each input, and prints one final line `SENTINEL <json>` to the real stdout,
where the json is a list with one record per input: `{"ok", "repr", "literal", "error"}`.
`repr` is a canonical repr (sets sorted, containers rebuilt recursively) so equal values print
the same across processes; `literal` says whether `ast.literal_eval(repr) == value`.
"""

from __future__ import annotations

import ast
import json
import warnings
from dataclasses import dataclass

ENTRY = "f"
SENTINEL = "__COMPASSPLAY_RESULT__"
MAX_PROGRAM_CHARS = 8000
MAX_INPUT_CHARS = 2000
BANNED_CALLS = ("__import__", "eval", "exec", "compile", "open", "breakpoint", "exit", "quit",
                "globals", "locals", "vars", "help", "memoryview")
BANNED_ATTRS = ("__subclasses__", "__globals__", "__builtins__", "__code__", "__bases__",
                "__mro__", "__loader__", "__spec__")


def check_program(src: str, banned_modules: list[str] | tuple[str, ...]) -> str:
    """Return '' for an acceptable program, else the rejection reason."""
    if not src.strip():
        return "empty_program"
    if len(src) > MAX_PROGRAM_CHARS:
        return "program_too_long"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(src)
    except (SyntaxError, ValueError):
        return "syntax_error"
    banned = set(banned_modules)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if top in banned:
                    return f"banned_import:{top}"
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                return "banned_import:relative"
            top = (node.module or "").split(".")[0]
            if top in banned:
                return f"banned_import:{top}"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            name = node.func.id
            if name == "print":
                return "prints"
            if name == "input":
                return "reads_input"
            if name in BANNED_CALLS:
                return f"banned_call:{name}"
        elif isinstance(node, ast.Attribute) and node.attr in BANNED_ATTRS:
            return f"banned_attribute:{node.attr}"
        elif isinstance(node, ast.Name) and node.id in ("__builtins__", "__import__"):
            return f"banned_call:{node.id}"
    if not any(isinstance(n, ast.FunctionDef) and n.name == ENTRY for n in tree.body):
        return "no_entry_function"
    return ""


class _DropPrints(ast.NodeTransformer):
    """Removes `print(...)` expression statements (a body left empty gets `pass`)."""

    def generic_visit(self, node: ast.AST) -> ast.AST:
        super().generic_visit(node)
        for name in ("body", "orelse", "finalbody"):
            body = getattr(node, name, None)
            if not isinstance(body, list) or not body or not isinstance(body[0], ast.stmt):
                continue
            kept = [st for st in body if not _is_print(st)]
            if len(kept) != len(body):
                setattr(node, name, kept or ([ast.Pass()] if name == "body" else []))
        return node


def _is_print(st: ast.stmt) -> bool:
    return (isinstance(st, ast.Expr) and isinstance(st.value, ast.Call)
            and isinstance(st.value.func, ast.Name) and st.value.func.id == "print")


def strip_prints(src: str) -> str:
    """AZR's clean-up of a proposed program: `print(...)` statements and comments removed
    (the program is re-rendered by `ast.unparse`). Programs without `print` or `#` are
    returned unchanged, and so is one that does not parse (the checks reject it)."""
    if "print" not in src and "#" not in src:
        return src
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(src)
        return ast.unparse(ast.fix_missing_locations(_DropPrints().visit(tree)))
    except (SyntaxError, ValueError, RecursionError):
        return src


def literal(text: str):
    """`ast.literal_eval(text.strip())` without SyntaxWarning/DeprecationWarning noise."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ast.literal_eval(text.strip())


LITERAL_ERRORS = (ValueError, SyntaxError, TypeError, MemoryError, RecursionError)


def check_input(text: str) -> str:
    """Return '' when `text` is a literal argument list (`ast.literal_eval` accepts it)."""
    if not text.strip():
        return "empty_input"
    if len(text) > MAX_INPUT_CHARS:
        return "input_too_long"
    try:
        literal(text)
    except LITERAL_ERRORS:
        return "input_not_literal"
    return ""


def normalize_program(src: str) -> str:
    """Formatting- and comment-insensitive form of a program (for deduplication)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ast.unparse(ast.parse(src))
    except (SyntaxError, ValueError, RecursionError):
        return src.strip()


def normalize_value(text: str) -> str:
    """Canonical text of a literal (falls back to the stripped text)."""
    try:
        return repr(literal(text))
    except LITERAL_ERRORS:
        return text.strip()


def values_equal(a: str, b: str) -> bool:
    """Equality of evaluated literals; string comparison where literal_eval fails."""
    try:
        va, vb = literal(a), literal(b)
    except LITERAL_ERRORS:
        return " ".join(a.split()) == " ".join(b.split())
    try:
        return bool(va == vb)
    except Exception:  # noqa: BLE001 - exotic comparisons never raise out of grading
        return False


_HARNESS = '''\
import ast as _cp_ast, io as _cp_io, json as _cp_json, sys as _cp_sys
_cp_out = _cp_sys.stdout
_cp_sys.stdout = _cp_io.StringIO()
_cp_sys.stdin = _cp_io.StringIO()
_cp_sys.setrecursionlimit(3000)

def _cp_canon(v):
    t = type(v)
    if t is list:
        return "[" + ", ".join(_cp_canon(x) for x in v) + "]"
    if t is tuple:
        inner = ", ".join(_cp_canon(x) for x in v)
        return "(" + inner + ("," if len(v) == 1 else "") + ")"
    if t is dict:
        return "{" + ", ".join(_cp_canon(k) + ": " + _cp_canon(x) for k, x in v.items()) + "}"
    if t is set:
        return "{" + ", ".join(sorted(_cp_canon(x) for x in v)) + "}" if v else "set()"
    if t is frozenset:
        return "frozenset({" + ", ".join(sorted(_cp_canon(x) for x in v)) + "})"
    return repr(v)

_cp_records = []
%(pad)s_cp_ns = {"__name__": "__cp_program__"}
try:
    exec(compile(%(program)s, "<program>", "exec"), _cp_ns)
    _cp_load_error = ""
except BaseException as _cp_e:
    _cp_load_error = type(_cp_e).__name__ + ": " + str(_cp_e)[:200]
for _cp_src in %(inputs)s:
    if _cp_load_error:
        _cp_records.append({"ok": False, "error": "load: " + _cp_load_error})
        continue
    try:
        _cp_v = eval(compile("f(\\n" + _cp_src + "\\n)", "<input>", "eval"), _cp_ns)
        _cp_r = _cp_canon(_cp_v)
        try:
            _cp_lit = bool(_cp_ast.literal_eval(_cp_r) == _cp_v)
        except BaseException:
            _cp_lit = False
        _cp_records.append({"ok": True, "repr": _cp_r, "literal": _cp_lit})
    except BaseException as _cp_e:
        _cp_records.append({"ok": False, "error": type(_cp_e).__name__ + ": " + str(_cp_e)[:200]})
_cp_out.write("\\n" + %(sentinel)r + " " + _cp_json.dumps(_cp_records) + "\\n")
_cp_out.flush()
'''


_PAD = "_cp_pad = [(object(), [], {}, bytes(_i %% 257), (_i,)) for _i in range(%d)]\n"


def harness(program: str, inputs: list[str], perturb: int = 0) -> str:
    """Source that runs `f(<input>)` for each input and prints the sentinel result line.

    `perturb > 0` first allocates a heap pad of that many mixed-size objects, so that
    address-dependent values (`id(...)`, `hash(object())`) differ from an unpadded run even
    when the sandbox forks every run from the same warm process (same memory layout).
    """
    pad = (_PAD % perturb) if perturb > 0 else ""
    return _HARNESS % {"program": repr(program), "inputs": repr([s.strip() for s in inputs]),
                       "sentinel": SENTINEL, "pad": pad}


@dataclass
class CallResult:
    """One `f(input)` evaluation: ok, canonical repr, repr round-trips, error text."""

    ok: bool
    repr: str = ""
    literal: bool = False
    error: str = ""


def parse_harness_output(stdout: str, n: int) -> list[CallResult] | None:
    """Records from the last sentinel line, or None if it is missing or malformed."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(SENTINEL + " "):
            try:
                recs = json.loads(line[len(SENTINEL) + 1:])
            except json.JSONDecodeError:
                return None
            if not isinstance(recs, list) or len(recs) != n:
                return None
            return [CallResult(ok=bool(r.get("ok")), repr=str(r.get("repr", "")),
                               literal=bool(r.get("literal")), error=str(r.get("error", "")))
                    for r in recs]
    return None
