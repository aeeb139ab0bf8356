"""Load workload and platform YAML files into validated specs, with one-line errors.

A YAML file may come from another site, so reading one has a budget: at most
:data:`YAML_MAX_BYTES` of text, and a loaded value of at most :data:`YAML_MAX_NODES` scalars,
lists and mappings counted as they expand (an alias counts as a copy of what it names, so
"billion laughs" anchors are refused) and :data:`YAML_MAX_DEPTH` levels deep.
"""

from collections.abc import Collection
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from kit.config.platform import PlatformSpec
from kit.config.workload import WorkloadSpec
from kit.errors import KitInputError
from kit.paths import platforms_dir, workloads_dir

M = TypeVar("M", bound=BaseModel)

YAML_MAX_BYTES = 1 * 2**20
"""Largest spec file read, bytes (the shipped ones are under 5 KB)."""
YAML_MAX_NODES = 100_000
"""Most values a loaded spec may expand to (a sweep of a few thousand points fits)."""
YAML_MAX_DEPTH = 32
"""Deepest nesting of lists and mappings (the spec models nest four levels)."""


def _yaml_too_big(data: Any) -> str | None:
    """Say why ``data`` is over the node or depth budget, or return None.

    Walks the value as its consumers will (an alias shared N times is counted N times),
    stopping at the first budget crossed.
    """
    stack: list[tuple[Any, int]] = [(data, 0)]
    nodes = 0
    while stack:
        value, depth = stack.pop()
        nodes += 1
        if nodes > YAML_MAX_NODES:
            return f"expands to over {YAML_MAX_NODES} values (aliases count as copies)"
        if depth > YAML_MAX_DEPTH:
            return f"nests deeper than {YAML_MAX_DEPTH} levels"
        if isinstance(value, dict):
            stack += [(v, depth + 1) for kv in value.items() for v in kv]
        elif isinstance(value, list):
            stack += [(v, depth + 1) for v in value]
    return None


def describe_validation_error(err: ValidationError, skip: Collection[str] = ()) -> str:
    """Condense a pydantic error into one line: ``field: message; field: message``.

    Missing fields come first, named together (``missing fields: a, b``) rather than one
    "Field required" each. Errors under a top-level field named in ``skip`` are left out
    ("" if that is all of them).
    """
    missing, parts = [], []
    for e in err.errors():
        if e["loc"] and e["loc"][0] in skip:
            continue
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        if e["type"] == "missing":
            missing.append(loc)
        else:
            parts.append(f"{loc}: {e['msg']}")
    if missing:
        parts.insert(0, f"missing field{'s' if len(missing) > 1 else ''}: {', '.join(missing)}")
    return "; ".join(parts)


def load_yaml_model(path: Path, model: type[M]) -> M:
    """Parse ``path`` with the safe YAML loader and validate it as ``model``."""
    try:
        with path.open("rb") as f:
            raw = f.read(YAML_MAX_BYTES + 1)
        if len(raw) > YAML_MAX_BYTES:
            raise KitInputError(f"{path}: over {YAML_MAX_BYTES} bytes, too large for a spec "
                                "file; not read")
        data = yaml.safe_load(raw.decode("utf-8"))
    except OSError as e:
        raise KitInputError(f"cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise KitInputError(f"{path}: not a YAML text file (not UTF-8)") from None
    except RecursionError:
        raise KitInputError(f"{path}: nests deeper than {YAML_MAX_DEPTH} levels") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(e, "problem", None) or e
        raise KitInputError(f"{path}: invalid YAML{where}: {problem}") from None
    too_big = _yaml_too_big(data)
    if too_big:
        raise KitInputError(f"{path}: {too_big}; not loaded")
    if not isinstance(data, dict):
        raise KitInputError(f"{path}: expected a mapping at the top level")
    data.setdefault("name", path.stem)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise KitInputError(f"{path}: {describe_validation_error(e)}") from None


def _names(directory: Path) -> list[str]:
    return sorted(p.stem for p in directory.glob("*.yaml"))


def _resolve(name_or_path: str, directory: Path, kind: str) -> Path:
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml"):
        if not candidate.is_file():
            raise KitInputError(f"{kind} file not found: {candidate}")
        return candidate
    path = directory / f"{name_or_path}.yaml"
    if not path.is_file():
        known = ", ".join(_names(directory))
        raise KitInputError(f"unknown {kind} '{name_or_path}'; known: {known}")
    return path


def workload_names() -> list[str]:
    """Names of the shipped workloads."""
    return _names(workloads_dir())


def platform_names() -> list[str]:
    """Names of the shipped platforms."""
    return _names(platforms_dir())


def load_workload(name_or_path: str) -> WorkloadSpec:
    """Load a shipped workload by name, or any workload YAML by path."""
    return load_yaml_model(_resolve(name_or_path, workloads_dir(), "workload"), WorkloadSpec)


def load_platform(name_or_path: str) -> PlatformSpec:
    """Load a shipped platform by name, or any platform YAML by path."""
    return load_yaml_model(_resolve(name_or_path, platforms_dir(), "platform"), PlatformSpec)
