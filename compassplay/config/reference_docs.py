"""The config tree described from its pydantic models: every field (dotted name, type, default,
range, description), the JSON schema (`compassplay config schema`) and docs/config.md
(`compassplay config docs`). Walks the models, so fields added later appear without edits here.
"""

from __future__ import annotations

import copy
import json
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from compassplay.config.run_config import RunConfig

DOC_HEADER = """# Configuration reference

Generated from the pydantic models in `compassplay/config/` by `compassplay config docs >
docs/config.md`; `tests/test_config_docs.py` fails when this file is out of date. Defaults are
the built-in ones (a config file overrides them, e.g. the shipped `default.yaml` that
`compassplay run` uses without `--config`; see its values with `compassplay config show
--config NAME`). Set any field on the command line as `dotted.name=VALUE`.
"""


@dataclass(frozen=True)
class FieldDoc:
    """One field of the tree: `dotted` name, `section` (True for a nested section), readable
    `type`, `default` (JSON text; '' for sections), `range` and `description`."""

    dotted: str
    section: bool
    type: str
    default: str
    range: str
    description: str


def _section_type(annotation: Any) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) \
        else None


def type_text(annotation: Any) -> str:
    """`Literal['a', 'b']` -> 'a | b'; `list[str]` -> 'list[str]'; `int` -> 'int';
    `int | Literal['all']` -> 'int | all'."""
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " | ".join(str(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_text(a) for a in typing.get_args(annotation))
    if origin is not None:
        args = ", ".join(type_text(a) for a in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    return getattr(annotation, "__name__", str(annotation))


_BOUNDS = ((annotated_types.Ge, ">=", "ge"), (annotated_types.Gt, ">", "gt"),
           (annotated_types.Le, "<=", "le"), (annotated_types.Lt, "<", "lt"),
           (annotated_types.MinLen, "length >=", "min_length"),
           (annotated_types.MaxLen, "length <=", "max_length"))


def range_text(info: FieldInfo) -> str:
    """The field's bounds, e.g. '> 0, <= 1' ('' when unbounded)."""
    parts = []
    for meta in info.metadata:
        for kind, sign, attr in _BOUNDS:
            if isinstance(meta, kind):
                parts.append(f"{sign} {getattr(meta, attr)}")
    return ", ".join(parts)


def iter_fields(model: type[BaseModel] = RunConfig, values: BaseModel | None = None,
                prefix: str = "") -> Iterator[FieldDoc]:
    """Every field of `model`, depth first, with defaults from `values` (default: `model()`)."""
    values = model() if values is None else values
    for name, info in model.model_fields.items():
        dotted = prefix + name
        sub = _section_type(info.annotation)
        value = getattr(values, name)
        desc = " ".join((info.description or "").split())
        if sub is not None:
            yield FieldDoc(dotted, True, sub.__name__, "", "", desc)
            yield from iter_fields(sub, value, dotted + ".")
        else:
            yield FieldDoc(dotted, False, type_text(info.annotation),
                           json.dumps(_jsonable(value)), range_text(info), desc)


def _jsonable(value: Any) -> Any:
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else value


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    """`node` with every `$ref` replaced by a copy of its definition (so each path of the
    tree has its own subschema and can carry its own defaults)."""
    if isinstance(node, list):
        return [_inline(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]])
        rest = {k: v for k, v in node.items() if k != "$ref"}
        return _inline({**target, **rest}, defs)
    if "allOf" in node and len(node["allOf"]) == 1:  # older pydantic: {"allOf": [{"$ref"}]}
        rest = {k: v for k, v in node.items() if k != "allOf"}
        return _inline({**node["allOf"][0], **rest}, defs)
    return {k: _inline(v, defs) for k, v in node.items()}


def _set_defaults(schema: dict[str, Any], values: dict[str, Any]) -> None:
    for name, prop in schema.get("properties", {}).items():
        if name not in values:
            continue
        if "properties" in prop and isinstance(values[name], dict):
            _set_defaults(prop, values[name])
        else:
            prop["default"] = values[name]


def config_schema(cfg: RunConfig | None = None) -> dict[str, Any]:
    """The JSON schema (draft 2020-12) of the config tree, every section inlined, with the
    values of `cfg` (default: the built-in defaults) as each field's `default`."""
    raw = RunConfig.model_json_schema()
    defs = raw.pop("$defs", {})
    schema = _inline(raw, defs)
    _set_defaults(schema, (cfg or RunConfig()).model_dump(mode="json"))
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "CompassPlay run config"
    return schema


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def config_markdown() -> str:
    """docs/config.md: one table per top-level section (nested sections as their own rows)."""
    out = [DOC_HEADER]
    fields = list(iter_fields())
    for top in (f for f in fields if f.section and "." not in f.dotted):
        out.append(f"\n## `{top.dotted}`\n\n{top.description}\n")
        out.append("| field | type | default | range | description |")
        out.append("|---|---|---|---|---|")
        for f in fields:
            if not f.dotted.startswith(top.dotted + "."):
                continue
            default = f"`{_cell(f.default)}`" if f.default else "(section)"
            out.append(f"| `{f.dotted}` | {_cell(f.type)} | {default} | {_cell(f.range)} | "
                       f"{_cell(f.description)} |")
    return "\n".join(out) + "\n"
