"""Throttle reasons: the kit's vendor-neutral bits, and their names.

The telemetry ``throttle`` column is an OR of :data:`kit.bundle.telemetry_fields.THROTTLE_BITS`,
so a study can ask "how often was this device power-capped?" the same way on NVIDIA and AMD.
Each vendor's decoder lives with its source (``nvidia/throttle.py``, ``amd/quirks.py``); each
maps every bit it knows, and folds any bit it does not know into ``other`` rather than dropping
it (a new driver's reason must not read as "not throttled").
"""

from kit.bundle.telemetry_fields import THROTTLE_BITS


def reason_names(bits: int) -> list[str]:
    """Return the names of the kit throttle bits set in ``bits``, in bit order.

    Args:
        bits: An OR of :data:`~kit.bundle.schema.THROTTLE_BITS` values, e.g. a ``throttle``
            telemetry cell.

    Raises:
        ValueError: ``bits`` is negative or has a bit the kit does not define (such a value
            did not come from a decoder here).
    """
    undefined = bits & ~sum(THROTTLE_BITS.values())
    if bits < 0 or undefined:
        raise ValueError(f"not a kit throttle bitmask: {bits:#x}")
    return [name for name, bit in sorted(THROTTLE_BITS.items(), key=lambda kv: kv[1]) if bits & bit]
