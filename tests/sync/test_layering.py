"""Layering: sync/ (weight transport, versions) depends on neither engines/ nor Ray; engines/
has no Ray (Ray lives in actors/ and executors/)."""

from __future__ import annotations

import ast
from pathlib import Path

import compassplay

ROOT = Path(compassplay.__file__).parent


def _imports(folder: str) -> dict[str, set[str]]:
    out = {}
    for path in sorted((ROOT / folder).glob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
        out[path.name] = names
    return out


def test_sync_imports_no_engines_and_no_ray():
    for name, mods in _imports("sync").items():
        bad = sorted(m for m in mods if m.startswith(("compassplay.engines", "ray")))
        assert not bad, f"compassplay/sync/{name} imports {bad}"


def test_engines_import_no_ray():
    for name, mods in _imports("engines").items():
        bad = sorted(m for m in mods if m == "ray" or m.startswith("ray."))
        assert not bad, f"compassplay/engines/{name} imports {bad}"
