"""Read a result bundle, refusing one that is unfinished, corrupt or newer than this kit.

Reading checks the JSON files against their models; it does not check ``SHA256SUMS`` (that is
:func:`kit.bundle.verify.verify_bundle`). Parquet tables load on first use.
"""

import json
import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import pyarrow as pa
from pydantic import BaseModel, ValidationError

from kit.bundle.budget import check_table_budget, read_within_budget
from kit.bundle.parquet_pages import DecodeCost, PagesLimit, read_footer
from kit.bundle.schema import (
    EXPERTS_FILE,
    EXPERTS_SCHEMA,
    SCHEMA_VERSION,
    STEPS_SCHEMA,
    Manifest,
    MetricsFile,
)
from kit.bundle.telemetry_fields import TELEMETRY_SCHEMA
from kit.bundle.writer import PARTIAL_SUFFIX
from kit.config.loader import describe_validation_error
from kit.errors import BundleError

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Bundle:
    """A finished bundle whose manifest and metrics passed their schemas.

    Attributes:
        path: The bundle directory.
        manifest: ``manifest.json``, validated (its free-form parts, ``config``, ``workload``
            and ``platform``, stay dicts: they record what the run used, in any kit version).
        metrics: ``metrics.json``, validated.
        verification_error: Why the bundle failed :func:`kit.bundle.verify.verify_bundle`,
            when it was read anyway (``--allow-unverified``, see
            :func:`kit.bundle.verified.read_verified_bundle`); None otherwise.
    """

    path: Path
    manifest: Manifest
    metrics: MetricsFile
    verification_error: str | None = None

    @cached_property
    def steps(self) -> pa.Table:
        """``steps.parquet`` (:data:`STEPS_SCHEMA`), read on first access."""
        return read_table(self.path, "steps.parquet", STEPS_SCHEMA)

    @cached_property
    def telemetry(self) -> pa.Table:
        """``telemetry.parquet`` (:data:`TELEMETRY_SCHEMA`), read on first access."""
        return read_table(self.path, "telemetry.parquet", TELEMETRY_SCHEMA)

    @cached_property
    def experts(self) -> pa.Table | None:
        """``experts.parquet`` (:data:`EXPERTS_SCHEMA`); None when the run left none (dense)."""
        if not (self.path / EXPERTS_FILE).is_file():
            return None
        return read_table(self.path, EXPERTS_FILE, EXPERTS_SCHEMA)


def bundle_dir(path: str | Path) -> Path:
    """Return ``path`` if it can be a finished bundle directory.

    Raises:
        BundleError: It does not exist, is a file, or is a staging (``.partial``) directory.
    """
    root = Path(path)
    if root.name.endswith(PARTIAL_SUFFIX):
        raise BundleError(
            f"{root} is an unfinished bundle (the staging directory of a run that never "
            f"finished writing it); publish it with `charllm-kit bundle recover {root}`"
        )
    if root.is_file():
        raise BundleError(f"{root} is a file, not a bundle directory; unpack it first")
    if not root.is_dir():
        raise BundleError(f"no bundle at {root}: the directory does not exist")
    return root


def _refuse_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    """A JSON number as a float; one beyond a float's range (``1e400``) is not taken for
    infinity, which no metric is and no JSON writer may print back."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is beyond the range of a float")
    return value


JSON_MAX_DEPTH = 32
"""Deepest nesting of lists and objects in a bundle's JSON (the kit writes five levels)."""
JSON_MAX_BYTES = 256 * 2**20
"""Largest ``manifest.json`` or ``metrics.json`` read (a 1024-rank run's is a few MB)."""


