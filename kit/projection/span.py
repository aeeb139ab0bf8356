"""A projected quantity as a point estimate inside the interval its assumptions allow.

Every term of the model (kit.projection.model) is a :class:`Span`: ``point`` is the estimate under
the model's central assumption, ``low`` and ``high`` the values under the assumptions the
measurements cannot rule out (docs/projection.md lists each one). Adding spans adds each end;
the interval is therefore the range of the model's own alternatives, not a statistical
confidence interval.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Span:
    """``low <= point <= high``, all in the same unit."""

    low: float
    point: float
    high: float

    def __post_init__(self) -> None:
        if not self.low <= self.point <= self.high:
            raise ValueError(f"a span needs low <= point <= high, got {self}")

    @classmethod
    def exact(cls, value: float) -> "Span":
        """A value the model takes as known (no alternative assumption moves it)."""
        return cls(value, value, value)

    @classmethod
    def of(cls, *values: float, point: float) -> "Span":
        """``point`` inside the range of ``values`` and itself."""
        return cls(min(point, *values), point, max(point, *values))

    def __add__(self, other: "Span") -> "Span":
        return Span(self.low + other.low, self.point + other.point, self.high + other.high)

    def scale(self, factor: float) -> "Span":
        """Each end times a non-negative ``factor``."""
        if factor < 0:
            raise ValueError("a span scales by a non-negative factor")
        return Span(self.low * factor, self.point * factor, self.high * factor)

    def stretch(self, down: float, up: float) -> "Span":
        """``low`` lowered by the relative amount ``down`` and ``high`` raised by ``up``."""
        return Span(self.low * (1 - max(0.0, down)), self.point, self.high * (1 + max(0.0, up)))

    def as_list(self) -> list[float]:
        """``[low, point, high]``, as the projection file stores it."""
        return [self.low, self.point, self.high]


ZERO = Span.exact(0.0)


def span_sum(spans: list[Span]) -> Span:
    """The sum of ``spans`` (:data:`ZERO` for none)."""
    total = ZERO
    for s in spans:
        total = total + s
    return total


def span_max(a: Span, b: Span) -> Span:
    """End-wise maximum: the longer of two paths that run at the same time."""
    return Span(max(a.low, b.low), max(a.point, b.point), max(a.high, b.high))
