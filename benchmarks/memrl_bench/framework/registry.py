"""Finding benchmark adapters: the `memrl.benchmarks` entry-point group, or `module:Class`.

A third-party package adds a benchmark by declaring, in its pyproject.toml,

    [project.entry-points."memrl.benchmarks"]
    mybench = "my_package.bench:MyBenchmark"

and `memrl bench mybench` finds it. `memrl bench some.module:Class` loads a class directly.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from importlib.metadata import entry_points
from typing import Any

from memrl_cli.errors import MemrlError

GROUP = "memrl.benchmarks"

# The built-in benchmarks' extras (pyproject.toml) and the modules each needs, checked before loading.
EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "alfworld": ("alfworld", ("alfworld", "textworld", "matplotlib")),
    "bigcodebench": ("bigcodebench", ("datasets", "faker", "pytz", "pyfakefs", "requests_mock", "matplotlib")),
    "llb-db": ("llb", ("pymysql", "docker", "matplotlib")),
    "llb-os": ("llb", ("docker", "matplotlib")),
    "hle": ("hle", ("pyarrow", "matplotlib")),
}


def require_extra(name: str) -> None:
    """Refuse, in one line naming the pip command, a built-in benchmark whose extra is not installed."""
    if name not in EXTRAS:
        return
    extra, modules = EXTRAS[name]
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise MemrlError(f"memrl bench {name} needs the {extra} extra (missing: {', '.join(missing)}): "
                         f"pip install 'memrl[{extra}]'")


def available() -> list[str]:
    """Names of the registered benchmarks."""
    return sorted(ep.name for ep in entry_points(group=GROUP))


def load(name: str) -> Any:
    """The adapter class registered as `name` (or given as `module:Class`)."""
    target = name
    require_extra(name)
    if ":" not in name:
        found = [ep for ep in entry_points(group=GROUP) if ep.name == name]
        if not found:
            raise MemrlError(f"unknown benchmark {name!r}; available: {', '.join(available()) or 'none'} "
                             "(or give module:Class)")
        target = found[0].value
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise MemrlError(f"benchmark {name!r} cannot be loaded: {exc} (is its optional dependency installed?)") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise MemrlError(f"benchmark {name!r}: {module_name} has no {attr}") from None


def create(name: str, data: str | None, limit: int | None, options: dict[str, Any]) -> Any:
    """An adapter instance; options it does not take are refused with a one-line error."""
    cls = load(name)
    params = inspect.signature(cls).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        unknown = sorted(set(options) - set(params))
        if unknown:
            known = sorted(set(params) - {"self", "data", "limit"})
            raise MemrlError(f"benchmark {name!r} has no option {', '.join(unknown)}; its options: {', '.join(known)}")
    return cls(data=data, limit=limit, **options)
