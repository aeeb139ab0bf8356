"""Replay a recorded real telemetry trace through the sampler, for CI and demonstrations.

A trace is a ``telemetry.parquet`` of a real GPU run (tests/data/traces/, each with a README
saying how it was recorded). The source replays the trace's GPU rows tick by tick on the live
clock, so everything downstream (chunking, attribution, derived metrics) runs on real numbers
through the same code path as NVML. A ``<trace>.devices.json`` beside the trace carries the
recorded devices' static facts (power limit, max SM clock). Looping, cumulative counters go on
from where the trace ended (each loop adds the trace's advance), so they never go backwards
unless the recorded trace itself does.
"""

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pyarrow.parquet as pq

from kit.bundle.telemetry_fields import CANONICAL_FIELDS, TELEMETRY_SCHEMA
from kit.bundle.verify import CUMULATIVE_FIELDS
from kit.paths import kit_home
from kit.telemetry.base import FieldInfo, TelemetryNotSupportedError, TelemetrySource

if TYPE_CHECKING:
    from kit.config.run import RunConfig


def resolve_trace(trace: str) -> Path:
    """An absolute trace path, or one relative to the kit's home (the repository root)."""
    path = Path(trace)
    return path if path.is_absolute() else kit_home() / path


class ReplaySource(TelemetrySource):
    """Emit a recorded trace's GPU rows at the live time, looping at its end."""

    name: ClassVar[str] = "replay"
    reads_devices: ClassVar[bool] = True

    @classmethod
    def plan(cls, cfg: "RunConfig", node: int) -> dict[str, Any]:
        """The platform's recorded trace (``replay_trace``) for ``node``."""
        return {"node": node, "trace": cfg.platform.replay_trace}

    def __init__(self, node: int, trace: str, speed: float = 1.0) -> None:
        """Load ``trace``.

        Args:
            node: Node index written into the rows.
            trace: Path of a recorded ``telemetry.parquet`` (absolute or kit-home relative).
            speed: Trace seconds replayed per live second.

        Raises:
            TelemetryNotSupportedError: The trace is missing or has no GPU rows.
        """
        path = resolve_trace(trace)
        if not path.is_file():
            raise TelemetryNotSupportedError(f"replay trace not found: {path}")
        table = pq.read_table(path, schema=TELEMETRY_SCHEMA)
        rows = [r for r in table.to_pylist() if r["source"] == "gpu"]
        if not rows:
            raise TelemetryNotSupportedError(f"replay trace {path} has no GPU rows")
        rows.sort(key=lambda r: (r["t"], r["device"]))
        self._node, self._speed, self._path = node, speed, path
        self._ticks = np.array(sorted({r["t"] for r in rows}))
        self._by_tick: dict[float, list[dict[str, Any]]] = {}
        for r in rows:
            self._by_tick.setdefault(r["t"], []).append(r)
        self._span = float(self._ticks[-1] - self._ticks[0]) or 1.0
        self._present = {f for f in CANONICAL_FIELDS if any(r[f] is not None for r in rows)}
        self._loop_advance: dict[tuple[int, str], float] = {}
        for f in CUMULATIVE_FIELDS:
            for device in {r["device"] for r in rows}:
                seen = [r[f] for r in rows if r["device"] == device and r[f] is not None]
                if seen:
                    self._loop_advance[(device, f)] = seen[-1] - seen[0]
        self._t0: float | None = None
        sidecar = path.with_name(path.stem + ".devices.json")
        self._devices = json.loads(sidecar.read_text()) if sidecar.is_file() else []

    def fields(self) -> dict[str, FieldInfo]:
        """Fields the recorded trace carries."""
        return {
            f: FieldInfo(True) if f in self._present
            else FieldInfo(False, reason=f"not in the recorded trace {self._path.name}")
            for f in CANONICAL_FIELDS if f not in ("cpu_util_pct", "host_mem_used_bytes",
                                                   "cpu_power_w")
        }

    def devices(self) -> list[dict[str, Any]]:
        """The recorded devices' static facts, from the trace's sidecar file."""
        return list(self._devices)

    def sample(self, t: float) -> list[dict[str, Any]]:
        """The recorded rows of the tick at the same offset into the trace (looping)."""
        if self._t0 is None:
            self._t0 = t
        loops, offset = divmod((t - self._t0) * self._speed, self._span)
        i = int(np.searchsorted(self._ticks, self._ticks[0] + offset, side="right")) - 1
        rows = [{**r, "t": t, "node": self._node} for r in self._by_tick[self._ticks[max(i, 0)]]]
        for row in rows:
            for f in CUMULATIVE_FIELDS:
                if row[f] is not None and loops:
                    row[f] += type(row[f])(loops * self._loop_advance[(row["device"], f)])
        return rows

    def close(self) -> None:
        """Nothing to release."""
