"""The period each field was actually read at, from the rows the sampler wrote."""

from collections.abc import Iterable, Sequence
from typing import Any


class FieldPeriods:
    """Per source, device and field: when a row first and last held a value, and how many did.

    Fed every row the sampler writes; :meth:`worst_ms` turns that into each field's mean
    period, which the manifest records (``telemetry_sources``).
    """

    def __init__(self) -> None:
        self._seen: dict[tuple[str, int | None], dict[str, list[float]]] = {}

    def add(self, source: str, fields: Sequence[str], rows: Iterable[dict[str, Any]]) -> None:
        """Count the values of ``fields`` in ``rows`` of ``source``."""
        for row in rows:
            seen = self._seen.setdefault((source, row["device"]), {})
            t = row["t"]
            for name in fields:
                if row[name] is None:
                    continue
                span = seen.get(name)
                if span is None:
                    seen[name] = [t, t, 1]
                else:
                    span[0], span[1], span[2] = min(span[0], t), max(span[1], t), span[2] + 1

    def worst_ms(self) -> dict[str, dict[str, float]]:
        """Per source and field, the mean period between values in milliseconds, on the
        device where it was longest; fields seen fewer than twice, or only at one time, are
        left out."""
        out: dict[str, dict[str, float]] = {}
        for (source, _), fields in self._seen.items():
            for name, (first, last, count) in fields.items():
                if count > 1 and last > first:
                    period = 1e3 * (last - first) / (count - 1)
                    per_source = out.setdefault(source, {})
                    per_source[name] = max(per_source.get(name, 0.0), period)
        return out
