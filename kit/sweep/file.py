"""The sweep file: a base run, the axes of the grid, and the constraints that skip points.

Field names in ``base``, the axes and the constraints are :class:`kit.plan.resolve.RunRequest`
fields, checked when the file loads, and so is every axis value against its field's type and
bounds (``tp: [1, 3, "two"]`` refuses the file rather than skip a point); a field added to
``RunRequest`` (a new ``run`` option) works in sweeps with no change here.
"""

import ast
import functools
import itertools
import math
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from kit.config.bounds import MAX_SWEEP_POINTS
from kit.config.loader import load_yaml_model
from kit.plan.resolve import RunRequest
from kit.sweep.conditions import evaluate_condition, parse_condition

REQUEST_FIELDS = frozenset(RunRequest.model_fields)


def _check_fields(names: set[str] | dict[str, Any], where: str) -> None:
    unknown = sorted(set(names) - REQUEST_FIELDS)
    if unknown:
        raise ValueError(f"{where}: unknown run field(s) {unknown}; "
                         f"known: {sorted(REQUEST_FIELDS)}")


@functools.cache
def _field_type(name: str) -> TypeAdapter[Any]:
    """The type and bounds of RunRequest's field ``name``, as `run` checks an option."""
    info = RunRequest.model_fields[name]
    return TypeAdapter(Annotated[info.annotation, info])


def _check_values(values: dict[str, Any], where: str) -> None:
    """Each ``field: value`` a valid value of that run field (names already checked)."""
    for name, value in values.items():
        try:
            _field_type(name).validate_python(value)
        except ValidationError as e:
            why = e.errors()[0]["msg"]
            raise ValueError(f"{where}: {name}: {value!r} is not a valid {name} ({why})") from None


class Axis(BaseModel):
    """One factor of the grid: exactly one of ``zip``, ``product`` or ``points``.

    The sweep's points are the cartesian product of its axes' alternatives.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    zip_: dict[str, list[Any]] | None = Field(
        None, alias="zip",
        description="Fields that move together: equally long lists, alternative i takes "
        "element i of each.")
    product: dict[str, list[Any]] | None = Field(
        None, description="Fields crossed with each other: every combination is an alternative.")
    points: list[dict[str, Any]] | None = Field(
        None, description="Alternatives written out, one mapping of fields per alternative "
        "(a grid of layouts that is no product).")

    @model_validator(mode="after")
    def _one_form(self) -> "Axis":
        forms = [f for f in ("zip", "product", "points") if self._form(f) is not None]
        if len(forms) != 1:
            raise ValueError(f"an axis has exactly one of zip, product, points (got {forms})")
        form = forms[0]
        value = self._form(form)
        if not value:
            raise ValueError(f"{form}: empty")
        if form == "points":
            for p in value:
                _check_fields(p, "points")
                _check_values(p, "points")
        else:
            _check_fields(value, form)
            if any(not v for v in value.values()):
                raise ValueError(f"{form}: every field needs at least one value")
            for name, options in value.items():
                for option in options:
                    _check_values({name: option}, form)
            if form == "zip" and len({len(v) for v in value.values()}) != 1:
                raise ValueError("zip: lists must have the same length")
        return self

    def _form(self, name: str) -> Any:
        return {"zip": self.zip_, "product": self.product, "points": self.points}[name]

    def count(self) -> int:
        """How many alternatives this axis has, without listing them."""
        if self.points is not None:
            return len(self.points)
        if self.zip_ is not None:
            return len(next(iter(self.zip_.values())))
        assert self.product is not None
        return math.prod(len(v) for v in self.product.values())

    def alternatives(self) -> list[dict[str, Any]]:
        """The field values of each alternative of this axis, in file order."""
        if self.points is not None:
            return [dict(p) for p in self.points]
        if self.zip_ is not None:
            keys = list(self.zip_)
            return [dict(zip(keys, vals, strict=True))
                    for vals in zip(*self.zip_.values(), strict=True)]
        assert self.product is not None
        keys = list(self.product)
        return [dict(zip(keys, vals, strict=True))
                for vals in itertools.product(*self.product.values())]


class SkipRule(BaseModel):
    """Skip the points a rule matches: all of ``when`` and ``if`` must hold."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    when: dict[str, Any] | None = Field(
        None, description="Field -> value the point must have; a list means any of its values.")
    if_: str | None = Field(
        None, alias="if",
        description="Expression over the point's run fields with arithmetic and comparisons "
        "only, e.g. 'tp * pp > 8' (see kit.sweep.conditions).")
    reason: str = Field(min_length=1, description="Shown for every point this rule skips.")
    _tree: ast.Expression | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _check(self) -> "SkipRule":
        if self.when is None and self.if_ is None:
            raise ValueError("a skip_if rule needs 'when' or 'if'")
        if self.when is not None:
            _check_fields(self.when, "when")
        if self.if_ is not None:
            self._tree = parse_condition(self.if_, REQUEST_FIELDS)
        return self

    def matches(self, fields: dict[str, Any]) -> bool:
        """Whether a point with these (defaulted) run fields is skipped by this rule.

        Raises:
            ValueError: The ``if`` expression fails on these values.
        """
        for name, wanted in (self.when or {}).items():
            options = wanted if isinstance(wanted, list) else [wanted]
            if fields.get(name) not in options:
                return False
        return self._tree is None or bool(evaluate_condition(self._tree, fields))


class SweepSpec(BaseModel):
    """A sweep file (YAML), e.g. ``sweeps/cpu-smoke.yaml``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="Names the sweep folder (<out>/<name>/); defaults to the file's stem.")
    description: str = ""
    base: dict[str, Any] = Field(
        description="Run fields shared by every point (the options of `charllm-kit run`, "
        "spelled as RunRequest fields: workload, platform, nodes, tp, micro_batch_size, ...).")
    axes: list[Axis] = Field(default_factory=list, description="Factors of the grid.")
    skip_if: list[SkipRule] = Field(
        default_factory=list, description="Constraints: points they match are skipped.")

    @model_validator(mode="after")
    def _check_base(self) -> "SweepSpec":
        _check_fields(self.base, "base")  # its values: checked as one request (kit.sweep.plan)
        points = math.prod(axis.count() for axis in self.axes)
        if points > MAX_SWEEP_POINTS:  # 8 axes of 10 values are 10**8 points, in a few lines
            raise ValueError(f"the axes make {points:,} points, more than the "
                             f"{MAX_SWEEP_POINTS:,} a sweep may have; split it into sweeps")
        return self

    def points(self) -> list[dict[str, Any]]:
        """Each point's axis values (base not included), in a stable order."""
        out: list[dict[str, Any]] = [{}]
        for axis in self.axes:
            out = [{**p, **alt} for p in out for alt in axis.alternatives()]
        return out


def load_sweep(path: Path) -> SweepSpec:
    """Load and validate a sweep file; :class:`kit.errors.KitInputError` on bad input."""
    return load_yaml_model(path, SweepSpec)
