"""Crafted bundles, archives and spec files as a hostile sender would make them.

Each one is a committed GPU bundle changed in one way and sealed again (``SHA256SUMS``
rewritten), so its checksums hold and only the change itself can get it refused. Shared by the
tests and by benchmarks/reliability/hostile_inputs.py, which measures what each one costs.
"""

import gzip
import io
import json
import shutil
import struct
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from kit.bundle.telemetry_fields import TELEMETRY_SCHEMA
from kit.bundle.thrift_compact import CompactReader
from kit.bundle.writer import SUMS_NAME, file_sha256, write_sums

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


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _thrift_value(kind: int, value: Any) -> bytes:
    """``value`` in the compact protocol, as kit.bundle.thrift_compact reads it."""
    if kind in (1, 2):
        return bytes([1 if value else 2])
    if kind == 3:
        return bytes([value])
    if kind in (4, 5, 6):
        return _varint((value << 1) ^ (value >> 63))
    if kind == 7:
        return struct.pack("<d", value)
    if kind == 8:
        return _varint(len(value)) + value
    if kind in (9, 10):
        elem, items = value
        head = bytes([len(items) << 4 | elem]) if len(items) < 15 else (
            bytes([0xF0 | elem]) + _varint(len(items)))
        return head + b"".join(_thrift_value(elem, v) for v in items)
    if kind == 12:
        return thrift_struct(value)
    raise ValueError(f"wire type {kind} not written here")


def thrift_struct(fields: dict[int, tuple[int, Any]]) -> bytes:
    """A struct as :meth:`kit.bundle.thrift_compact.CompactReader.read_struct` returns it,
    written back."""
    out, last = bytearray(), 0
    for fid in sorted(fields):
        kind, value = fields[fid]
        if kind in (1, 2):
            kind, value_bytes = (1 if value else 2), b""
        else:
            value_bytes = _thrift_value(kind, value)
        out += bytes([(fid - last) << 4 | kind]) if 0 < fid - last <= 15 else (
            bytes([kind]) + _varint(fid << 1))
        out += value_bytes
        last = fid
    return bytes(out + b"\0")


def edit_footer(path: Path, change: Callable[[dict[int, tuple[int, Any]]], None]) -> Path:
    """Rewrite the parquet footer of ``path`` after ``change`` edits its fields (a sender
    writing whatever totals it likes): FileMetaData 3 is num_rows, 4 the row groups, whose
    field 1 is the column chunks (their field 3, ColumnMetaData: 5 num_values,
    6 total_uncompressed_size, 7 total_compressed_size, 9 data_page_offset,
    11 dictionary_page_offset)."""
    data = path.read_bytes()
    length = struct.unpack("<I", data[-8:-4])[0]
    footer = CompactReader(data[-8 - length:-8]).read_struct()
    change(footer)
    new = thrift_struct(footer)
    path.write_bytes(data[:-8 - length] + new + struct.pack("<I", len(new)) + b"PAR1")
    return path


def chunk_fields(footer: dict) -> list[dict]:
    """Every ColumnMetaData of a footer read by :func:`edit_footer`, for editing in place."""
    return [chunk[3][1] for group in footer[4][1][1] for chunk in group[1][1][1]]


def many_row_groups(root: Path, name: str, groups: int, rows: int,
                    schema: pa.Schema, **options: Any) -> Path:
    """Replace ``root/name`` with ``groups`` row groups of ``rows`` copies of its first row
    (pyarrow ``write_table`` ``options``), and reseal."""
    first = pq.read_table(root / name).slice(0, 1).cast(schema)
    block = pa.concat_tables([first] * rows).combine_chunks()
    with pq.ParquetWriter(root / name, schema, **options) as writer:
        for _ in range(groups):
            writer.write_table(block)
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


def _extension_link(kind: bytes) -> bytes:
    """One extension header and its data, of tar type ``kind`` (pax ``x``/``g``, GNU ``L``)."""
    if kind == b"L":
        info = tarfile.TarInfo("n" * 120)
        return info.tobuf(tarfile.GNU_FORMAT)[:1024]
    info = tarfile.TarInfo("bundle-archive.json")
    info.pax_headers = {"comment": "x"}
    block = bytearray(info.tobuf(tarfile.PAX_FORMAT)[:1024])
    block[156:157] = kind
    block[148:156] = b" " * 8
    block[148:155] = b"%06o\0" % sum(block[:512])
    return bytes(block)


def chained_archive(path: Path, kind: bytes, links: int) -> Path:
    """A gzip'd tar whose first member follows ``links`` extension headers of type ``kind``
    in a row (a few KB of archive for thousands of links)."""
    info = tarfile.TarInfo("bundle-archive.json")
    info.size = 2
    member = info.tobuf(tarfile.USTAR_FORMAT) + b"{}".ljust(512, b"\0")
    path.write_bytes(gzip.compress(_extension_link(kind) * links + member + b"\0" * 1024))
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


def kit(monkeypatch: Any, capsys: Any, *args: str) -> tuple[int, str, str]:
    """Run ``charllm-kit ARGS`` in this process through its console entry point: (exit code,
    stdout, stderr).

    ``sys.meta_path`` is restored afterwards: the CLI keeps pandas out of its process
    (kit.arrow_pandas), which later tests in this one may need.
    """
    from kit.cli.commands import main

    monkeypatch.setattr(sys, "argv", ["charllm-kit", *args])
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    capsys.readouterr()
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def one_error(code: int, err: str) -> str:
    """The one ``error:`` line of a refusal (exit code 2)."""
    assert code == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]
