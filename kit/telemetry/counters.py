"""Cumulative hardware counters, unwrapped: the one place every backend accumulates them.

Energy, link bytes and throttle residency are read from fixed-width registers that only count
up, so each one wraps to zero when it overflows: NVML's PCIe byte counters are 32-bit (the
H100 bundle ``tests/data/bundles/20261122T094016Z-gpt3-1.3b-h100-e955a2`` shows one wrapping
32 s into the run, recorded before this module existed), RAPL's ``energy_uj`` wraps at
``max_energy_range_uj``, and gpu_metrics' throttle residency counters are 32-bit in the kernel
although AMD SMI widens them to 64. A backend feeds every raw reading of such a counter to a
:class:`WrappingCounter`, which turns it into a total that never decreases.

What a reading below the previous one means depends on the register's width. A narrow register
(32-bit bytes, RAPL's ~2^38 uJ) wraps within a run, so every drop is a *wrap*, counted through
the modulus. A 64-bit one cannot wrap within any run (2^64 bytes, or 2^64 x 15 uJ), so a drop is
a *reset*: a driver reload, a GPU reset, or a firmware bug such as ROCm/amdsmi#115's energy
counter running backwards. A reset's interval is unknown: that reading gives ``None``, the count
goes on from the new value, and the event is kept for the field's reason in the bundle.

A narrow register must be read before it wraps twice, or its count aliases silently: a 32-bit
byte counter holds 4 GiB, so read every 100 ms it is exact up to 42.9 GB/s. On one H100 a
23.8 GB/s copy loop wrapped NVML's PCIe TX counter 20 times in 3 s; unwrapped, it came to 1.19x
the bytes copied (RX 1.08x: the counters count more than the payload), with no reading lost
(``benchmarks/telemetry/results/nvml-counter-widths-h100.txt``).
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


WIDE_BITS = 64
"""Registers this wide or wider cannot wrap within a run: a drop in one is a reset."""


def modulus_of_bits(bits: int) -> int | None:
    """The modulus to give :class:`WrappingCounter` for an unsigned ``bits``-wide register.

    Returns:
        ``2**bits`` for a narrow register, ``None`` for one of :data:`WIDE_BITS` or more.
    """
    return None if bits >= WIDE_BITS else 1 << bits


class WrappingCounter:
    """One raw hardware counter (one link, one package), accumulated across wraps.

    Args:
        modulus: For a narrow register, the raw value at which it wraps to zero (``2**32``
            for a 32-bit one): every drop is then a wrap. ``None`` for a register too wide to
            wrap within a run (64-bit): every drop is then a reset.

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
            if self._modulus is None:
                self.events.append(CounterEvent(t, "reset", last, raw))
                return None
            self.events.append(CounterEvent(t, "wrap", last, raw))
            step += self._modulus
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
