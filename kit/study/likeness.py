"""Whether runs differ only in a finding's factor: what else differs between them, and by how much.

A finding compares runs that vary one thing (its *factor*: recomputation, the micro-batch, the
layout). Runs that also differ in something else measure both: a recomputation pair where the
step also left the CUDA graph for the eager path, or a micro-batch sweep whose small end was
host-bound, shows the host as much as the factor (issue 58). Each finding declares a
:class:`Held`: its factor, and the settings it lets differ with the reason; every other setting
below must match across the runs it compares, or its verdict is ``confounded``, naming what
differs (:func:`differences`).

Settings compared (from :class:`kit.study.facts.BundleFacts`): the engine, workload, platform,
nodes and world size; every parallel degree (``tp``, ``pp``, ``dp``, ``cp``, ``ep``, ``vpp``,
``sp``, the MoE dispatcher); micro and global batch; the ``optim`` settings (recompute and its
method, overlap, distributed optimizer, FSDP, ZeRO stage, offload); the execution mode (graphed
or eager); the speed features; precision; sequence length; the telemetry period; the kit's
version and commit; and how host-bound each run was (``host_bound``: GPU utilization and, where
both runs were profiled on a device timeline, the idle share of the profiled steps). A setting a
bundle does not record counts as the value ``unrecorded``, which matches only itself;
host-boundness is compared only where both runs measured it.
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kit.study.facts import BundleFacts

GPU_UTIL_GAP_PCT = 10.0
"""GPU utilization (percent of the time a kernel ran) further apart than this counts as a
different boundness. The recorded Mixtral pair on one H200 that differs only in recomputation
(both eager) ran at 74% and 71%; the host-bound micro-batch 1 of issue 58 ran at 60-71%
against 97% for micro-batch 8."""
IDLE_SHARE_GAP = 0.10
"""Idle shares of the profiled steps (no kernel running) further apart than this count as a
different boundness: the same ten points as :data:`GPU_UTIL_GAP_PCT`, in the profile's terms."""

LAYOUT = ("tp", "pp", "dp", "cp", "ep", "vpp", "sp")
"""The parallel degrees (and sequence parallelism) a layout is made of."""
_PARALLEL_DEFAULTS: dict[str, Any] = {"tp": 1, "pp": 1, "dp": 1, "cp": 1, "ep": 1, "vpp": None,
                                      "sp": False, "moe_dispatcher": None}
_OPTIM = ("recompute", "recompute_method", "overlap", "dist_optimizer", "fsdp", "zero",
          "offload")
UNRECORDED = "unrecorded"
"""The value of a setting a bundle does not record."""


def _execution(f: BundleFacts) -> str | None:
    return f.execution.mode if f.execution else None


def _execution_shown(f: BundleFacts) -> str | None:
    return f.execution.describe() if f.execution else None


def _features(f: BundleFacts) -> str | None:
    if f.speed_features is None:
        return None
    return ", ".join(f.speed_features) or "none"


def _parallel(key: str) -> Callable[[BundleFacts], Any]:
    return lambda f: f.parallel.get(key, _PARALLEL_DEFAULTS[key])


def _optim(key: str) -> Callable[[BundleFacts], Any]:
    return lambda f: f.optim.get(key)


@dataclass(frozen=True)
class _Setting:
    key: str
    words: str
    value: Callable[[BundleFacts], Any]
    shown: Callable[[BundleFacts], Any] | None = None
    """How a value is shown where it says more than the compared one (the eager step's why)."""


SETTINGS: tuple[_Setting, ...] = (
    _Setting("engine", "engine", lambda f: f.engine),
    _Setting("workload", "workload", lambda f: f.workload),
    _Setting("platform", "platform", lambda f: f.platform),
    _Setting("nodes", "nodes", lambda f: f.nodes),
    _Setting("world_size", "world size", lambda f: f.world_size),
    *(_Setting(k, k, _parallel(k)) for k in (*LAYOUT, "moe_dispatcher")),
    _Setting("micro_batch_size", "micro-batch", lambda f: f.micro_batch_size),
    _Setting("global_batch_size", "global batch", lambda f: f.global_batch_size),
    *(_Setting(k, k.replace("_", " "), _optim(k)) for k in _OPTIM),
    _Setting("execution", "execution mode", _execution, _execution_shown),
    _Setting("speed_features", "speed features", _features),
    _Setting("precision", "precision", lambda f: f.dtype),
    _Setting("sequence_length", "sequence length", lambda f: f.seq_length),
    _Setting("sampling_period", "telemetry period (ms)", lambda f: f.telemetry_interval_ms),
    _Setting("kit_version", "kit version", lambda f: f.kit_version),
)
"""Every setting that must match unless a finding's :class:`Held` says otherwise."""
HOST_BOUND = "host_bound"
"""The setting that is how host-bound a run was (GPU utilization, the profile's idle share)."""
SETTING_KEYS: tuple[str, ...] = (*(s.key for s in SETTINGS), HOST_BOUND)


