"""Write a result bundle: stage it while the run goes, then publish it in one rename.

A run writes into ``OUT/.<bundle_id>.partial/`` from its start: ranks append to
``logs/rank<N>.log`` and telemetry samplers drop parquet chunks into ``telemetry-chunks/``.
:meth:`BundleStaging.finalize` adds the data files and ``SHA256SUMS`` and renames the directory
to ``OUT/<bundle_id>/``, so a directory without the ``.partial`` mark is always complete.
"""

import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import time
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel

from kit.atomic_write import write_atomic
from kit.bundle.schema import EXPERTS_FILE, EXPERTS_SCHEMA, STEPS_SCHEMA, Manifest, MetricsFile
from kit.bundle.telemetry_fields import TELEMETRY_SCHEMA
from kit.errors import BundleError
from kit.neutralize import control_problem

SUMS_NAME = "SHA256SUMS"
PARTIAL_SUFFIX = ".partial"
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]*")


def new_bundle_id(workload: str, platform: str) -> str:
    """Return a unique, sortable bundle id, e.g. ``20261122T091500Z-gpt3-tiny-cpu-3fa9c1``.

    Args:
        workload: Workload name (a YAML stem, or ``name@platform`` when scaled).
        platform: Platform name.

    Raises:
        ValueError: A name that is not safe inside a directory name.
    """
    for name in (workload, platform):
        if not _SAFE_NAME.fullmatch(name):
            raise ValueError(f"{name!r} cannot be part of a bundle id: use letters, digits, ._@-")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return f"{stamp}-{workload}-{platform}-{secrets.token_hex(3)}"


def file_sha256(path: Path) -> str:
    """Return the hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def bundle_files(root: Path, skip: Sequence[str] = ()) -> list[str]:
    """List every file under ``root`` but ``SHA256SUMS``, as sorted POSIX relative paths.

    Args:
        root: The bundle directory.
        skip: Top-level names (files or directories) left out.

    Raises:
        BundleError: A symlink, a fifo, a socket or a device file: bundles hold plain files
            only, so nothing points outside and nothing blocks the reader that opens it.
    """
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        if base == root:
            dirnames[:] = [d for d in dirnames if d not in skip]
            filenames = [f for f in filenames if f not in skip]
        for name in dirnames + filenames:
            rel = (base / name).relative_to(root).as_posix()
            if (base / name).is_symlink():
                raise BundleError(f"bundle {root}: symlink {rel} (bundles hold plain files only)")
            if name in filenames and not stat.S_ISREG(os.lstat(base / name).st_mode):
                raise BundleError(f"bundle {root}: {rel} is a special file (a fifo, socket or "
                                  "device; bundles hold plain files only); not opened")
        files.extend((base / name).relative_to(root).as_posix() for name in filenames)
    return sorted(f for f in files if f != SUMS_NAME)


def concat_chunks(chunks_dir: Path) -> pa.Table:
    """Join the telemetry chunks in ``chunks_dir`` (``*.parquet``, in name order) into one table.

    Returns:
        A table with :data:`TELEMETRY_SCHEMA`; empty when there are no chunks.

    Raises:
        BundleError: A chunk that is unreadable or has another schema.
    """
    tables = []
    for path in sorted(Path(chunks_dir).glob("*.parquet")):
        try:
            table = pq.read_table(path)
        except (OSError, pa.ArrowException) as e:
            raise BundleError(f"telemetry chunk {path} is unreadable: {type(e).__name__}") from e
        if not table.schema.equals(TELEMETRY_SCHEMA):
            raise BundleError(f"telemetry chunk {path} does not have the telemetry schema")
        tables.append(table)
    return pa.concat_tables(tables) if tables else TELEMETRY_SCHEMA.empty_table()


def write_json(dest: Path, model: BaseModel) -> None:
    """Write ``model`` as the bundle's JSON files are written: indented, strict, atomic."""
    try:
        text = json.dumps(model.model_dump(mode="json"), indent=2, allow_nan=False)
    except ValueError as e:  # NaN or infinity in a free-form detail dict
        raise ValueError(f"{dest.name}: {e}") from e
    write_atomic(dest, lambda tmp: tmp.write_text(text + "\n", encoding="utf-8"), fsync=True)


def _write_parquet(dest: Path, table: pa.Table, schema: pa.Schema) -> None:
    if not table.schema.equals(schema):
        raise ValueError(f"{dest.name}: table schema {table.schema} is not {schema}")
    for field in schema:
        if not field.nullable and table.column(field.name).null_count:
            raise ValueError(f"{dest.name}: column {field.name} holds nulls")
    write_atomic(dest, lambda tmp: pq.write_table(table, tmp), fsync=True)


def write_sums(root: Path, skip: Sequence[str] = ()) -> None:
    """(Re)write ``root/SHA256SUMS`` over every other file in the bundle directory.

    ``skip``: top-level names left out (a staging folder's scratch, deleted before publishing).

    Raises:
        BundleError: A file name holds a line break or another control character: its line
            in ``SHA256SUMS`` would read as two.
    """
    files = bundle_files(root, skip)
    for f in files:
        problem = control_problem(f, f"file name {f!r}")
        if problem:
            raise BundleError(f"bundle {root}: {problem}; rename the file")
    lines = [f"{file_sha256(root / f)}  {f}\n" for f in files]
    text = "".join(lines)
    write_atomic(root / SUMS_NAME, lambda tmp: tmp.write_text(text, encoding="utf-8"), fsync=True)


