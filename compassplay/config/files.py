"""Reading configs: YAML files (with `base:`), shipped configs by name, dotted overrides,
errors that name the file and field, and the resolved YAML."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from compassplay.config.run_config import RunConfig
from compassplay.config.section import ConfigError


def _parse_value(text: str) -> Any:
    """A KEY=VALUE value is read as YAML (so 2 -> int, true -> bool, [a,b] -> list)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_override(data: dict[str, Any], dotted: str, value: Any, where: str) -> None:
    """Set `data[a][b][c] = value` for dotted 'a.b.c', creating sections as needed."""
    keys = dotted.split(".")
    if not all(keys):
        raise ConfigError(f"{where}: override key '{dotted}' is not a dotted field name")
    node = data
    for i, key in enumerate(keys[:-1]):
        nxt = node.setdefault(key, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"{where}: '{'.'.join(keys[:i + 1])}' is a value, not a section")
        node = nxt
    node[keys[-1]] = value


def _format_errors(err: ValidationError, source: str) -> str:
    lines = [f"invalid config in {source}:"]
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            lines.append(f"  {field}: unknown key")
        else:
            got = e.get("input")
            got_s = "" if isinstance(got, (dict, BaseModel)) else f" (got {got!r})"
            msg = e["msg"].removeprefix("Value error, ") if not field else e["msg"]
            lines.append(f"  {field}: {msg}{got_s}" if field else f"  {msg}")
    return "\n".join(lines)


SHIPPED_CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def shipped_configs() -> list[str]:
    """Names of the configs that ship inside the package (`--config NAME`)."""
    return sorted(p.stem for p in SHIPPED_CONFIGS.glob("*.yaml"))


def resolve_config(path: str | Path) -> Path:
    """A YAML file path, or the name of a shipped config ('micro', 'default', or the old
    'configs/micro.yaml' spelling): the file exists in a clone and in an installed wheel."""
    p = Path(path)
    if p.is_file():
        return p
    name = p.name[: -len(".yaml")] if p.name.endswith(".yaml") else p.name
    shipped = SHIPPED_CONFIGS / f"{name}.yaml"
    if p.parent in (Path("."), Path("configs")) and shipped.is_file():
        return shipped
    raise ConfigError(f"config file not found: {p} (shipped configs, usable by name: "
                      f"{', '.join(shipped_configs())})")


def merge_sections(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` laid on `base`: mappings merge key by key (recursively), anything else replaces."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_sections(out[key], value)
        else:
            out[key] = value
    return out


def read_config_file(path: str | Path, chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The sections of a config file, laid over its `base:` config when it names one (a
    shipped config's name, or a path relative to the file); bases may chain, not loop."""
    p = resolve_config(path)
    if p.resolve() in chain:
        names = " -> ".join(str(c) for c in (*chain, p.resolve()))
        raise ConfigError(f"{p}: base configs form a loop: {names}")
    try:
        loaded = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"{p}: top level must be a mapping of sections")
    data = dict(loaded or {})
    base = data.pop("base", None)
    if base is None:
        return data
    if not isinstance(base, str) or not base:
        raise ConfigError(f"{p}: base: must name a config (got {base!r})")
    beside = p.parent / base
    target = beside if beside.is_file() else Path(base)
    try:
        parent = read_config_file(target, (*chain, p.resolve()))
    except ConfigError as exc:
        raise ConfigError(f"{p}: base: {exc}") from None
    return merge_sections(parent, data)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Load a RunConfig from YAML `path` or a shipped config's name (None = all defaults)
    plus `overrides` 'a.b=value'. A file may start from another with `base: NAME`."""
    source = str(path) if path else "<defaults>"
    data: dict[str, Any] = read_config_file(path) if path else {}
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override '{item}' must look like KEY=VALUE (e.g. pipeline.steps=2)")
        key, raw = item.split("=", 1)
        apply_override(data, key.strip(), _parse_value(raw), "command line")
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        where = source + (" with overrides " + " ".join(overrides) if overrides else "")
        raise ConfigError(_format_errors(err, where)) from None


def dump_config(cfg: RunConfig) -> str:
    """The resolved config as YAML (round-trips through load_config)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
