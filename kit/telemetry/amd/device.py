"""One AMD GPU's fields and reading them: not yet verified on hardware.

Each field has its reader and what became of it (values written, transient failures retried,
a loss and when); :func:`read_fields` reads any set of them, keeping each failure per field.
"""

from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from kit.telemetry.amd.library import TRANSIENT_STATUSES, describe, status_is
from kit.telemetry.amd.quirks import Mi250Die
from kit.telemetry.amd.readers import Energy, Reader, Tick


@dataclass
class FieldRead:
    """How one canonical field is read on one device, and what became of it.

    Not yet verified on hardware.

    Attributes:
        read: The reader; ``None`` when the field is not read on this device.
        note: How it is read, or why it is not.
        probed: What the first read, at construction, gave (raw for the energy counter).
        wrote: Whether a value reached a row.
        lost: Why and when it stopped being read, if it did.
        retries: Transient failures so far, and the first one's time and status.
    """

    read: Reader | None
    note: str
    probed: float | None = None
    wrote: bool = False
    lost: str | None = None
    retries: int = 0
    first_retry: str = ""

    def describe(self) -> tuple[bool, str]:
        """Whether the field gave (or can give) values on this device, and what to say.

        Not yet verified on hardware.
        """
        parts = [self.note]
        events = getattr(self.read, "events", None)
        parts.append(events() if events else None)
        if self.retries:
            parts.append(f"{self.retries} transient failure(s), each retried on the next tick; "
                         f"the first {self.first_retry}")
        parts.append(self.lost)
        energy = self.read if isinstance(self.read, Energy) else None
        untrusted = energy is not None and energy.check.ok is False
        readable = self.read is not None and (self.wrote or (not self.lost and not untrusted))
        return readable, "; ".join(p for p in parts if p)


@dataclass
class AmdDevice:
    """One GPU: its handle, what it is, and each field's reader and state.

    Not yet verified on hardware.
    """

    index: int
    handle: Any
    name: str
    gfx_target: str | None
    gfx_note: str
    fields: dict[str, FieldRead] = field(default_factory=dict)
    die: Mi250Die | None = None

    def live(self, names: list[str]) -> bool:
        """Whether any of the fields ``names`` is still read. Not yet verified on hardware."""
        return any((f := self.fields[n]).read is not None and not f.lost for n in names)


def read_fields(smi: ModuleType, version: str, dev: AmdDevice, t: float,
                names: list[str]) -> dict[str, Any]:
    """Read the live ones of ``names`` on one device, in canonical units; keep each failure.

    Not yet verified on hardware. The calls are made once each (one :class:`Tick`), from the
    sampler's loop for the fast fields and from the device's slow lane for the slow ones.
    """
    tick = Tick(smi, t)
    values: dict[str, Any] = {}
    for name in names:
        f = dev.fields[name]
        if f.read is None or f.lost:
            continue
        try:
            value = f.read(tick)
        except smi.AmdSmiException as e:
            if not status_is(smi, e, TRANSIENT_STATUSES):
                f.lost = f"lost at t={t:.3f}: {describe(e)}"
                continue
            f.retries += 1
            f.first_retry = f.first_retry or f"at t={t:.3f}: {describe(e)}"
            value = None
        except KeyError as e:
            f.lost = f"lost at t={t:.3f}: amdsmi {version} returned no {e}"
            continue
        f.wrote |= value is not None
        values[name] = value
    return values