@dataclass(frozen=True)
class Held:
    """What a finding compares: its factor, and what else it lets differ.

    Attributes:
        factor: The settings the finding varies on purpose (keys of :data:`SETTING_KEYS`).
        free: Other settings it lets differ, each with the reason.
    """

    factor: frozenset[str]
    free: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted((set(self.factor) | set(self.free)) - set(SETTING_KEYS))
        if unknown:
            raise ValueError(f"unknown settings {unknown}")

    @property
    def fixed(self) -> tuple[str, ...]:
        """The settings that must match, in :data:`SETTING_KEYS` order."""
        return tuple(k for k in SETTING_KEYS if k not in self.factor and k not in self.free)

    def as_json(self) -> dict[str, Any]:
        """The findings entry's ``factor``, ``held_fixed`` and ``may_differ``."""
        return {"factor": [k for k in SETTING_KEYS if k in self.factor],
                "held_fixed": list(self.fixed), "may_differ": dict(self.free)}


@dataclass(frozen=True)
class Difference:
    """A setting that differs across compared runs.

    Attributes:
        setting: Its key (:data:`SETTING_KEYS`).
        what: It in words.
        values: Each value, as shown, with the bundles that had it.
        by: How far apart, for a measured setting (GPU utilization, idle share), else None.
    """

    setting: str
    what: str
    values: tuple[tuple[str, tuple[str, ...]], ...]
    by: str | None = None

    def describe(self) -> str:
        """One phrase, e.g. ``execution mode: graphed (a) vs eager (activation recomputation)
        (b)``."""
        shown = " vs ".join(f"{v} ({', '.join(names)})" for v, names in self.values)
        return f"{self.what}: {shown}" + (f", {self.by}" if self.by else "")

    def as_json(self) -> dict[str, Any]:
        """An entry of the findings entry's ``differs``."""
        return {"setting": self.setting, "what": self.what,
                "values": [{"value": v, "bundles": list(n)} for v, n in self.values],
                "by": self.by}


def _shown(value: Any) -> str:
    return UNRECORDED if value is None else str(value)


def _categorical(runs: Sequence[BundleFacts], s: _Setting) -> Difference | None:
    compared: dict[str, list[BundleFacts]] = {}
    for f in runs:
        compared.setdefault(_shown(s.value(f)), []).append(f)
    if len(compared) < 2:
        return None
    show = s.shown or s.value
    values: dict[str, list[str]] = {}
    for same in compared.values():
        for f in same:
            values.setdefault(_shown(show(f)), []).append(f.name)
    return Difference(s.key, s.words, tuple((v, tuple(n)) for v, n in values.items()))


def _spread(runs: Sequence[BundleFacts], value: Callable[[BundleFacts], float | None],
            gap: float, what: str, fmt: Callable[[float], str],
            apart: Callable[[float], str]) -> Difference | None:
    known = [(f, v) for f in runs if (v := value(f)) is not None]
    if len(known) < len(runs) or len(known) < 2:
        return None  # not measured on every side: nothing to compare
    lo, hi = min(known, key=lambda x: x[1]), max(known, key=lambda x: x[1])
    if hi[1] - lo[1] <= gap:
        return None
    values = ((fmt(lo[1]), (lo[0].name,)), (fmt(hi[1]), (hi[0].name,)))
    return Difference(HOST_BOUND, what, values,
                      f"{apart(hi[1] - lo[1])} apart (more than {apart(gap)}: host-bound to "
                      "different degrees)")


def host_bound_differences(runs: Sequence[BundleFacts]) -> list[Difference]:
    """GPU utilization, and the profile's idle share, further apart than their gaps."""
    util = _spread(runs, lambda f: f.gpu_util_pct, GPU_UTIL_GAP_PCT, "GPU utilization",
                   lambda v: f"{v:.0f}%", lambda d: f"{d:.0f} points")
    idle = _spread(runs, lambda f: f.idle_share, IDLE_SHARE_GAP, "idle share of profiled steps",
                   lambda v: f"{v:.0%}", lambda d: f"{100 * d:.0f} points")
    return [d for d in (util, idle) if d is not None]


def differences(runs: Sequence[BundleFacts], held: Held) -> list[Difference]:
    """Every setting outside ``held``'s factor and free settings that differs across ``runs``,
    in :data:`SETTINGS` order, host-boundness last; empty when they compare like with like."""
    fixed = set(held.fixed)
    out = [d for s in SETTINGS if s.key in fixed and (d := _categorical(runs, s)) is not None]
    return out + (host_bound_differences(runs) if HOST_BOUND in fixed else [])


def describe(diffs: Sequence[Difference]) -> str:
    """The differences in one phrase, ``; ``-separated."""
    return "; ".join(d.describe() for d in diffs)


def alike_key(f: BundleFacts, held: Held) -> tuple[str, ...]:
    """The run's value of every categorical setting ``held`` fixes: runs of one key differ
    only in the factor, the free settings and how host-bound they were."""
    fixed = set(held.fixed)
    return tuple(_shown(s.value(f)) for s in SETTINGS if s.key in fixed)


def alike_groups(runs: Sequence[BundleFacts], held: Held) -> list[list[BundleFacts]]:
    """``runs`` split by :func:`alike_key`, in first-seen order."""
    groups: dict[tuple[str, ...], list[BundleFacts]] = {}
    for f in runs:
        groups.setdefault(alike_key(f, held), []).append(f)
    return list(groups.values())
