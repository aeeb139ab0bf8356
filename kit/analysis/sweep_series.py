"""Which configurations a line across a swept parameter may join: those alike in all else.

A line across micro-batch size, or a parallel degree, says how a metric moves with that
parameter; it says so only when nothing else moves along it. Two configurations are on one
line when they differ in the parameter alone: same workload, platform, world size, precision,
execution mode (graphed or eager: ``metrics.json`` ``execution``, else the notes of a bundle
written before it, :func:`kit.engines.execution.execution_of`), engine, every other parallel
degree, optimizations, speed features and micro and global batch. What the parameter moves
with it by definition is left to move, and the figure says it:

* TP, PP or CP at a fixed world size moves DP (world = TP x PP x CP x DP), so a line of one of
  them holds the world size and lets DP follow;
* DP moves the world size (the other degrees held, it is the number of replicas);
* micro-batch size and EP move neither.

A configuration that no other matches on everything else stands alone: a point, never part of
a line. Lines and points are named by what they hold fixed, less what all of them hold alike
(said once, :attr:`Sweep.shared`), so two lines at different world sizes read ``2 ranks`` and
``4 ranks``.
"""

import json
from dataclasses import dataclass
from typing import Any

from kit.analysis.comparability import axis_value, execution_mode
from kit.analysis.compare import Comparison, Group
from kit.metrics.labels import layout_parts, split_shared

SWEPT = ("micro_batch_size", "tp", "pp", "dp", "cp", "ep")
"""Parameters a sweep may vary, in the order a tie is broken (micro-batch first)."""
MOVES_DP = ("tp", "pp", "cp")
"""Degrees whose change at a fixed world size moves DP with it (world = TP x PP x CP x DP)."""


@dataclass(frozen=True)
class Entry:
    """A line (two or more configurations) or a point (one that matches no other)."""

    name: str
    """What it holds fixed, less :attr:`Sweep.shared` (unique in its sweep)."""
    points: list[tuple[float, Group]]
    """(parameter value, configuration), by value."""

    @property
    def is_line(self) -> bool:
        """Whether it joins configurations (else a configuration alone, drawn as a point)."""
        return len(self.points) > 1


@dataclass(frozen=True)
class Sweep:
    """A parameter the configurations vary, its lines and its lone points."""

    parameter: str
    entries: list[Entry]
    """Lines first (in the order of their first configuration), then points."""
    shared: list[str]
    """What every line and point holds alike, e.g. ``gpt3-tiny cpu fp32 eager megatron``."""

    @property
    def lines(self) -> list[Entry]:
        """The entries that join two or more configurations."""
        return [e for e in self.entries if e.is_line]

    @property
    def alone(self) -> list[Entry]:
        """The configurations that match no other: points."""
        return [e for e in self.entries if not e.is_line]


def world_size(g: Group) -> int:
    """Ranks of the configuration's runs (the manifest's, else the product of the degrees)."""
    ranks = len(g.first.ranks)
    if ranks:
        return ranks
    p = g.first.config["parallel"]
    return p["tp"] * p["pp"] * p.get("cp", 1) * p["dp"]


def parameter_value(g: Group, parameter: str) -> int:
    """The configuration's value of a parameter of :data:`SWEPT` (a degree its config leaves
    out is 1)."""
    value = axis_value(g.bundles[0], parameter)
    return 1 if value is None else int(value)


def _free(parameter: str) -> set[str]:
    """The parallel settings a line across ``parameter`` lets move: itself, and DP where
    :data:`MOVES_DP`."""
    return {parameter} | ({"dp"} if parameter in MOVES_DP else set())


def _held(g: Group, parameter: str) -> dict[str, Any]:
    """Everything a line across ``parameter`` holds fixed (module docstring)."""
    config = g.first.config
    free = _free(parameter)
    return {
        "workload": g.first.workload["name"], "platform": g.first.platform["name"],
        "world": None if parameter == "dp" else world_size(g), "dtype": config["dtype"],
        "execution": execution_mode(g.bundles[0]), "engine": config.get("engine", "megatron"),
        "nodes": config.get("nodes"), "speed": config.get("speed"),
        "parallel": {k: v for k, v in config["parallel"].items() if k not in free},
        "optim": config.get("optim"), "global_batch_size": config["global_batch_size"],
        "micro_batch_size": (None if parameter == "micro_batch_size"
                             else config["micro_batch_size"]),
    }


def _tokens(g: Group, parameter: str) -> list[str]:
    """What a line across ``parameter`` holds fixed, as name tokens."""
    held = _held(g, parameter)
    free = {"mb" if parameter == "micro_batch_size" else parameter} | _free(parameter)
    parts = [t for t in layout_parts(g.first.config) if t.rstrip("0123456789") not in free]
    ranks = held["world"]
    world = [] if ranks is None else [f"{ranks} rank{'s' if ranks > 1 else ''}"]
    speed = [f"speed={held['speed']}"] if held["speed"] else []
    return [held["workload"], held["platform"], *world, held["dtype"], held["execution"],
            *parts, *speed]


def _entries(parameter: str, groups: list[Group]) -> tuple[list[list[Group]], int]:
    """Configurations by what a line across ``parameter`` holds (a line per list, one value
    each; a configuration repeating a value already on its line starts a list of its own), and
    how many are on lines of two or more."""
    lines: dict[str, list[Group]] = {}
    extra: list[list[Group]] = []
    for g in groups:
        line = lines.setdefault(json.dumps(_held(g, parameter), sort_keys=True, default=str), [])
        value = parameter_value(g, parameter)
        if any(parameter_value(x, parameter) == value for x in line):
            extra.append([g])
        else:
            line.append(g)
    found = list(lines.values()) + extra
    return found, sum(len(e) for e in found if len(e) > 1)


def find_sweep(c: Comparison) -> Sweep | None:
    """The parameter that puts the most configurations on lines (configurations that differ in
    it alone; at least one line of two); None when no two configurations differ in one
    parameter only. Configurations that did not end ok, projections and fabric benchmarks are
    left out."""
    ok = [g for g in c.groups if g.status == "ok" and not g.projected
          and g.first.workload.get("family") != "fabric"]
    best: tuple[str, list[list[Group]], int] | None = None
    for parameter in SWEPT:
        found, joined = _entries(parameter, ok)
        if joined and (best is None or joined > best[2]):
            best = (parameter, found, joined)
    if best is None:
        return None
    parameter, found, _ = best
    found.sort(key=lambda e: len(e) < 2)  # lines first, each list keeping its order
    split = split_shared([[_tokens(e[0], parameter)] for e in found])
    names: dict[str, int] = {}
    entries = []
    for e, own in zip(found, split.own, strict=True):
        name = " ".join(own[0]) or " ".join(split.shared)
        names[name] = names.get(name, 0) + 1
        points = sorted(((float(parameter_value(g, parameter)), g) for g in e),
                        key=lambda p: p[0])
        entries.append(Entry(name if names[name] == 1 else f"{name} #{names[name]}", points))
    return Sweep(parameter, entries, split.shared)


def parameter_name(parameter: str) -> str:
    """``micro-batch size`` or ``TP degree``."""
    return "micro-batch size" if parameter == "micro_batch_size" else f"{parameter.upper()} degree"


def what_moves(parameter: str) -> str:
    """What a line across ``parameter`` lets move with it, for a figure's title ("" when
    nothing)."""
    if parameter in MOVES_DP:
        return " at a fixed world size (DP moves with it)"
    return " (the world size grows with it)" if parameter == "dp" else ""
