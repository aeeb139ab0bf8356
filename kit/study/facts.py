"""What the findings read of a bundle: its run settings and measured figures, as plain data.

Read from ``manifest.json`` and ``metrics.json`` only (plus ``fabric.json`` of a fabric run and,
where present, the link counters of ``telemetry.parquet`` and the profile's per-rank breakdowns
``profile/rank<N>.breakdown.json``), so that the findings can be drawn from the small files a
results folder commits, without the bundles' traces.
"""

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kit.bundle.reader import read_table
from kit.bundle.schema import STEPS_SCHEMA
from kit.bundle.telemetry_fields import TELEMETRY_SCHEMA
from kit.engines.execution import Execution, execution_of
from kit.errors import KitInputError
from kit.metrics.kernels import RankBreakdown

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
        link_readings: Device index -> counter readings behind its ``link_gbps``.
        fabric: ``fabric.json`` of a fabric run, else None.
        engine: Training engine (megatron, deepspeed, fsdp2).
        optim: The run's ``optim`` settings (recompute, overlap, dist_optimizer, fsdp, ...).
        execution: Graphed or eager, from ``metrics.json`` ``execution`` or, in bundles written
            before that field, the engine's notes (:func:`kit.engines.execution.execution_of`);
            None where neither tells.
        speed_features: The engine's speed features as its ``speed features:`` note lists
            them (empty: none); None without the note.
        dtype: Precision of the run (bf16, fp16, fp32).
        seq_length: The workload's sequence length.
        telemetry_interval_ms: The sampler's period (peaks over a longer period read lower).
        kit_version: The kit's version and commit that ran it, e.g. ``0.1.0 (a287184)``.
        gpu_util_pct: Mean NVML/amdsmi GPU utilization over the devices that measured it
            (percent of the time a kernel ran); None without GPU telemetry.
        idle_share: Share of the profiled steps' time with no kernel running on the device,
            mean over ranks; None without profile breakdowns of a device timeline (on a host
            timeline idle is Python time, which gloo's threads fill with communication when
            it overlaps: not a measure of the host starving a device).
        exposed_comm_s: Communication that ran with no compute beside it, seconds per profiled
            step, mean over ranks; None without profile breakdowns.
        measured_steps: Measured steps of rank 0.
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
    link_readings: dict[int, int] = field(default_factory=dict)
    fabric: dict[str, Any] | None = None
    engine: str = "megatron"
    optim: dict[str, Any] = field(default_factory=dict)
    execution: Execution | None = None
    speed_features: tuple[str, ...] | None = None
    dtype: str | None = None
    seq_length: int | None = None
    telemetry_interval_ms: int | None = None
    kit_version: str | None = None
    gpu_util_pct: float | None = None
    idle_share: float | None = None
    exposed_comm_s: float | None = None
    measured_steps: int | None = None

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


def _link_rates(path: Path) -> tuple[dict[int, float], dict[int, int]]:
    """Mean link rate per node-0 device over the measured steps, from the cumulative counters,
    and the readings behind each.

    The tables are read as every reader of bundles reads them, within the read budget
    (:mod:`kit.bundle.budget`): ``study --from --allow-unverified`` may be given a bundle made
    to decode to more than memory holds.

    Raises:
        BundleError: A table of another schema, unreadable or over the read budget.
    """
    if not ((path / "telemetry.parquet").is_file() and (path / "steps.parquet").is_file()):
        return {}, {}
    s = read_table(path, "steps.parquet", STEPS_SCHEMA).select(
        ["phase", "t_start", "t_end"]).to_pydict()
    spans = [(a, b) for ph, a, b in zip(s["phase"], s["t_start"], s["t_end"], strict=True)
             if ph == "measured"]
    if not spans:
        return {}, {}
    t0, t1 = min(a for a, _ in spans), max(b for _, b in spans)
    cols = ["t", "source", "node", "device", "link_tx_bytes", "link_rx_bytes"]
    tel = read_table(path, "telemetry.parquet", TELEMETRY_SCHEMA).select(cols).to_pydict()
    out: dict[int, float] = {}
    readings: dict[int, int] = {}
    by_device: dict[int, list[tuple[float, float]]] = {}
    for t, src, node, dev, tx, rx in zip(*(tel[c] for c in cols), strict=True):
        if src == "gpu" and node == 0 and tx is not None and rx is not None and t0 <= t <= t1:
            by_device.setdefault(int(dev), []).append((t, float(tx) + float(rx)))
    for dev, rows in by_device.items():
        rows.sort()
        t, b = np.array([r[0] for r in rows]), np.array([r[1] for r in rows])
        if len(t) > 1 and t[-1] > t[0]:
            out[dev] = float(b[-1] - b[0]) / float(t[-1] - t[0]) / 1e9
            readings[dev] = len(t)
    return out, readings


