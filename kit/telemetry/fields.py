"""The canonical telemetry row: its columns, their units and their Arrow types.

Every source fills rows of this one shape, whatever the vendor, so that bundles from NVIDIA,
AMD and CPU hosts can be compared column by column. Units are in the names and are SI-ish
(W, J, degrees C, MHz, percent, bytes); backends convert at their boundary. A field a source
cannot read is ``None`` (null in Parquet), never 0 or -1.
"""

from typing import Any, Literal

import pyarrow as pa

from kit.bundle.schema import TELEMETRY_FIELDS, TELEMETRY_SCHEMA

Source = Literal["gpu", "host"]
"""What a row describes: one accelerator (``device`` is its local index) or the host."""

IDENTITY_COLUMNS: tuple[str, ...] = ("t", "node", "device", "source")
"""Columns that say when and what: unix seconds, node index, device index or None, source."""

CANONICAL_FIELDS: tuple[str, ...] = TELEMETRY_FIELDS
"""Every measured field, in column order (defined with units in :mod:`kit.bundle.schema`)."""

TELEMETRY_ARROW_SCHEMA: pa.Schema = TELEMETRY_SCHEMA
"""Arrow schema of telemetry rows; the bundle format owns it."""

TELEMETRY_COLUMNS: tuple[str, ...] = tuple(TELEMETRY_ARROW_SCHEMA.names)
"""Every column of ``telemetry.parquet``, in order."""


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
