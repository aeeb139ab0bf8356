"""How long one collective takes: its group placed on nodes, its size read off a busbw curve.

**Placement.** megatron-core orders ranks ``tp-cp-ep-dp-pp`` (kit/engines/megatron/spec.py):
a group is ``size`` ranks ``stride`` apart (TP: stride 1; CP, EP and DP x CP: stride ``t``;
the experts' DP: ``t e``; PP neighbours: ``t c d``; the tied-embedding pair: ``t c d (p-1)``).
Nodes hold ``n`` consecutive ranks; the group of rank 0 (ranks ``0, stride, ...``) spans
the nodes those ranks fall on, with ``size / nodes`` members on each.

**Within a node** the time of an operation of size ``S`` over ``g`` ranks is
``S x factor(op, g) / busbw(S)`` (nccl-tests' factors, kit.fabric.bandwidth), with ``busbw``
read off the measured curve of that operation (a fabric bundle of this platform; of several,
the one whose rank count is nearest ``g``), linearly in ``log S`` between measured sizes, at
the largest size's busbw above them and at the smallest size's *time* below them (latency).
Bus bandwidth is nccl-tests' rank-independent figure, so a curve measured over 4 ranks serves
a group of 2. The point uses the mean time over ranks, ``high`` the slowest rank's
(``time_s_max``). Without a fabric bundle: the platform's ``intra_node`` bandwidth as busbw at
every size, no latency (a lower bound on the time).

**Across nodes** (a group spanning several): busbw is the members per node times the
platform's ``inter_node`` bandwidth per device (one NIC per GPU, rail-aligned: every member
drives its own NIC, so concurrent groups of one layout do not share them), capped at the
intra-node busbw at that size; the time is at least the intra-node time (latency). A fabric
bundle of several nodes (``fabric --nodes N``) replaces the platform figure: its curve, scaled
by members per node over its ranks per node.

**Another GPU kind** (kit.projection.kinds): without a fabric bundle of the target, the source
kind's curves serve, their busbw scaled by the ratio of the two datasheets' ``intra_node``
figures; the low end of each time is the target datasheet's figure without latency.
"""

import math
from dataclasses import dataclass

from kit.config.fabric import CollectiveOp
from kit.config.platform import PlatformSpec
from kit.config.run import RunConfig
from kit.fabric.bandwidth import bus_factor
from kit.fabric.results import FabricResults
from kit.projection.span import ZERO, Span
from kit.projection.volumes import Collective, Group


@dataclass(frozen=True)
class MeasuredFabric:
    """One fabric bundle's curves and the shape of the machine that measured them."""

    name: str
    """The bundle's id, to name it as an input."""
    results: FabricResults
    nodes: int
    ranks_per_node: int


@dataclass(frozen=True)
class Placement:
    """A group laid on nodes."""

    size: int
    members_per_node: int
    nodes: int


