"""The one interface every telemetry backend implements, and the errors callers catch.

Callers (the sampler, the bundle writer) see only :class:`TelemetrySource` and
:class:`TelemetryError`; each backend converts its vendor library's exceptions into these at
its boundary, so nothing above it ever catches ``pynvml.NVMLError`` or an AMD SMI exception.
"""

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from kit.errors import KitError

if TYPE_CHECKING:
    from kit.config.run import RunConfig


class TelemetryError(KitError):
    """A telemetry source failed to start or to read."""


class TelemetryNotSupportedError(TelemetryError):
    """This host, device or driver does not offer what was asked; the message says why."""


ErrorHints = dict[str, tuple[type[TelemetryError], str | None]]
"""A vendor library's status names -> the kit exception each becomes and how to fix it."""


def vendor_error(
    what: str, message: str, has_status: Callable[[str], bool], hints: ErrorHints
) -> TelemetryError:
    """The kit's exception for a vendor library's error.

    Args:
        what: What was being done ("nvmlInit", "device 3: power").
        message: The vendor exception's text, on one line.
        has_status: Whether the vendor exception carries the status of this name.
        hints: The backend's status names with their exception class and fix.
    """
    for name, (cls, hint) in hints.items():
        if has_status(name):
            return cls(f"{what}: {message}" + (f" ({hint})" if hint else ""))
    return TelemetryError(f"{what}: {message}")


@contextmanager
def vendor_errors(
    error_type: type[Exception], convert: Callable[[Exception], TelemetryError]
) -> Iterator[None]:
    """Re-raise any ``error_type`` inside the block as ``convert(error)``."""
    try:
        yield
    except error_type as e:
        raise convert(e) from e


def by_device(reasons: Iterable[tuple[int, str]]) -> str:
    """``device 0,1: why; device 2: other why``: one entry per distinct reason, in first-seen
    order, naming the devices it applies to."""
    grouped: dict[str, list[int]] = {}
    for index, reason in reasons:
        grouped.setdefault(reason, []).append(index)
    return "; ".join(f"device {','.join(map(str, idx))}: {r}" for r, idx in grouped.items())


@dataclass(frozen=True)
class FieldInfo:
    """What a source can say about one canonical field.

    Attributes:
        readable: Whether the source fills this field on this host.
        reason: Why it cannot, when ``readable`` is False (e.g. "permission denied ...");
            when readable, an optional note on how it is read (e.g. a fallback counter).
        update_period_ms: How often the underlying counter refreshes, in milliseconds, when
            known; ``None`` when unknown. Sampling faster than this repeats values.
        read_period_ms: The period at which the sampler reads this field off the fast path
            (a slow query: see :class:`SlowReader`); ``None`` when it is read every tick.
    """

    readable: bool
    reason: str | None = None
    update_period_ms: float | None = None
    read_period_ms: float | None = None


EDGE_FIELDS = frozenset({"energy_j"})
"""Slow fields read again, off schedule, when the measured phase starts and ends and when the
sampler stops, so that their readings bracket the measured span (kit.metrics.energy)."""


@dataclass(frozen=True)
class SlowReader:
    """A group of slow fields (e.g. one device's cumulative counters), read off the fast path.

    A slow query (an energy counter, per-link byte counters) read inside every tick would
    stall every other field of every device; the sampler instead gives each slow reader a
    thread of its own that reads each field at its own period, so a slow read never delays a
    fast row and the fast period does not grow with the number of devices.

    Attributes:
        label: What it reads, for errors and thread names (e.g. ``"device 3"``).
        periods_ms: Each field it reads and the period to read it at, in milliseconds.
        read: ``read(t, fields)`` reads ``fields`` (a subset of ``periods_ms``, those due now)
            once, at unix time ``t``, and returns one canonical row (:func:`make_row`) holding
            them (a row whose fields are all null is not written), or ``None`` when there is
            nothing left to read (e.g. the device was lost: its thread then ends). Called from
            the reader's own thread; must not touch what :meth:`TelemetrySource.sample` reads.
    """

    label: str
    periods_ms: Mapping[str, float]
    read: Callable[[float, frozenset[str]], dict[str, Any] | None]


class TelemetrySource(ABC):
    """One backend that reads counters of one node: its GPUs, or its host.

    A source is built inside the sampler's process, sampled once per tick (its fast fields),
    its :meth:`slow_readers` each read on a thread of their own, and closed at the end.
    Constructors raise :class:`TelemetryNotSupportedError` when the backend cannot run at all
    here; a backend that runs but lacks some fields reports them as unreadable in
    :meth:`fields` and writes ``None`` for them.
    """

    name: ClassVar[str]
    """Short backend name, as in the registry (e.g. ``"host"``)."""

    reads_devices: ClassVar[bool] = False
    """Whether it writes accelerator (``gpu``) rows rather than host rows."""

    @classmethod
    def plan(cls, cfg: "RunConfig", node: int) -> dict[str, Any]:
        """Constructor keyword arguments for sampling ``node`` of the run ``cfg`` (picklable:
        the sampler builds the source in its own process). For a device backend, the devices
        the node's ranks run on, by driver index (the visible-device variables honoured)."""
        from kit.telemetry.devices import run_device_indices

        kwargs: dict[str, Any] = {"node": node}
        if cls.reads_devices:
            kwargs["devices"] = run_device_indices(cfg.devices_per_node)
        return kwargs

    @classmethod
    def probe(cls) -> tuple[str, ...]:
        """This host's accelerators as the backend's library names them, for platform
        detection; empty when it finds none or reads no devices. Never raises."""
        return ()

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
        """Read every fast field once (the slow ones are read through :meth:`slow_readers`).

        Args:
            t: The sampler's tick time in unix seconds; every row of this tick carries it.

        Returns:
            One canonical row (see :func:`kit.bundle.telemetry_fields.make_row`) per device, or one
            for the host.

        Raises:
            TelemetryError: A read failed in a way the backend cannot contain; the sampler
                records it and drops this source. A backend that isolates failures per device
                (AMD SMI) writes ``None`` instead and reports the loss in :meth:`fields`.
        """

    def slow_readers(self) -> list[SlowReader]:
        """The slow fields, grouped by what may be read together (e.g. per device); none by
        default. Their rows carry only those fields; :meth:`sample`'s rows leave them null."""
        return []

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


def sample_once(source: TelemetrySource, t: float) -> list[dict[str, Any]]:
    """Every field of ``source`` read once at ``t``: its fast sample, each slow reader's fields
    filled into the row of the same device.

    For probes and tests that read a source without the sampler (which reads the slow fields
    on threads of their own, in rows of their own).
    """
    rows = source.sample(t)
    by_device = {r["device"]: r for r in rows}
    for reader in source.slow_readers():
        slow = reader.read(t, frozenset(reader.periods_ms))
        if slow is None:
            continue
        row = by_device.get(slow["device"])
        if row is None:
            by_device[slow["device"]] = slow
            rows.append(slow)
        else:
            row.update({k: v for k, v in slow.items() if k in reader.periods_ms})
    return rows