def _profile(path: Path) -> tuple[float | None, float | None]:
    """Idle share of the profiled steps' time (device timelines only: BundleFacts.idle_share)
    and exposed communication seconds per profiled step, each the mean over the ranks'
    breakdowns; None where there are none."""
    folder = path / "profile"
    files = sorted(folder.glob("rank*.breakdown.json")) if folder.is_dir() else []
    idle, exposed = [], []
    for file in files:
        try:
            rank = RankBreakdown.model_validate_json(file.read_text(encoding="utf-8"))
        except ValueError as e:  # pydantic's ValidationError is one
            raise KitInputError(f"{file} is not a profile breakdown ({e})".splitlines()[0]) \
                from None
        window = sum(step.window_s for step in rank.steps)
        if not rank.steps or window <= 0:
            continue
        cats = [c for step in rank.steps for c in step.categories]
        if rank.timeline == "device":
            idle.append(sum(c.time_s for c in cats if c.kind == "idle") / window)
        exposed.append(sum(c.time_s for c in cats if c.kind == "communication")
                       / len(rank.steps))
    return _mean_or_none(idle), _mean_or_none(exposed)


def _speed_features(notes: list[str]) -> tuple[str, ...] | None:
    """The features an engine's ``speed features: a, b`` note lists; None without the note."""
    note = next((n for n in notes if n.startswith("speed features:")), None)
    if note is None:
        return None
    listed = {f.strip() for f in note.split(":", 1)[1].split(",")} - {"", "none"}
    return tuple(sorted(listed))


def _kit_version(manifest: dict[str, Any]) -> str | None:
    version, commit = manifest.get("kit_version"), manifest.get("git_commit")
    if version is None:
        return None
    return f"{version} ({str(commit)[:7]})" if commit else str(version)


def _mean_or_none(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def read_facts(path: str | Path) -> BundleFacts:
    """The facts of the bundle at ``path``.

    Raises:
        KitInputError: ``path`` holds no readable ``manifest.json`` / ``metrics.json``, or a
            table or profile breakdown it reads is unreadable or over the read budget
            (:class:`kit.errors.BundleError`).
    """
    root = Path(path)
    manifest, metrics = _load(root, "manifest.json"), _load(root, "metrics.json")
    cfg = manifest.get("config") or {}
    platform = cfg.get("platform") or {}
    optim = cfg.get("optim") or {}
    fabric_file = root / "fabric.json"
    ranks = metrics.get("per_rank") or []
    devices = list(metrics.get("per_device") or [])
    notes = [str(n) for n in metrics.get("notes") or []]
    links, readings = _link_rates(root)
    idle_share, exposed_comm_s = _profile(root)
    workload = cfg.get("workload") or {}
    trained = not fabric_file.is_file()
    return BundleFacts(
        name=root.name, path=root, status=manifest.get("status", "failed"),
        platform=platform.get("name", "?"),
        memory_per_device_gib=platform.get("memory_per_device_gib"),
        workload=workload.get("name", "?"),
        nodes=int(cfg.get("nodes") or 1),
        world_size=int((metrics.get("summary") or {}).get("world_size") or 1),
        parallel=dict(cfg.get("parallel") or {"tp": 1, "pp": 1, "dp": 1}),
        recompute=optim.get("recompute", "none"), overlap=bool(optim.get("overlap")),
        micro_batch_size=int(cfg.get("micro_batch_size") or 1),
        global_batch_size=int(cfg.get("global_batch_size") or 1),
        summary=dict(metrics.get("summary") or {}),
        devices=devices,
        phase_time_s=ranks[0].get("phase_time_s") if ranks else None,
        chassis={int(c["device"]): (int(c["row"]), int(c["col"]))
                 for c in platform.get("chassis") or []},
        link_gbps=links, link_readings=readings,
        fabric=None if trained else json.loads(fabric_file.read_text(encoding="utf-8")),
        engine=str(cfg.get("engine") or "megatron"), optim=dict(optim),
        execution=execution_of(metrics.get("execution"), notes) if trained else None,
        speed_features=_speed_features(notes), dtype=cfg.get("dtype"),
        seq_length=workload.get("seq_length"),
        telemetry_interval_ms=cfg.get("telemetry_interval_ms"),
        kit_version=_kit_version(manifest),
        gpu_util_pct=_mean_or_none([float(d["util_gpu_pct_mean"]) for d in devices
                                    if d.get("util_gpu_pct_mean") is not None]),
        idle_share=idle_share, exposed_comm_s=exposed_comm_s,
        measured_steps=ranks[0].get("measured_steps") if ranks else None,
    )