def group_shape(cfg: RunConfig, group: Group) -> tuple[int, int]:
    """``(size, stride)`` of ``group`` in megatron-core's rank order (module docstring)."""
    p = cfg.parallel
    shapes: dict[Group, tuple[int, int]] = {
        "tp": (p.tp, 1), "cp": (p.cp, p.tp), "ep": (p.ep, p.tp), "dp": (p.dp * p.cp, p.tp),
        "expert_dp": (p.dp * p.cp // p.ep, p.tp * p.ep), "pp": (min(p.pp, 2), p.tp * p.cp * p.dp),
        "embedding": (2, p.tp * p.cp * p.dp * max(p.pp - 1, 1)),
    }
    return shapes[group]


def place(cfg: RunConfig, group: Group) -> Placement:
    """Where ``group``'s ranks sit: the group of rank 0, ranks ``0, stride, 2 stride, ...``,
    on nodes of ``ranks_per_node`` consecutive ranks (the layouts' groups are alike)."""
    size, stride = group_shape(cfg, group)
    nodes = len({k * stride // cfg.ranks_per_node for k in range(size)})
    return Placement(size, math.ceil(size / nodes), nodes)


@dataclass(frozen=True)
class _Curve:
    """One operation's measured points, by size."""

    sizes: list[int]
    busbw_gbps: list[float]
    slow: list[float]
    """time_s_max / time_s at each size (>= 1)."""
    ranks: int

    def busbw(self, size: int) -> tuple[float, float]:
        """Interpolated (busbw, slowest-rank ratio) at ``size`` (module docstring)."""
        xs = self.sizes
        if size <= xs[0]:  # latency: the smallest size's time, so busbw shrinks with S
            return self.busbw_gbps[0] * size / xs[0], self.slow[0]
        if size >= xs[-1]:
            return self.busbw_gbps[-1], self.slow[-1]
        i = next(k for k in range(1, len(xs)) if xs[k] >= size)
        f = (math.log(size) - math.log(xs[i - 1])) / (math.log(xs[i]) - math.log(xs[i - 1]))
        return (self.busbw_gbps[i - 1] + f * (self.busbw_gbps[i] - self.busbw_gbps[i - 1]),
                self.slow[i - 1] + f * (self.slow[i] - self.slow[i - 1]))


def _curves(fabric: MeasuredFabric) -> dict[str, _Curve]:
    out: dict[str, _Curve] = {}
    for op in {p.op for p in fabric.results.points}:
        pts = sorted((p for p in fabric.results.points if p.op == op), key=lambda p: p.size_bytes)
        out[op] = _Curve([p.size_bytes for p in pts], [p.busbw_gbps for p in pts],
                         [max(1.0, p.time_s_max / p.time_s) for p in pts], fabric.results.ranks)
    return out


def _link(platform: PlatformSpec, scope: str) -> float | None:
    """The platform's bandwidth for ``scope`` (``intra_node``, ``inter_node``), GB/s."""
    return next((i.bandwidth_gbps for i in platform.interconnects if i.scope == scope), None)


class Links:
    """Collective times for one platform from its measured fabric bundles and profile."""

    def __init__(self, platform: PlatformSpec, fabrics: list[MeasuredFabric],
                 borrowed_from: PlatformSpec | None = None) -> None:
        """``borrowed_from``: the fabrics were measured on this other GPU kind (no fabric of
        ``platform`` exists); their busbw is scaled by the datasheet intra-node ratio and the
        datasheet figure itself (no latency) becomes the low end."""
        self.platform = platform
        self.borrowed_from = borrowed_from
        self.intra_gbps = _link(platform, "intra_node")
        self.inter_gbps = _link(platform, "inter_node")
        self._scale = 1.0
        if borrowed_from is not None:
            source = _link(borrowed_from, "intra_node")
            if source is None or self.intra_gbps is None:
                fabrics = []
            else:
                self._scale = self.intra_gbps / source
        self._intra = [(f, _curves(f)) for f in fabrics if f.nodes == 1]
        self._inter = [(f, _curves(f)) for f in fabrics if f.nodes > 1]

    def _intra_curve(self, op: CollectiveOp, ranks: int) -> _Curve | None:
        have = [(f, c[op]) for f, c in self._intra if op in c]
        if not have:
            return None
        return min(have, key=lambda fc: abs(math.log(fc[1].ranks / ranks)))[1]

    def _intra_busbw(self, op: CollectiveOp, size: int, ranks: int) -> tuple[float, float] | None:
        """(busbw GB/s, slowest-rank ratio) within one node; None when nothing says."""
        curve = self._intra_curve(op, ranks)
        if curve is not None:
            busbw, slow = curve.busbw(size)
            return busbw * self._scale, slow
        return None if self.intra_gbps is None else (self.intra_gbps, 1.0)

    def _inter_busbw(self, op: CollectiveOp, size: int, members: int) -> float | None:
        have = [(f, c[op]) for f, c in self._inter if op in c]
        if have:
            f, curve = have[0]
            return curve.busbw(size)[0] * self._scale * members / f.ranks_per_node
        return None if self.inter_gbps is None else self.inter_gbps * members

    def op_time(self, op: CollectiveOp, size: int, where: Placement) -> Span:
        """One operation of ``size`` bytes (nccl-tests' S) over a placed group.

        Raises:
            ValueError: Nothing says how fast this platform moves data where the group sits.
        """
        if where.size <= 1:
            return ZERO
        intra = self._intra_busbw(op, size, where.size)
        factor = bus_factor(op, where.size)
        if where.nodes == 1:
            if intra is None:
                raise ValueError(f"no intra-node bandwidth for {op}: give a fabric bundle of "
                                 f"{self.platform.name} (charllm-kit fabric) or a platform "
                                 "profile with an intra_node interconnect")
            t = size * factor / (intra[0] * 1e9)
            return Span(self._datasheet_low(size * factor, t), t, t * intra[1])
        inter = self._inter_busbw(op, size, where.members_per_node)
        if inter is None:
            raise ValueError(f"no inter-node bandwidth for {op}: give a fabric bundle of "
                             f"several {self.platform.name} nodes or a platform profile with "
                             "an inter_node interconnect")
        busbw, slow = (min(inter, intra[0]), intra[1]) if intra is not None else (inter, 1.0)
        t = size * factor / (busbw * 1e9)
        return Span(self._datasheet_low(size * factor, t), t, t * slow)

    def _datasheet_low(self, moved: float, t: float) -> float:
        """With borrowed curves: the datasheet intra-node figure's time, no latency (else t)."""
        if self.borrowed_from is None or not self._intra or self.intra_gbps is None:
            return t
        return min(t, moved / (self.intra_gbps * 1e9))

    def time(self, cfg: RunConfig, c: Collective) -> Span:
        """All ``calls`` of collective ``c`` in the layout ``cfg``, seconds."""
        return self.op_time(c.op, c.size_bytes, place(cfg, c.group)).scale(c.calls)

    def has_measured_intra(self) -> bool:
        """Whether a fabric bundle feeds intra-node times."""
        return bool(self._intra)

    def inter_measured(self) -> bool:
        """Whether a multi-node fabric bundle feeds inter-node times."""
        return bool(self._inter)

    def describe(self) -> list[str]:
        """Which figures feed intra- and inter-node times, for the projection's assumptions."""
        lines = []
        if self._intra and self.borrowed_from is not None:
            lines.append(f"collectives: no fabric bundle of {self.platform.name}: busbw measured "
                         f"on {self.borrowed_from.name} by " + ", ".join(
                             f.name for f, _ in self._intra) + f", scaled by the datasheet "
                         f"intra-node ratio {self._scale:.3g}; the low end at the "
                         f"{self.platform.name} datasheet figure without latency")
        elif self._intra:
            lines.append("intra-node collectives: busbw measured by " + ", ".join(
                f"{f.name} ({f.results.ranks} ranks, {f.results.backend})" for f, _ in self._intra))
        elif self.intra_gbps is not None:
            lines.append(f"intra-node collectives: the platform's {self.intra_gbps:g} GB/s "
                         "intra_node bandwidth as busbw at every size, no latency (no fabric "
                         "bundle given): communication times are lower bounds")
        if self._inter:
            f = self._inter[0][0]
            lines.append(f"inter-node collectives: busbw measured by {f.name} ({f.nodes} nodes "
                         f"x {f.ranks_per_node} ranks), scaled by members per node")
        elif self.inter_gbps is not None:
            lines.append(f"inter-node collectives: the platform profile's {self.inter_gbps:g} "
                         "GB/s inter_node bandwidth per device x the group's members per node "
                         "(one NIC per GPU), not measured here")
        return lines
