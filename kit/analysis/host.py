"""A run's host figures from ``telemetry.parquet``'s host rows: CPU busy share and memory used.

On a CPU host they are what there is (no GPU power, clocks or temperatures), so ``bundle show``,
``compare`` and ``report`` show them beside the device figures. Both are taken over the
measured steps' window (the whole run when it has no measured step), over every node.
"""

import pyarrow as pa
import pyarrow.compute as pc

from kit.bundle.reader import Bundle
from kit.errors import BundleError
from kit.plan.memory import GIB
from kit.projection.file import projection_of

CPU_UTIL = "cpu_util_pct_mean"
HOST_MEM = "mem_used_gib_peak"


def _window(steps: pa.Table) -> tuple[float, float] | None:
    measured = steps.filter(pc.equal(steps["phase"], "measured"))
    if measured.num_rows == 0:
        return None
    return pc.min(measured["t_start"]).as_py(), pc.max(measured["t_end"]).as_py()


def host_figures(bundle: Bundle) -> dict[str, float | None]:
    """Mean host CPU utilisation (0..100 %) and peak host memory in use (GiB) of a run; None
    for a figure no host row measured (and for a projection, which has no telemetry)."""
    empty: dict[str, float | None] = {CPU_UTIL: None, HOST_MEM: None}
    if projection_of(bundle) is not None:
        return empty
    try:
        telemetry, window = bundle.telemetry, _window(bundle.steps)
    except BundleError:  # an unverified bundle's unreadable file: nothing to show
        return empty
    rows = telemetry.filter(pc.equal(telemetry["source"], "host"))
    if window is not None:
        inside = pc.and_(pc.greater_equal(rows["t"], window[0]),
                         pc.less_equal(rows["t"], window[1]))
        rows = rows.filter(inside) if pc.any(inside).as_py() else rows
    util = pc.mean(rows["cpu_util_pct"]).as_py() if rows.num_rows else None
    mem = pc.max(rows["host_mem_used_bytes"]).as_py() if rows.num_rows else None
    return {CPU_UTIL: util, HOST_MEM: None if mem is None else mem / GIB}
