"""The one interface every telemetry backend implements, and the errors callers catch.

Callers (the sampler, the bundle writer) see only :class:`TelemetrySource` and
:class:`TelemetryError`; each backend converts its vendor library's exceptions into these at
its boundary, so nothing above it ever catches ``pynvml.NVMLError`` or an AMD SMI exception.
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from kit.errors import KitError


class TelemetryError(KitError):
    """A telemetry source failed to start or to read."""


class TelemetryNotSupportedError(TelemetryError):
    """This host, device or driver does not offer what was asked; the message says why."""


@dataclass(frozen=True)
class FieldInfo:
    """What a source can say about one canonical field.

    Attributes:
        readable: Whether the source fills this field on this host.
        reason: Why it cannot, when ``readable`` is False (e.g. "permission denied ...");
            when readable, an optional note on how it is read (e.g. a fallback counter).
        update_period_ms: How often the underlying counter refreshes, in milliseconds, when
            known; ``None`` when unknown. Sampling faster than this repeats values.
        read_period_ms: The least time between two reads of this field when the source reads
            it less often than every tick (a slow query); ``None`` when read every tick.
    """

    readable: bool
    reason: str | None = None
    update_period_ms: float | None = None
    read_period_ms: float | None = None

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-ready dict of the attributes."""
        return {
            "readable": self.readable,
            "reason": self.reason,
            "update_period_ms": self.update_period_ms,
        }


class TelemetrySource(ABC):
    """One backend that reads counters of one node: its GPUs, or its host.

    A source is built inside the sampler's process, sampled once per tick, and closed at the
    end. Constructors raise :class:`TelemetryNotSupportedError` when the backend cannot run at
    all here; a backend that runs but lacks some fields reports them as unreadable in
    :meth:`fields` and writes ``None`` for them.
    """

    name: ClassVar[str]
    """Short backend name, as in the registry (e.g. ``"host"``)."""

    @abstractmethod
    def fields(self) -> dict[str, FieldInfo]:
        """Return, for each canonical field this backend knows of, whether it is readable.

        Called once after construction and again after the last :meth:`sample` (before
        :meth:`close`): the second answer is the final verdict, with what the backend learned
        while sampling (an energy counter that failed its check, a field lost mid-run and
        when, counter wraps and resets). A field that gave values before it was lost stays
        readable, with the loss in its reason.
        """

    @abstractmethod
    def sample(self, t: float) -> list[dict[str, Any]]:
        """Read every counter once.

        Args:
            t: The sampler's tick time in unix seconds; every row of this tick carries it.

        Returns:
            One canonical row (see :func:`kit.telemetry.fields.make_row`) per device, or one
            for the host.

        Raises:
            TelemetryError: A read failed in a way the backend cannot contain; the sampler
                records it and drops this source. A backend that isolates failures per device
                (AMD SMI) writes ``None`` instead and reports the loss in :meth:`fields`.
        """

    def devices(self) -> list[dict[str, Any]]:
        """Static facts about each device this source samples, read once at start.

        Keys (missing ones omitted): ``device`` (local index, as in the rows), ``name``,
        ``uuid``, ``power_limit_w`` (enforced limit), ``clock_sm_max_mhz``,
        ``memory_total_bytes``. Derived metrics need the power limit (excursions) and the max
        SM clock (clock fraction). A host source has none.
        """
        return []

    @abstractmethod
    def close(self) -> None:
        """Release handles and libraries; the source is not sampled afterwards."""
