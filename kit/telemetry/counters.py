"""Cumulative hardware counters, unwrapped: the one place every backend accumulates them.

Energy, link bytes and throttle residency are read from fixed-width registers that only count
up, so each one wraps to zero when it overflows: NVML's PCIe byte counters are 32-bit (the
committed H100 bundle ``20261122T094016Z-gpt3-1.3b-h100-e955a2`` shows one wrapping 32 s into
the run, recorded before this module existed), RAPL's ``energy_uj`` wraps at
``max_energy_range_uj``, and gpu_metrics' throttle residency counters are 32-bit in the kernel
although AMD SMI widens them to 64. A backend feeds every raw reading of such a counter to a
:class:`WrappingCounter`, which turns it into a total that never decreases.

A reading below the previous one is a *wrap* when the advance it implies (new + modulus - old)
is under half the modulus, the rule of serial number arithmetic (RFC 1982): a counter that
advanced by more than half its range between two reads cannot be told from one that went
backwards. Any other drop is a *reset* (a driver reload, a GPU reset, or a firmware bug such as
ROCm/amdsmi#115's energy counter running backwards): the interval's advance is unknown, so that
reading gives ``None``, the count goes on from the new value, and the event is kept for the
field's reason in the bundle.

A wrap between two reads is only seen if the counter wraps at most once in between: a 32-bit
byte counter wraps every 67 ms at 64 GB/s, so it must be read more often than that on a busy
link, or its bytes alias silently.
"""

from dataclasses import dataclass
from typing import Literal

EventKind = Literal["wrap", "reset"]
"""What a drop in a counter's raw reading was: a wrap past its modulus, or a reset."""


@dataclass(frozen=True)
class CounterEvent:
    """One drop in a counter's raw reading.

    Attributes:
        t: Time of the reading that dropped, unix seconds.
        kind: ``"wrap"`` (counted through the modulus) or ``"reset"`` (not counted).
        before: The previous raw reading.
        after: The raw reading that was lower.
    """

    t: float
    kind: EventKind
    before: float
    after: float


def modulus_of_bits(bits: int) -> int:
    """The modulus of an unsigned ``bits``-wide register: where it wraps to zero."""
    return 1 << bits


class WrappingCounter:
    """One raw hardware counter (one link, one package), accumulated across wraps.

    Args:
        modulus: The raw value at which the counter wraps to zero (``2**32`` for a 32-bit
            register); ``None`` for a counter that does not wrap in practice, so that any drop
            is a reset.

    Attributes:
        events: Every drop seen, in order.
    """

    def __init__(self, modulus: float | None) -> None:
        if modulus is not None and modulus <= 0:
            raise ValueError(f"a counter's modulus must be positive, not {modulus}")
        self._modulus = modulus
        self._last: float | None = None
        self._advance = 0
        self.events: list[CounterEvent] = []

    def update(self, raw: float, t: float) -> float | None:
        """Take one raw reading; return the counter's advance since its first reading.

        Args:
            raw: The register's value, in its own units.
            t: When it was read, unix seconds (kept with any wrap or reset).

        Returns:
            Raw units counted since the first reading (0 for the first), never less than the
            previous return; ``None`` when this reading is a reset, whose interval is unknown.
        """
        last, self._last = self._last, raw
        if last is None:
            return 0
        step = raw - last
        if step < 0:
            wrapped = None if self._modulus is None else step + self._modulus
            if wrapped is None or wrapped >= self._modulus / 2:
                self.events.append(CounterEvent(t, "reset", last, raw))
                return None
            self.events.append(CounterEvent(t, "wrap", last, raw))
            step = wrapped
        self._advance += step
        return self._advance

    @property
    def advance(self) -> float:
        """Raw units counted since the first reading, as of the last one (after a reset too)."""
        return self._advance


def describe_events(counters: list[WrappingCounter], what: str) -> str | None:
    """One sentence on the wraps and resets of a field's counters, for its reason.

    Args:
        counters: The counters that feed one field (one per link, device or package).
        what: How the counter is named in the sentence, e.g. ``"device 0 pcie_tx_bytes"``.

    Returns:
        ``None`` when no counter dropped; else how many wraps (counted) and resets (an
        interval not counted) there were and when the first of each happened.
    """
    events = sorted((e for c in counters for e in c.events), key=lambda e: e.t)
    parts = []
    for kind, meaning in (
        ("wrap", "counted through the wrap"),
        ("reset", "went backwards, not a wrap: that interval is not counted"),
    ):
        seen = [e for e in events if e.kind == kind]
        if seen:
            first = seen[0]
            parts.append(
                f"{what}: {len(seen)} {kind}{'s' if len(seen) > 1 else ''}, the first at "
                f"t={first.t:.3f} ({first.before:.0f} -> {first.after:.0f}): {meaning}"
            )
    return "; ".join(parts) or None
