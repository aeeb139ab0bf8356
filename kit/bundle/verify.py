"""Verify a bundle end to end: checksums, file list, JSON models, parquet schemas, counters.

A cumulative telemetry counter that goes backwards fails verification too: the backends unwrap
their registers' wraps, so a drop in a bundle is a recording error (the committed H100 bundle
of 2026-11-22 has one: a 32-bit PCIe counter written before wraps were handled).
"""

import re
from pathlib import Path, PurePosixPath

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kit.bundle.reader import (
    bundle_dir,
    read_bundle,
    read_schema_version,
    read_table,
)
from kit.bundle.schema import EXPERTS_FILE, EXPERTS_SCHEMA, STEPS_SCHEMA
from kit.bundle.telemetry_fields import TELEMETRY_SCHEMA
from kit.bundle.writer import SUMS_NAME, bundle_files, file_sha256
from kit.errors import BundleError
from kit.neutralize import has_control

_SUMS_LINE = re.compile(r"([0-9a-f]{64})  (.+)")

CUMULATIVE_FIELDS = ("energy_j", "pcie_tx_bytes", "pcie_rx_bytes", "link_tx_bytes",
                     "link_rx_bytes", "viol_power_s", "viol_thermal_s")
"""Telemetry columns that count up: per device, a later row never holds less than an earlier
one (the backends unwrap their registers' wraps, ``kit/telemetry/counters.py``)."""


def _read_sums(root: Path) -> dict[str, str]:
    """Parse ``SHA256SUMS`` into relative path -> hex digest, refusing anything odd."""
    path = root / SUMS_NAME
    if not path.is_file():
        raise BundleError(f"bundle {root}: {SUMS_NAME} is missing")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise BundleError(f"bundle {root}: {SUMS_NAME} is not UTF-8 text") from None
    sums: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        match = _SUMS_LINE.fullmatch(line)
        if not match:
            raise BundleError(f"bundle {root}: {SUMS_NAME} line {number} is malformed")
        digest, rel = match.groups()
        listed = PurePosixPath(rel)
        if listed.is_absolute() or ".." in listed.parts or rel in sums or rel == SUMS_NAME:
            raise BundleError(f"bundle {root}: {SUMS_NAME} line {number} lists {rel!r} wrongly")
        sums[rel] = digest
    return sums


def _check_cumulative(root: Path, telemetry: pa.Table) -> None:
    """Refuse a cumulative counter that goes backwards on any device, naming where.

    Raises:
        BundleError: The first counter (in :data:`CUMULATIVE_FIELDS` order) found lower than
            the device's previous reading of it.
    """
    order = pc.sort_indices(telemetry, [("node", "ascending"), ("device", "ascending"),
                                        ("t", "ascending")])
    rows = telemetry.take(order)
    node = rows["node"].to_numpy()
    device = pc.fill_null(rows["device"], -1).to_numpy()
    t = rows["t"].to_numpy()
    for name in CUMULATIVE_FIELDS:
        column = rows[name]
        seen = np.flatnonzero(pc.is_valid(column).to_numpy(zero_copy_only=False))
        values = pc.fill_null(column, 0).to_numpy()[seen]
        same = (node[seen][1:] == node[seen][:-1]) & (device[seen][1:] == device[seen][:-1])
        back = np.flatnonzero(same & (values[1:] < values[:-1]))
        if back.size:
            i = back[0]
            where = f"node {node[seen][i + 1]} device {device[seen][i + 1]}"
            raise BundleError(
                f"bundle {root}: telemetry.parquet: cumulative counter {name} goes backwards "
                f"on {where} at t={t[seen][i + 1]:.3f} ({values[i]} -> {values[i + 1]})"
            )


def verify_bundle(path: str | Path) -> list[str]:
    """Check that a bundle is complete, untouched and readable by this kit.

    Args:
        path: The bundle directory.

    Returns:
        The files whose checksums matched, as sorted relative paths.

    Raises:
        BundleError: The first problem found, in one line naming the file: missing
            ``SHA256SUMS``, a listed file missing, a checksum mismatch, an unlisted file, JSON
            that fails its model (or is newer than this kit), a parquet file of another schema
            or with a data page that does not decode (what compare and report would hit),
            a cumulative telemetry counter that goes backwards (:data:`CUMULATIVE_FIELDS`).
    """
    root = bundle_dir(path)
    read_schema_version(root)  # a newer layout is named as such, not as a broken file
    sums = _read_sums(root)
    present = set(bundle_files(root))
    odd = sorted(f for f in present if has_control(f))
    if odd:
        raise BundleError(f"bundle {root}: file name {odd[0]!r} holds a control character")
    for rel, digest in sorted(sums.items()):
        if rel not in present:
            raise BundleError(f"bundle {root}: missing file {rel}")
        if file_sha256(root / rel) != digest:
            raise BundleError(f"bundle {root}: checksum mismatch: {rel}")
    unlisted = sorted(present - set(sums))
    if unlisted:
        raise BundleError(f"bundle {root}: unlisted file: {unlisted[0]}")
    read_bundle(root)
    read_table(root, "steps.parquet", STEPS_SCHEMA)  # every data page decoded, as readers do
    if EXPERTS_FILE in sums:
        read_table(root, EXPERTS_FILE, EXPERTS_SCHEMA)
    _check_cumulative(root, read_table(root, "telemetry.parquet", TELEMETRY_SCHEMA))
    return sorted(sums)
