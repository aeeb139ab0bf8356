"""Crafted bundles, archives and spec files as a hostile sender would make them.

Each one is a committed GPU bundle changed in one way and sealed again (``SHA256SUMS``
rewritten), so its checksums hold and only the change itself can get it refused. Shared by the
tests and by benchmarks/reliability/hostile_inputs.py, which measures what each one costs.
"""

import gzip
import io
import json
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from kit.bundle.writer import SUMS_NAME, file_sha256, write_sums
from kit.telemetry.fields import TELEMETRY_SCHEMA

REPO = Path(__file__).resolve().parent.parent
H200 = REPO / "tests/data/bundles/telemetry/20261122T094842Z-gpt3-1.3b-h200-bceb8a"
"""A real bundle (gpt3-1.3b on one H200) that verifies."""


def copy_bundle(dest_parent: Path, src: Path = H200) -> Path:
    """A writable copy of ``src`` under ``dest_parent``."""
    dest = dest_parent / src.name
    shutil.copytree(src, dest)
    return dest


def reseal(root: Path) -> Path:
    """Rewrite ``SHA256SUMS`` so that the bundle's checksums hold again."""
    (root / SUMS_NAME).unlink()
    write_sums(root)
    return root


def edit_json(root: Path, name: str, change: Callable[[dict[str, Any]], None]) -> Path:
    """Apply ``change`` to ``root/name`` (a JSON object) and reseal the bundle."""
    data = json.loads((root / name).read_text())
    change(data)
    (root / name).write_text(json.dumps(data, indent=2))
    return reseal(root)


def constant_rows(root: Path, rows: int, batch: int = 1_000_000) -> Path:
    """Replace ``telemetry.parquet`` with ``rows`` identical rows (a few KB of file)."""
    first = pq.read_table(root / "telemetry.parquet").slice(0, 1)
    block = pa.concat_tables([first] * min(rows, batch)).combine_chunks()
    with pq.ParquetWriter(root / "telemetry.parquet", TELEMETRY_SCHEMA) as writer:
        left = rows
        while left > 0:
            writer.write_table(block.slice(0, min(left, batch)))
            left -= batch
    return reseal(root)


def long_strings(root: Path, rows: int, length: int) -> Path:
    """``telemetry.parquet`` whose ``source`` is one ``length``-character word on every row
    (dictionary-encoded: the file stays small whatever it decodes to)."""
    first = pq.read_table(root / "telemetry.parquet").slice(0, 1)
    table = pa.concat_tables([first] * rows).combine_chunks()
    table = table.set_column(table.schema.get_field_index("source"), "source",
                             pa.array(["x" * length] * rows, pa.string()))
    pq.write_table(table.cast(TELEMETRY_SCHEMA), root / "telemetry.parquet")
    return reseal(root)


def _member(name: str, data: bytes) -> tuple[tarfile.TarInfo, io.BytesIO]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, io.BytesIO(data)


def zeros_archive(path: Path, bundle: Path, zeros: int, declared: int | None) -> Path:
    """An archive of ``bundle`` plus a ``zeros``-byte file of zeros (none for 0), its index
    declaring ``declared`` bytes (None: the true total, zeros included)."""
    files = sorted(p for p in bundle.rglob("*") if p.is_file())
    true_total = sum(p.stat().st_size for p in files) + zeros
    index = {"bundle_id": bundle.name, "schema_version": 1,
             "manifest_sha256": file_sha256(bundle / "manifest.json"),
             "sums_sha256": file_sha256(bundle / SUMS_NAME), "redacted": False,
             "total_bytes": true_total if declared is None else declared}
    with gzip.open(path, "wb", compresslevel=1) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(*_member("bundle-archive.json", json.dumps(index).encode()))
        for p in files:
            tar.addfile(*_member(f"{bundle.name}/{p.relative_to(bundle)}", p.read_bytes()))
        if zeros:
            info = tarfile.TarInfo(f"{bundle.name}/logs/zeros.log")
            info.size = zeros
            tar.addfile(info, _Zeros(zeros))
    return path


class _Zeros(io.RawIOBase):
    """``size`` zero bytes, read without holding them."""

    def __init__(self, size: int) -> None:
        self._left = size

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = self._left if n < 0 else min(n, self._left)
        self._left -= n
        return b"\0" * n


def billion_laughs(levels: int = 9) -> str:
    """YAML anchors that expand tenfold per level: 10**levels strings from a few lines."""
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]")
    return "\n".join(lines) + "\n"


def laughing_sweep(levels: int = 9) -> str:
    """A sweep file whose one axis value is a billion-laughs structure."""
    return (billion_laughs(levels) + "base: {workload: gpt3-tiny}\n"
            f"axes:\n  - points:\n      - {{steps: 2, out: *a{levels - 1}}}\n")
