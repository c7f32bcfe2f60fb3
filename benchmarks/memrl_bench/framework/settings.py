"""One configuration layer: each setting declared once, read from flags > environment > YAML > default.

A group of settings is a dataclass (`llm.LLMSettings`, the harness's `BenchConfig`): a field is the
one definition of its setting, giving its name (also its YAML key and its keyword argument), its
type (the annotation), its default, and through `setting(...)` its environment variable and its
check. The command line declares the flags with their help (`memrl bench --help` must not load
the harness) under the same names; tests/test_settings.py checks that each flag's help shows the
field's default and variable. `read_section` is the one reader of a YAML config file.

Not pydantic-settings: `memrl --help` and `memrl retrieve` must not import it (cold start), and a
bad value must be one line naming its source, which would need a translation of pydantic's
errors anyway; this module is the part of it memrl needs.
"""

from __future__ import annotations

import os
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import Field, field, fields
from pathlib import Path
from typing import Any

from memrl_cli.errors import MemrlError

Check = Callable[[str, Any], object]  # raises a one-line MemrlError naming the setting


def setting(default: Any = None, *, env: str | None = None, check: Check | None = None,
            factory: Callable[[], Any] | None = None) -> Any:
    """A dataclass field that is a setting: its default (or `factory`), environment variable and check."""
    metadata = {"env": env, "check": check}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def check_all(group: Any) -> None:
    """Run every field's check on its value (an optional setting that is None is not checked)."""
    for f in fields(group):
        check, value = f.metadata.get("check"), getattr(group, f.name)
        if check is not None and not (value is None and f.default is None):
            check(f.name, value)


def names(group: type) -> set[str]:
    """The settings of a group (its YAML keys and keyword arguments)."""
    return {f.name for f in fields(group)}


def environment(group: type) -> dict[str, str]:
    """The settings that non-empty environment variables give (empty variables count as unset)."""
    return {f.name: os.environ[f.metadata["env"]] for f in fields(group)
            if f.metadata.get("env") and os.environ.get(f.metadata["env"])}


def env_var(group: type, name: str) -> str | None:
    """The environment variable of setting `name`, if it has one."""
    return next(f.metadata.get("env") for f in fields(group) if f.name == name)


def _scalar_type(group: type, f: Field[Any]) -> type | None:
    """The type a setting's value is converted to: the annotation without `| None`, if a scalar."""
    hint = typing.get_type_hints(group)[f.name]
    if isinstance(hint, types.UnionType):
        hint = next(arg for arg in typing.get_args(hint) if arg is not type(None))
    return hint if hint in (int, float, str) else None


def coerce(group: type, values: Mapping[str, Any], source: str, what: str) -> dict[str, Any]:
    """`values` converted to their settings' types (`"0.9"` to 0.9); one line naming `source` if one cannot be."""
    by_name = {f.name: f for f in fields(group)}
    out = {}
    for name, value in values.items():
        wanted = _scalar_type(group, by_name[name])
        if value is not None and wanted is not None:
            if isinstance(value, bool) and wanted is not str:  # YAML's `yes` is not the number 1
                raise MemrlError(f"{what} setting {name!r} from {source} must be {wanted.__name__}, got {value!r}")
            if wanted is int and isinstance(value, float) and not value.is_integer():
                raise MemrlError(f"{what} setting {name!r} from {source} must be an integer, got {value!r}")
            try:
                value = wanted(value)
            except (TypeError, ValueError):
                raise MemrlError(f"{what} setting {name!r} from {source} must be {wanted.__name__}, "
                                 f"got {value!r}") from None
        out[name] = value
    return out


def read_section(path: str | os.PathLike[str], section: str, label: str = "config") -> dict[str, Any] | None:
    """The `section:` mapping of the YAML file at `path`; None if the file has none.

    An unreadable file, invalid YAML or a `section:` that is not a mapping is a one-line error
    starting with `label` (e.g. "LLM config").
    """
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise MemrlError(f"cannot read {label} {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise MemrlError(f"{label} {path} is not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict) or data.get(section) is None:
        return None
    if not isinstance(data[section], dict):
        raise MemrlError(f"{label} {path}: `{section}:` must be a mapping")
    return dict(data[section])

