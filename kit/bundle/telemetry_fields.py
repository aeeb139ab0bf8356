"""The canonical telemetry row: its columns, their units and their Arrow types.

Every source fills rows of this one shape, whatever the vendor, so that bundles from NVIDIA,
AMD and CPU hosts can be compared column by column. Units are in the names and are SI-ish
(W, J, degrees C, MHz, percent, bytes); backends convert at their boundary. A field a source
cannot read is ``None`` (null in Parquet), never 0 or -1.
"""

from typing import Any, Literal

import pyarrow as pa

THROTTLE_BITS: dict[str, int] = {
    "power_cap": 1,  # software power cap (NVML SwPowerCap)
    "thermal_sw": 2,  # driver lowers clocks for temperature (NVML SwThermalSlowdown)
    "thermal_hw": 4,  # hardware thermal protection (NVML HwThermalSlowdown)
    "hw_slowdown": 8,  # other hardware slowdown, e.g. an external signal (NVML HwSlowdown)
    "power_brake": 16,  # external power brake asserted (NVML HwPowerBrakeSlowdown)
    "other": 32,  # any vendor reason that has no kit bit
}
"""The kit's vendor-neutral throttle reason bits, OR-ed into telemetry ``throttle``."""


def column(name: str, dtype: pa.DataType, doc: str, nullable: bool = True) -> pa.Field:
    """Build a parquet column whose description travels in the file's field metadata."""
    return pa.field(name, dtype, nullable=nullable, metadata={"description": doc})


_GPU_COLUMNS: list[pa.Field] = [
    column("power_w", pa.float64(), "Instantaneous board power, watts."),
    column("power_avg_w", pa.float64(), "Driver's windowed average power, watts."),
    column("energy_j", pa.float64(), "Hardware energy counter, cumulative joules."),
    column("temp_gpu_c", pa.float64(), "GPU temperature, deg C (which sensor: telemetry_sources)."),
    column("temp_mem_c", pa.float64(), "Device memory (HBM) temperature, deg C."),
    column("clock_sm_mhz", pa.float64(), "SM / graphics clock, MHz."),
    column("clock_mem_mhz", pa.float64(), "Memory clock, MHz."),
    column("util_gpu_pct", pa.float64(), "Driver's busy percentage, 0..100."),
    column("mem_used_bytes", pa.int64(), "Device memory in use, bytes."),
    column("throttle", pa.int64(), "Active throttle reasons, OR of THROTTLE_BITS."),
    column("pcie_tx_bytes", pa.int64(), "PCIe bytes sent since the sampler started (counter)."),
    column("pcie_rx_bytes", pa.int64(), "PCIe bytes received since the sampler started."),
    column("link_tx_bytes", pa.int64(), "NVLink/xGMI bytes sent since the sampler started."),
    column("link_rx_bytes", pa.int64(), "NVLink/xGMI bytes received since the sampler started."),
    column("viol_power_s", pa.float64(), "Cumulative time clocks were held by the power limit "
           "(NVML violation counter), seconds."),
    column("viol_thermal_s", pa.float64(), "Cumulative time clocks were held by a thermal "
           "limit (NVML violation counter), seconds."),
]
_HOST_COLUMNS: list[pa.Field] = [
    column("cpu_util_pct", pa.float64(), "Host CPU busy percentage over all cores, 0..100."),
    column("host_mem_used_bytes", pa.int64(), "Host memory in use, bytes."),
    column("cpu_power_w", pa.float64(), "CPU package power from RAPL, watts."),
]

TELEMETRY_FIELDS: tuple[str, ...] = tuple(f.name for f in _GPU_COLUMNS + _HOST_COLUMNS)
"""Canonical telemetry fields, the keys of ``Manifest.telemetry_sources``."""

TELEMETRY_SCHEMA = pa.schema(
    [
        column("t", pa.float64(), "Sample time, unix seconds, on node 0's clock (other nodes' "
               "own times plus their inventory[].clock.applied_s).", False),
        column("node", pa.int32(), "Node index (position in Manifest.inventory).", False),
        column("device", pa.int32(), "Local device index; null on host rows."),
        column("source", pa.string(), "'gpu' (one device) or 'host' (the node).", False),
        *_GPU_COLUMNS,
        *_HOST_COLUMNS,
    ]
)
"""``telemetry.parquet``: one row per sample per device, plus host rows; null = not measured."""



Source = Literal["gpu", "host"]
"""What a row describes: one accelerator (``device`` is its local index) or the host."""

IDENTITY_COLUMNS: tuple[str, ...] = ("t", "node", "device", "source")
"""Columns that say when and what: unix seconds, node index, device index or None, source."""

CANONICAL_FIELDS: tuple[str, ...] = TELEMETRY_FIELDS
"""Every measured field, in column order."""

TELEMETRY_ARROW_SCHEMA: pa.Schema = TELEMETRY_SCHEMA
"""Arrow schema of telemetry rows (``telemetry.parquet`` in a bundle)."""

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
