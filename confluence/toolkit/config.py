"""Typed configuration trees: frozen dataclasses, overlaid from TOML / JSON files and `--set KEY=VALUE` by one rule.

A tree is a frozen dataclass whose fields are plain values or other such dataclasses. `overlay(cfg, changes)`
applies a nested dict: every name must be a field, every value must fit the field's annotation (lists become
tuples, an integral float an int, an int a float); a section's own checks run when it is rebuilt. Any problem is a
`ConfigError` naming the setting by its dotted path (`sampler.recent`).
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
import types
import typing
from collections.abc import Callable, Mapping
from importlib.resources import files
from pathlib import Path
from typing import Any, TypeVar

from confluence.errors import ConfigError

T = TypeVar("T")


COMPUTE_DTYPES = ("bfloat16", "float32", "float16")  # what a model may compute in; parameters stay float32


def positive(cfg: object, *names: str) -> None:
    """Raise ConfigError naming the first of `names` that is not > 0."""
    for name in names:
        if not getattr(cfg, name) > 0:
            raise ConfigError(name, f"must be positive, got {getattr(cfg, name)!r}")


def non_negative(cfg: object, *names: str) -> None:
    """Raise ConfigError naming the first of `names` that is negative."""
    for name in names:
        if getattr(cfg, name) < 0:
            raise ConfigError(name, f"must be >= 0, got {getattr(cfg, name)!r}")


def one_of(name: str, value: object, choices: tuple[object, ...]) -> None:
    """Raise ConfigError unless `value` is one of `choices`."""
    if value not in choices:
        raise ConfigError(name, f"must be one of {', '.join(map(repr, choices))}, got {value!r}")


def _fit(value: Any, kind: Any, setting: str) -> Any:
    """`value` checked against (and converted to) the annotation `kind`."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        problems = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _fit(value, option, setting)
            except ConfigError as exc:
                problems.append(exc.problem)
        raise ConfigError(setting, " or ".join(problems))
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(setting, f"must be one of {', '.join(map(repr, args))}, got {value!r}")
        return value
    if dataclasses.is_dataclass(kind):
        if isinstance(value, kind):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(setting, f"must be a table of settings, got {value!r}")
        return overlay(kind(), value, setting)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(setting, f"must be a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_fit(v, args[0], f"{setting}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise ConfigError(setting, f"must be a list of {len(args)} values, got {value!r}")
        return tuple(_fit(v, a, f"{setting}[{i}]") for i, (v, a) in enumerate(zip(value, args, strict=True)))
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(setting, f"must be a table (name = value), got {value!r}")
        return {_fit(k, args[0], setting): _fit(v, args[1], f"{setting}[{k!r}]") for k, v in value.items()}
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(setting, f"must be true or false, got {value!r}")
        return value
    if kind is int:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(setting, f"must be an integer, got {value!r}")
        return value
    if kind is float:
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ConfigError(setting, f"must be a number, got {value!r}")
        return float(value)
    if kind is str:
        if not isinstance(value, str):
            raise ConfigError(setting, f"must be a string, got {value!r}")
        return value
    raise TypeError(f"{setting}: unsupported annotation {kind!r}")  # a bug in a config class, not user input


ANY_VALUE = object()  # in a config class's RETIRED: the removed setting was moot at any value


def overlay(cfg: T, changes: Mapping[str, Any] | None, where: str = "") -> T:
    """`cfg` (a frozen dataclass) with the nested `changes` applied; raises ConfigError naming the setting."""
    if not changes:
        return cfg
    cls = type(cfg)
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kw: dict[str, Any] = {}
    retired = getattr(cls, "RETIRED", {})
    for name, value in changes.items():
        setting = f"{where}.{name}" if where else name
        if name not in names and name in retired:
            off = retired[name]
            if off is ANY_VALUE or value == off:
                continue  # a removed setting at the value that meant "off": an older checkpoint or recipe loads
            raise ConfigError(setting, f"was removed after measurement rejected it (docs/design/decisions.md, \"Removed "
                                       f"settings\"); only {off!r} (off) can still be read, got {value!r}")
        if name not in names:
            raise ConfigError(setting, f"unknown setting; {where or 'the top level'} has: {', '.join(names)}")
        current = getattr(cfg, name)
        if dataclasses.is_dataclass(current) and isinstance(value, Mapping):
            kw[name] = overlay(current, value, setting)
        else:
            kw[name] = _fit(value, hints[name], setting)
    try:
        return dataclasses.replace(cfg, **kw)
    except ConfigError as exc:  # a section's own checks (run in __post_init__) name the field inside it
        raise (exc.within(where) if where else exc) from None


def to_dict(cfg: Any) -> dict[str, Any]:
    """The tree as plain JSON / TOML values (tuples as lists)."""

    def plain(x: Any) -> Any:
        if isinstance(x, tuple | list):
            return [plain(v) for v in x]
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        return x

    return plain(dataclasses.asdict(cfg))


def read_file(path: str | Path) -> dict[str, Any]:
    """A TOML (`.toml`) or JSON file as a dict; ConfigError naming the file when it cannot be read or parsed."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError("", f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        raw = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError("", f"cannot parse {path}: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError("", f"{path} must hold a table of settings")
    return raw


def recipe_dir() -> Path:
    """Where the shipped recipes live (`confluence/configs/`; the text model's are `text-*.toml`)."""
    return Path(str(files("confluence").joinpath("configs")))


def read_recipe(spec: str, recipes: dict[str, Path], migrate: Callable[[dict[str, Any]], dict[str, Any]] = dict,
                _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The settings of a recipe (a name in `recipes`) or of a .toml / .json file, with its chain of `extends`
    (a recipe name, or a file path relative to the extending file) applied base first. `migrate` maps each file's
    dict from an older layout."""
    path = Path(spec)
    if not (path.suffix in (".toml", ".json") and path.is_file()):
        if spec not in recipes:
            raise ConfigError("", f"--config {spec!r}: neither a recipe ({', '.join(sorted(recipes))}) nor an "
                                  "existing .toml / .json file")
        path = recipes[spec]
    if path.resolve() in _seen:
        raise ConfigError("extends", f"{path}: recipes extend each other in a circle")
    raw = migrate(read_file(path))
    parent = raw.pop("extends", None)
    if parent is None:
        return raw
    if not isinstance(parent, str):
        raise ConfigError("extends", f"{path}: must name a recipe or a file, got {parent!r}")
    rel = path.parent / parent
    parent_spec = str(rel) if rel.suffix in (".toml", ".json") and rel.is_file() else parent
    return merge(read_recipe(parent_spec, recipes, migrate, (*_seen, path.resolve())), raw)


def parse_sets(items: list[str]) -> dict[str, Any]:
    """`--set a.b=VALUE` items as one nested dict; VALUE is read as JSON when it parses (numbers, true / false,
    null, lists, objects) and as a plain string otherwise."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError("", f"--set {item!r}: expected KEY=VALUE (e.g. model.n_layers=4)")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        node = out
        parts = key.strip().split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(key, "is set both as a value and as a section")
        node[parts[-1]] = value
    return out


def merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """`base` updated by `extra`, recursively for nested tables (neither argument is modified)."""
    out = dict(base)
    for k, v in extra.items():
        out[k] = merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
    return out
