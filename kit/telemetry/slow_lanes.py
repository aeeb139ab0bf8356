"""Slow reads off the fast path: each :class:`~kit.telemetry.base.SlowReader` on a thread.

The sampler's own loop reads every source's fast fields each tick; a slow query (NVML's energy
counter or per-link NVLink counters take 1-13 ms per device) would stall it, and with it every
fast field of every device, more with each device. Each slow reader (one device's slow fields)
gets a :class:`SlowLane` instead: a thread that reads each field at its own period and hands
its rows to the loop through a queue. Vendor libraries release the GIL while they wait on the
driver, so the lanes of several devices overlap each other and the loop.
"""

import math
import threading
import time
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any

from kit.telemetry.base import EDGE_FIELDS, SlowReader

GROUP_S = 0.001
"""Fields due within this many seconds of each other are read together, into one row."""


class SamplerClock:
    """Unix seconds derived from the monotonic clock, shared by the loop and every lane, so a
    wall-clock step (NTP) cannot reorder rows and all rows share one time base."""

    def __init__(self) -> None:
        self.wall0, self.mono0 = time.time(), time.monotonic()

    def unix(self, mono: float) -> float:
        """The unix time of monotonic time ``mono``."""
        return self.wall0 + (mono - self.mono0)


ErrorSink = Callable[[float, str, str, BaseException], None]
"""``(t, source, what, error)``: where a lane reports the failure that ended it."""


class SlowLane:
    """Reads one slow reader's fields on a daemon thread, each at its own period.

    Reads are scheduled at ``start + k * period`` per field, so the period does not drift with
    the time a read takes; a read that overruns skips the slots it missed rather than bursting.
    Fields due together are read in one call and land in one row, timed at the read's start.
    The lane ends when stopped, when the reader returns ``None`` (nothing left to read), or
    when it raises (reported to ``on_error``).

    Args:
        source: Name of the source the reader belongs to (rows are queued with it).
        reader: What to read, and how often.
        clock: The sampler's clock.
        out: Where rows go, as ``(source, row)``.
        on_error: Where a failure of the reader is reported.
    """

    def __init__(self, source: str, reader: SlowReader, clock: SamplerClock,
                 out: "SimpleQueue[tuple[str, dict[str, Any]]]", on_error: ErrorSink) -> None:
        self.source = source
        self._reader = reader
        self._clock = clock
        self._out = out
        self._on_error = on_error
        self._wake = threading.Event()
        self._stopping = False
        self._edge = False
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"telemetry {source} {reader.label}")

    def start(self) -> None:
        """Start reading."""
        self._thread.start()

    def stop(self) -> None:
        """Ask the lane to end after the read in progress, if any."""
        self._stopping = True
        self._wake.set()

    def poke(self) -> None:
        """Ask for its :data:`~kit.telemetry.base.EDGE_FIELDS` to be read now, off schedule:
        the measured phase starts or ends (:mod:`kit.telemetry.edges`)."""
        self._edge = True
        self._wake.set()

    def read_edges(self) -> None:
        """Read the edge fields once, on the caller's thread: the lane has ended and the
        sampler stops, so the last reading comes after the run's last step."""
        edges = frozenset(EDGE_FIELDS & set(self._reader.periods_ms))
        if edges:
            self._read(edges)

    def join(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the lane to end; whether it did."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _read(self, fields: frozenset[str]) -> bool:
        """Read ``fields`` once and queue the row; whether the lane may go on."""
        try:
            row = self._reader.read(self._clock.unix(time.monotonic()), fields)
        except Exception as e:  # noqa: BLE001 - reported; the fast fields go on.
            self._on_error(self._clock.unix(time.monotonic()), self.source,
                           f"slow reads of {self._reader.label} stopped: ", e)
            return False
        if row is None:
            return False
        if any(row[f] is not None for f in fields):  # all null (resets, losses): no row
            self._out.put((self.source, row))
        return True

    def _run(self) -> None:
        periods = {name: ms / 1e3 for name, ms in self._reader.periods_ms.items()}
        edges = frozenset(EDGE_FIELDS & set(periods))
        slot = dict.fromkeys(periods, 0)
        start = time.monotonic()
        while True:
            due = min(start + slot[f] * periods[f] for f in periods)
            self._wake.wait(max(0.0, due - time.monotonic()))
            self._wake.clear()
            if self._stopping:
                return
            now = time.monotonic()
            fields = frozenset(f for f in periods if start + slot[f] * periods[f] <= now + GROUP_S)
            if self._edge:
                self._edge = False
                fields |= edges
            if not fields:
                continue
            if not self._read(fields):
                return
            after = time.monotonic()
            for f in fields:
                slot[f] = max(slot[f] + 1, math.floor((after - start) / periods[f]) + 1)
