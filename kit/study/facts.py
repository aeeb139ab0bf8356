"""What the findings read of a bundle: its run settings and measured figures, as plain data.

Read from ``manifest.json`` and ``metrics.json`` only (plus ``fabric.json`` of a fabric run and,
where present, the link counters of ``telemetry.parquet``), so that the findings can be drawn
from the small files a results folder commits, without the bundles' traces.
"""

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from kit.errors import KitInputError

THERMAL_REASONS = ("thermal_sw", "thermal_hw")
"""Throttle reasons that are the device's temperature (kit.telemetry's vendor-neutral bits)."""


@dataclass(frozen=True)
class BundleFacts:
    """One bundle's settings and figures that the findings compare.

    Attributes:
        name: The bundle folder's name (what a finding cites).
        path: The bundle folder.
        status: How the run ended (ok, failed, oom, interrupted).
        platform: Platform name (h100, h200, cpu, ...).
        memory_per_device_gib: The platform's device memory, GiB; None on cpu.
        workload: Workload name.
        nodes: Nodes of the run.
        world_size: Ranks of the run.
        parallel: tp, pp, dp, cp, ep (ints), vpp (int or None) and sp (bool).
        recompute: none, selective or full.
        overlap: Grad-reduce / param-gather overlap on.
        micro_batch_size: Samples per micro-batch.
        global_batch_size: Samples per optimizer step.
        summary: ``metrics.json`` summary (null = not measured).
        devices: ``metrics.json`` per-device figures (one dict per device).
        phase_time_s: Rank 0's per-step phase times (forward_s, pipeline_p2p_s, ...) or None.
        chassis: Device index -> (row, col) in the platform's chassis top view.
        link_gbps: Device index -> NVLink/xGMI bytes (tx + rx) per second over the measured
            steps, 1e9 B/s; empty where the counters are absent.
        fabric: ``fabric.json`` of a fabric run, else None.
    """

    name: str
    path: Path
    status: str
    platform: str
    memory_per_device_gib: float | None
    workload: str
    nodes: int
    world_size: int
    parallel: dict[str, Any]
    recompute: str
    overlap: bool
    micro_batch_size: int
    global_batch_size: int
    summary: dict[str, Any]
    devices: list[dict[str, Any]]
    phase_time_s: dict[str, float] | None
    chassis: dict[int, tuple[int, int]] = field(default_factory=dict)
    link_gbps: dict[int, float] = field(default_factory=dict)
    fabric: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        """Whether the run ended ok and is a training run (not a fabric benchmark)."""
        return self.status == "ok" and self.fabric is None

    @property
    def micro_batches(self) -> int:
        """Micro-batches per step per data-parallel replica (the pipeline's fill)."""
        dp = self.parallel.get("dp") or 1
        return max(1, self.global_batch_size // (self.micro_batch_size * dp))

    @property
    def layout(self) -> str:
        """The parallel layout, e.g. ``tp2-pp2-dp1-sp``."""
        p = self.parallel
        parts = [f"tp{p['tp']}", f"pp{p['pp']}", f"dp{p['dp']}"]
        parts += [f"ep{p['ep']}"] if p.get("ep", 1) > 1 else []
        parts += [f"vpp{p['vpp']}"] if p.get("vpp") else []
        parts += ["sp"] if p.get("sp") else []
        return "-".join(parts)

    def device_values(self, key: str) -> dict[int, float]:
        """Device index -> a per-device figure, for the devices that measured it."""
        return {int(d["device"]): float(d[key]) for d in self.devices
                if d.get(key) is not None and d.get("node", 0) == 0}

    def worst(self, key: str) -> float | None:
        """The largest per-device value of ``key`` (e.g. the worst GPU's peak-to-mean)."""
        values = self.device_values(key)
        return max(values.values()) if values else None

    def thermal_throttle(self) -> dict[int, float]:
        """Device index -> share of samples throttled for temperature (0..1)."""
        out = {}
        for d in self.devices:
            reasons = d.get("throttle_frac_by_reason")
            if reasons and d.get("node", 0) == 0:
                out[int(d["device"])] = sum(float(reasons.get(r) or 0.0) for r in THERMAL_REASONS)
        return out


def _load(path: Path, name: str) -> dict[str, Any]:
    try:
        return json.loads((path / name).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise KitInputError(f"{path}: cannot read {name} ({e})".splitlines()[0]) from None


def _link_rates(path: Path) -> dict[int, float]:
    """Mean link rate per node-0 device over the measured steps, from the cumulative counters."""
    telemetry, steps = path / "telemetry.parquet", path / "steps.parquet"
    if not (telemetry.is_file() and steps.is_file()):
        return {}
    s = pq.read_table(steps, columns=["phase", "t_start", "t_end"]).to_pydict()
    spans = [(a, b) for ph, a, b in zip(s["phase"], s["t_start"], s["t_end"], strict=True)
             if ph == "measured"]
    if not spans:
        return {}
    t0, t1 = min(a for a, _ in spans), max(b for _, b in spans)
    cols = ["t", "source", "node", "device", "link_tx_bytes", "link_rx_bytes"]
    tel = pq.read_table(telemetry, columns=cols).to_pydict()
    out: dict[int, float] = {}
    by_device: dict[int, list[tuple[float, float]]] = {}
    for t, src, node, dev, tx, rx in zip(*(tel[c] for c in cols), strict=True):
        if src == "gpu" and node == 0 and tx is not None and rx is not None and t0 <= t <= t1:
            by_device.setdefault(int(dev), []).append((t, float(tx) + float(rx)))
    for dev, rows in by_device.items():
        rows.sort()
        t, b = np.array([r[0] for r in rows]), np.array([r[1] for r in rows])
        if len(t) > 1 and t[-1] > t[0]:
            out[dev] = float(b[-1] - b[0]) / float(t[-1] - t[0]) / 1e9
    return out


def read_facts(path: str | Path) -> BundleFacts:
    """The facts of the bundle at ``path``.

    Raises:
        KitInputError: ``path`` holds no readable ``manifest.json`` / ``metrics.json``.
    """
    root = Path(path)
    manifest, metrics = _load(root, "manifest.json"), _load(root, "metrics.json")
    cfg = manifest.get("config") or {}
    platform = cfg.get("platform") or {}
    optim = cfg.get("optim") or {}
    fabric_file = root / "fabric.json"
    ranks = metrics.get("per_rank") or []
    return BundleFacts(
        name=root.name, path=root, status=manifest.get("status", "failed"),
        platform=platform.get("name", "?"),
        memory_per_device_gib=platform.get("memory_per_device_gib"),
        workload=(cfg.get("workload") or {}).get("name", "?"),
        nodes=int(cfg.get("nodes") or 1),
        world_size=int((metrics.get("summary") or {}).get("world_size") or 1),
        parallel=dict(cfg.get("parallel") or {"tp": 1, "pp": 1, "dp": 1}),
        recompute=optim.get("recompute", "none"), overlap=bool(optim.get("overlap")),
        micro_batch_size=int(cfg.get("micro_batch_size") or 1),
        global_batch_size=int(cfg.get("global_batch_size") or 1),
        summary=dict(metrics.get("summary") or {}),
        devices=list(metrics.get("per_device") or []),
        phase_time_s=ranks[0].get("phase_time_s") if ranks else None,
        chassis={int(c["device"]): (int(c["row"]), int(c["col"]))
                 for c in platform.get("chassis") or []},
        link_gbps=_link_rates(root),
        fabric=json.loads(fabric_file.read_text(encoding="utf-8"))
        if fabric_file.is_file() else None,
    )
