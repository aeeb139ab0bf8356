"""Which points of a sweep can run here, and why each of the others is skipped.

First the sweep as a whole: its fixed fields (those ``base`` sets and no axis varies) are
checked once, and a wrong one (a misspelled workload or platform, ``tp: 0``) refuses the sweep,
dry run or not, since it would skip every point. Then each point, with the checks of
``charllm-kit run`` in the same order it applies them: the sweep's own constraints, the run
fields themselves, resolution and layout validation (divisibility, world size, engine support,
platform present for a real run) and the memory estimate.
"""

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from kit.config.loader import describe_validation_error, load_platform, load_workload
from kit.config.run import RunConfig
from kit.errors import KitInputError
from kit.plan import plan_run
from kit.plan.memory import MemoryEstimate
from kit.plan.resolve import RunRequest, run_request
from kit.sweep.file import SweepSpec

# Short forms of field names in point ids; other fields use their own name.
_ID_NAMES = {"micro_batch_size": "mb", "global_batch_size": "gbs", "telemetry_interval_ms": "tel"}


@dataclass(frozen=True)
class PlannedPoint:
    """One point of the grid and its verdict."""

    id: str
    values: dict[str, Any]
    request: RunRequest | None
    cfg: RunConfig | None
    memory: MemoryEstimate | None
    skip_reason: str | None

    @property
    def valid(self) -> bool:
        """Whether the point will run."""
        return self.skip_reason is None


def point_id(number: int, values: dict[str, Any]) -> str:
    """A stable, readable folder name, e.g. ``003-gpt3-175b-tp2-pp16-sp``.

    The number keeps ids unique and in file order; the rest names the point's axis values.
    """
    parts = [f"{number:03d}"]
    for name, value in values.items():
        short = _ID_NAMES.get(name, name)
        if name == "workload":
            parts.append(re.sub(r"\.ya?ml$", "", Path(str(value)).name))
        elif isinstance(value, bool):
            parts.append(short if value else f"no{short}")
        elif isinstance(value, str):
            parts.append(f"{short}-{value}")
        else:
            parts.append(f"{short}{value}")
    return re.sub(r"[^A-Za-z0-9._-]+", "-", "-".join(parts))


def _verdict(
    spec: SweepSpec, values: dict[str, Any], require_present: bool
) -> tuple[RunRequest | None, RunConfig | None, MemoryEstimate | None, str | None]:
    fields = {**spec.base, **values}
    try:
        req = run_request(**fields)
    except KitInputError as e:
        return None, None, None, str(e)
    defaulted = req.model_dump()
    for rule in spec.skip_if:
        try:
            if rule.matches(defaulted):
                return req, None, None, f"constraint: {rule.reason}"
        except ValueError as e:
            raise KitInputError(f"sweep {spec.name}: constraint {rule.if_!r} fails on "
                                f"{values}: {e}") from None
    try:
        plan = plan_run(req, require_present=require_present)
    except KitInputError as e:
        return req, None, None, str(e)
    return req, plan.cfg, plan.memory, plan.refusal


def check_fixed_fields(spec: SweepSpec) -> None:
    """Refuse a sweep whose fixed fields are wrong: every point would be skipped for them.

    Fixed fields are those of ``base`` that no axis sets; a field no axis varies and ``base``
    lacks (a missing ``workload``) is as wrong for every point. Whether the platform is present
    on this host is a point's verdict, not checked here: a dry run resolves any platform.

    Raises:
        KitInputError: Invalid fixed run fields, or an unknown fixed workload or platform.
    """
    varied = {name for point in spec.points() for name in point}
    fixed = {k: v for k, v in spec.base.items() if k not in varied}
    try:
        RunRequest.model_validate(fixed)
    except ValidationError as e:
        problem = describe_validation_error(e, skip=varied)
        if problem:
            raise KitInputError(f"sweep {spec.name}: base: invalid run fields: {problem}") from None
    try:
        if "workload" in fixed:
            load_workload(fixed["workload"])
        if fixed.get("platform"):
            load_platform(fixed["platform"])
    except KitInputError as e:
        raise KitInputError(f"sweep {spec.name}: base: {e}") from None


def plan_sweep(spec: SweepSpec, require_present: bool) -> list[PlannedPoint]:
    """Every point of ``spec`` with its verdict; ``require_present`` for a real run here.

    Raises:
        KitInputError: The sweep as a whole is wrong (:func:`check_fixed_fields`), or a
            constraint cannot be evaluated on a point.
    """
    check_fixed_fields(spec)
    out = []
    for number, values in enumerate(spec.points(), 1):
        req, cfg, memory, reason = _verdict(spec, values, require_present)
        out.append(PlannedPoint(point_id(number, values), values, req, cfg, memory, reason))
    return out
