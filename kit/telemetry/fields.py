"""The canonical telemetry row: its columns, their units and their Arrow types.

Every source fills rows of this one shape, whatever the vendor, so that bundles from NVIDIA,
AMD and CPU hosts can be compared column by column. Units are in the names and are SI-ish
(W, J, degrees C, MHz, percent, bytes); backends convert at their boundary. A field a source
cannot read is ``None`` (null in Parquet), never 0 or -1.
"""

from typing import Any, Literal

import pyarrow as pa

Source = Literal["gpu", "host"]
"""What a row describes: one accelerator (``device`` is its local index) or the host."""

IDENTITY_COLUMNS: tuple[str, ...] = ("t", "node", "device", "source")
"""Columns that say when and what: unix seconds, node index, device index or None, source."""

GPU_FIELDS: tuple[str, ...] = (
    "power_w",  # instantaneous board/package power
    "power_avg_w",  # the driver's own moving average (its window is in FieldInfo)
    "energy_j",  # hardware energy counter, cumulative since an arbitrary origin
    "temp_gpu_c",
    "temp_mem_c",
    "clock_sm_mhz",
    "clock_mem_mhz",
    "util_gpu_pct",
    "mem_used_bytes",
    "throttle",  # the kit's vendor-neutral throttle reason bits
    "pcie_tx_bytes",
    "pcie_rx_bytes",
    "link_tx_bytes",  # NVLink / xGMI
    "link_rx_bytes",
)
"""Canonical fields of a ``source == "gpu"`` row."""

HOST_FIELDS: tuple[str, ...] = ("cpu_util_pct", "host_mem_used_bytes", "cpu_power_w")
"""Canonical fields of a ``source == "host"`` row."""

CANONICAL_FIELDS: tuple[str, ...] = GPU_FIELDS + HOST_FIELDS
"""Every measured field, in column order."""

TELEMETRY_COLUMNS: tuple[str, ...] = IDENTITY_COLUMNS + CANONICAL_FIELDS
"""Every column of ``telemetry.parquet``, in order."""


def _arrow_type(field: str) -> pa.DataType:
    """Arrow type of one canonical field, from its unit suffix."""
    if field.endswith("_bytes") or field == "throttle":
        return pa.int64()
    return pa.float64()


TELEMETRY_ARROW_SCHEMA: pa.Schema = pa.schema(
    [
        pa.field("t", pa.float64(), nullable=False),
        pa.field("node", pa.int32(), nullable=False),
        pa.field("device", pa.int32(), nullable=True),
        pa.field("source", pa.string(), nullable=False),
    ]
    + [pa.field(f, _arrow_type(f), nullable=True) for f in CANONICAL_FIELDS]
)
"""Arrow schema of telemetry rows: identity columns, then every canonical field, nullable."""


def make_row(
    t: float, node: int, device: int | None, source: Source, **values: Any
) -> dict[str, Any]:
    """Build one canonical row: every column present, unread fields ``None``.

    Args:
        t: Sample time in unix seconds.
        node: Node index within the run.
        device: Local device index, or ``None`` for a host row.
        source: ``"gpu"`` or ``"host"``.
        **values: Canonical fields this source read, by canonical name.

    Returns:
        A dict with exactly the keys of :data:`TELEMETRY_COLUMNS`.

    Raises:
        KeyError: A key in ``values`` is not a canonical field (a typo would otherwise
            silently become a missing column).
    """
    unknown = set(values) - set(CANONICAL_FIELDS)
    if unknown:
        raise KeyError(f"not canonical telemetry fields: {sorted(unknown)}")
    row: dict[str, Any] = dict.fromkeys(TELEMETRY_COLUMNS)
    row.update(t=t, node=node, device=device, source=source, **values)
    return row