class BundleStaging:
    """The directory a run's bundle grows in until :meth:`finalize` publishes it."""

    def __init__(self, out_dir: Path, bundle_id: str) -> None:
        """Create ``out_dir/.<bundle_id>.partial/`` with empty ``logs/`` and chunk directories.

        Args:
            out_dir: Where bundles go; created when missing.
            bundle_id: From :func:`new_bundle_id`.

        Raises:
            FileExistsError: The bundle or its staging directory already exists.
        """
        self._final = Path(out_dir) / bundle_id
        self._path = Path(out_dir) / f".{bundle_id}{PARTIAL_SUFFIX}"
        if self._final.exists():
            raise FileExistsError(f"bundle {self._final} already exists")
        self._path.mkdir(parents=True)
        self.logs_dir.mkdir()
        self.chunks_dir.mkdir()

    @property
    def path(self) -> Path:
        """The staging directory."""
        return self._path

    @property
    def logs_dir(self) -> Path:
        """Where rank N writes ``rank<N>.log``."""
        return self._path / "logs"

    @property
    def chunks_dir(self) -> Path:
        """Where samplers write telemetry chunks, joined by :func:`concat_chunks`.

        A sampler writes each chunk under a temporary name not ending in ``.parquet`` and
        renames it, naming chunks so that name order is time order per node
        (e.g. ``node0-000042.parquet``).
        """
        return self._path / "telemetry-chunks"

    @classmethod
    def reopen(cls, path: Path) -> "BundleStaging":
        """The staging folder at ``path`` (``OUT/.<bundle_id>.partial``), as a dead run left it.

        Raises:
            BundleError: ``path`` is not named like a staging folder, or its bundle exists.
        """
        path = Path(path)
        name = path.name
        if not (name.startswith(".") and name.endswith(PARTIAL_SUFFIX) and path.is_dir()):
            raise BundleError(f"{path} is not a staging folder (.<bundle id>{PARTIAL_SUFFIX})")
        staging = cls.__new__(cls)
        staging._path = path
        staging._final = path.parent / name[1 : -len(PARTIAL_SUFFIX)]
        if staging._final.exists():
            raise BundleError(f"{path}: its bundle {staging._final} already exists")
        staging.chunks_dir.mkdir(exist_ok=True)
        return staging

    @property
    def final_path(self) -> Path:
        """Where :meth:`finalize` publishes the bundle."""
        return self._final

    def finalize(
        self,
        manifest: Manifest,
        metrics: MetricsFile,
        steps: pa.Table,
        telemetry: pa.Table,
        scratch: Sequence[str] = (),
        experts: pa.Table | None = None,
    ) -> Path:
        """Write the data files and ``SHA256SUMS``, then publish the bundle.

        Nothing the bundle is made from is deleted until every file and ``SHA256SUMS`` is
        written: a failure on the way (a full disk) leaves a staging folder that can be
        assembled again.

        Args:
            manifest: The run's manifest.
            metrics: The run's metrics.
            steps: Step rows with :data:`STEPS_SCHEMA`.
            telemetry: Telemetry rows with :data:`TELEMETRY_SCHEMA`, usually
                ``concat_chunks(self.chunks_dir)``; the chunks are deleted.
            scratch: Other top-level names in the staging folder that are not part of the
                bundle (the launcher's and ranks' exchange files); deleted.
            experts: Routed-token rows with :data:`EXPERTS_SCHEMA`, written as
                ``experts.parquet``; None (dense runs) writes no file.

        Returns:
            The published bundle directory ``OUT/<bundle_id>/``.

        Raises:
            ValueError: A table with the wrong schema or nulls in a required column.
            FileExistsError: The final directory appeared meanwhile.
            OSError: A file could not be written (the staging folder keeps its inputs).
        """
        write_json(self._path / "manifest.json", manifest)
        write_json(self._path / "metrics.json", metrics)
        _write_parquet(self._path / "steps.parquet", steps, STEPS_SCHEMA)
        _write_parquet(self._path / "telemetry.parquet", telemetry, TELEMETRY_SCHEMA)
        if experts is not None:
            _write_parquet(self._path / EXPERTS_FILE, experts, EXPERTS_SCHEMA)
        skip = (self.chunks_dir.name, *scratch)
        write_sums(self._path, skip)
        return self.publish(skip)

    def publish(self, scratch: Sequence[str]) -> Path:
        """Delete ``scratch`` (top-level names) and rename the folder to its bundle name.

        Used by :meth:`finalize`, and to finish a publication that stopped after
        ``SHA256SUMS`` was written.
        """
        for name in scratch:
            target = self._path / name
            if target.is_dir():
                shutil.rmtree(target)
            else:
                target.unlink(missing_ok=True)
        if self._final.exists():  # os.rename would silently replace an empty directory
            raise FileExistsError(f"bundle {self._final} already exists")
        os.rename(self._path, self._final)
        return self._final