def _depth(value: Any) -> int:
    """How deeply lists and objects nest in ``value`` (a scalar: 0), without recursing."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > JSON_MAX_DEPTH:
            break
        children = item.values() if isinstance(item, dict) else item if isinstance(
            item, list) else ()
        stack += [(child, depth + 1) for child in children]
    return deepest


def _load_json(root: Path, name: str) -> dict[str, Any]:
    """Parse ``root/name`` as strict JSON (no NaN/Infinity) holding one object, within
    :data:`JSON_MAX_BYTES` and :data:`JSON_MAX_DEPTH`."""
    path = root / name
    if not path.is_file():
        raise BundleError(f"bundle {root}: {name} is missing")
    if path.stat().st_size > JSON_MAX_BYTES:
        raise BundleError(f"bundle {root}: {name} is over {JSON_MAX_BYTES} bytes; not read")
    try:
        data = json.loads(path.read_text(encoding="utf-8"), parse_constant=_refuse_constant,
                          parse_float=_finite_float)
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError included
        raise BundleError(f"bundle {root}: {name} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise BundleError(f"bundle {root}: {name} is not a JSON object")
    if _depth(data) > JSON_MAX_DEPTH:
        raise BundleError(f"bundle {root}: {name} nests deeper than {JSON_MAX_DEPTH} levels")
    return data


def _check_model(root: Path, name: str, data: dict[str, Any], model: type[M]) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise BundleError(
            f"bundle {root}: {name} fails the schema: {describe_validation_error(e)}"
        ) from None


def _schema_difference(found: pa.Schema, expected: pa.Schema) -> str | None:
    """Describe the first way ``found`` differs from ``expected``, or return None."""
    missing = [n for n in expected.names if n not in found.names]
    unexpected = [n for n in found.names if n not in expected.names]
    if missing or unexpected:
        return f"missing columns {missing}, unexpected columns {unexpected}"
    if found.names != expected.names:
        return "columns are out of order"
    for got, want in zip(found, expected, strict=True):
        if got.type != want.type or got.nullable != want.nullable:
            return (
                f"column {got.name} is {got.type}{'' if got.nullable else ' not null'}, "
                f"expected {want.type}{'' if want.nullable else ' not null'}"
            )
    return None


_CORRUPT = (OSError, pa.ArrowException, ValueError, IndexError, OverflowError, MemoryError)
"""What pyarrow raises on a corrupt file: its own errors, and, for a fuzzed footer, Python's
(a ``UnicodeDecodeError`` for a column name that is not UTF-8 is a ``ValueError``)."""


def _unreadable(root: Path, name: str, err: Exception) -> BundleError:
    why = (str(err).strip().splitlines() or [""])[0][:160]
    if isinstance(err, PagesLimit):
        return BundleError(f"bundle {root}: {name}: {why}; not read")
    if isinstance(err, MemoryError):  # pyarrow.ArrowMemoryError is one
        return BundleError(f"bundle {root}: {name}: out of memory decoding it ({why}); not read")
    return BundleError(f"bundle {root}: {name} is not readable parquet ({type(err).__name__}"
                       + (f": {why})" if why else ")"))


def check_parquet(root: Path, name: str, expected: pa.Schema) -> DecodeCost:
    """Refuse ``root/name`` unless it is a parquet file whose schema equals ``expected`` and
    whose row groups and pages keep it within the read budget (:mod:`kit.bundle.budget`).

    Returns:
        What decoding the file takes.

    Raises:
        BundleError: The file is missing, unreadable, of another schema or over the budget.
    """
    path = root / name
    if not path.is_file():
        raise BundleError(f"bundle {root}: {name} is missing")
    try:
        metadata = read_footer(path)
        found = metadata.schema.to_arrow_schema()
    except _CORRUPT as e:
        raise _unreadable(root, name, e) from None
    problem = _schema_difference(found, expected)
    if problem:
        raise BundleError(
            f"bundle {root}: {name} does not match schema v{SCHEMA_VERSION}: {problem}"
        )
    try:
        return check_table_budget(root, name, metadata, expected)
    except _CORRUPT as e:
        raise _unreadable(root, name, e) from None


def read_table(root: Path, name: str, expected: pa.Schema) -> pa.Table:
    """Read one of a bundle's parquet files after checking its schema and budget.

    Raises:
        BundleError: The file is missing, unreadable, of another schema or over the budget.
    """
    cost = check_parquet(root, name, expected)
    try:
        return read_within_budget(root, name, cost, expected)
    except _CORRUPT as e:
        raise _unreadable(root, name, e) from None


def check_schema_version(root: Path, version: object) -> int:
    """Return ``version`` if this kit can read it; else refuse it in one line saying what to do.

    This kit reads versions 1 to :data:`SCHEMA_VERSION`; v1 is the first published layout,
    so there is no older one to migrate yet.

    Raises:
        BundleError: Not an integer, below 1, or newer than :data:`SCHEMA_VERSION`.
    """
    if type(version) is not int:
        raise BundleError(f"bundle {root}: manifest.json has no integer schema_version")
    if version > SCHEMA_VERSION:
        raise BundleError(
            f"bundle {root} has schema_version {version}; this kit reads up to "
            f"{SCHEMA_VERSION}: upgrade charllm-kit"
        )
    if version < 1:
        raise BundleError(f"bundle {root}: schema_version {version} does not exist (first is 1)")
    return version


def read_schema_version(path: str | Path) -> int:
    """Return a bundle's ``schema_version`` after :func:`check_schema_version` accepts it.

    Raises:
        BundleError: Not a bundle, unreadable manifest, or a version this kit cannot read.
    """
    root = bundle_dir(path)
    return check_schema_version(root, _load_json(root, "manifest.json").get("schema_version"))


def read_bundle(path: str | Path) -> Bundle:
    """Open a finished bundle and check its manifest and metrics.

    Args:
        path: The bundle directory.

    Raises:
        BundleError: Not a finished bundle, unparsable or invalid JSON, or a schema version
            newer than :data:`SCHEMA_VERSION`.
    """
    root = bundle_dir(path)
    data = _load_json(root, "manifest.json")
    check_schema_version(root, data.get("schema_version"))
    manifest = _check_model(root, "manifest.json", data, Manifest)
    metrics = _check_model(root, "metrics.json", _load_json(root, "metrics.json"), MetricsFile)
    return Bundle(path=root, manifest=manifest, metrics=metrics)
