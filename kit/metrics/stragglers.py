"""Stragglers as a measurement: per step, each rank's compute time and its wait for the slowest.

Every step starts on all ranks together (the stop-flag all-reduce) and ends for all of them
after the data-parallel gradient synchronization (and, with pipelines, the last p2p
exchange), so a step's wall time is the same on every rank and a slow rank shows up as the
others' exposed communication: they sit in the gradient all-reduce (or a pipeline receive)
until it arrives. The megatron engine's phase timers split each rank's step
(kit.engines.megatron.phase_timers), and from them, per measured step and rank
(docs/metrics.md, "Stragglers"):

* ``compute_s = (t_end - t_start) - (grad_sync_s + pipeline_p2p_s)``: the step less the time the
  rank waited on gradient synchronization and pipeline p2p. Tensor- and expert-parallel
  collectives run inside forward and backward and stay in it: a slow rank's tensor-parallel
  peers wait there, so their compute grows with it and the measure finds the slow rank's
  tensor-parallel group (its device's temperature and clock tell the rank within it).
* Ranks are compared with the ranks of their pipeline stage (the same layers, other data);
  stages differ by design (embedding, logits) and are not stragglers of each other. In a step,
  the stage's slowest rank is the one with the largest ``compute_s``; every rank's
  ``wait_s`` is that largest ``compute_s`` less its own (what it waited for the slowest, 0 for
  the slowest itself), and the step's ``lag_s`` is the slowest's ``compute_s`` less the median
  of the stage's other ranks' (how much the slowest held the others up).

The summary (``metrics.json`` ``stragglers``) names the rank that held its stage up longest in
all (the largest sum of ``lag_s`` over the steps it was slowest): how often it was slowest
(``slowest_frac``; 1 / ``ranks_compared`` is chance), by how much (``lag_s`` median and p90,
``lag_frac_median`` = lag / the other ranks' median compute), and its GPU's temperature and SM clock
over those steps beside the other devices of its stage. ``per_rank`` has every rank's figures.
Without phase timers (the deepspeed and fsdp2 engines, ``--no-phase-timers``, CUDA-graph steps)
compute and waiting cannot be told apart: every figure is null and ``reason`` names which.

Anchors: Megatron-LM's StragglerDetector (per-rank timing of the same work, min/max across
ranks with each GPU's power, temperature and clock) and NVIDIA Resiliency Extension's straggler
detection (each rank's timing relative to the best rank's).
"""

import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kit.metrics.attribution import MEASURED, StepWindows, window_index

EXPOSED_COMM_PHASES = ("grad_sync_s", "pipeline_p2p_s")
"""Phase timers whose time is a rank waiting on other ranks between steps' work."""
SUMMARY_KEYS = ("basis", "steps", "slowest_rank", "stage", "ranks_compared", "slowest_frac",
                "lag_s_median", "lag_s_p90", "lag_frac_median", "temp_gpu_c", "clock_sm_mhz",
                "others_temp_gpu_c", "others_clock_sm_mhz", "per_rank", "reason")
"""Keys of ``metrics.json`` ``stragglers`` (all present; null where not measured)."""


@dataclass(frozen=True)
class RankStep:
    """One measured step of one rank, as the rank recorded it.

    Attributes:
        rank: Global rank.
        stage: Its pipeline stage.
        step: Step index.
        t_start: Step start, unix seconds (on node 0's clock).
        t_end: Step end, unix seconds.
        phases: Seconds by phase from the engine's timers; None where not timed.
    """

    rank: int
    stage: int
    step: int
    t_start: float
    t_end: float
    phases: dict[str, float] | None

    @property
    def compute_s(self) -> float | None:
        """The step less its exposed gradient sync and pipeline p2p; None without timers."""
        if self.phases is None:
            return None
        waited = sum(self.phases.get(k, 0.0) for k in EXPOSED_COMM_PHASES)
        return max(0.0, self.t_end - self.t_start - waited)


def _p90(values: list[float]) -> float | None:
    return float(np.percentile(values, 90)) if values else None


def _median(values: list[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def _unmeasured(reason: str, steps: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = dict.fromkeys(SUMMARY_KEYS)
    out.update(basis="phase timers", steps=steps, per_rank=[], reason=reason)
    return out


@dataclass
class _Rank:
    stage: int
    compute: list[float]
    wait: list[float]
    lag: list[float]
    lag_frac: list[float]
    slowest_steps: list[int]
    steps: int = 0


def _compare(steps: list[RankStep]) -> tuple[dict[int, _Rank], dict[int, dict[int, tuple]]]:
    """Per rank its figures; per stage and step the step's window (start, end, slowest)."""
    by_step: dict[tuple[int, int], list[RankStep]] = defaultdict(list)
    for s in steps:
        by_step[(s.stage, s.step)].append(s)
    size = {g: len({s.rank for s in steps if s.stage == g}) for g in {s.stage for s in steps}}
    ranks: dict[int, _Rank] = {}
    windows: dict[int, dict[int, tuple]] = defaultdict(dict)
    for (stage, step), rows in sorted(by_step.items()):
        if len(rows) < max(2, size[stage]) or any(r.compute_s is None for r in rows):
            continue
        compute = {r.rank: float(r.compute_s or 0.0) for r in rows}
        slowest = min(compute, key=lambda r: (-compute[r], r))
        median = statistics.median(c for r, c in compute.items() if r != slowest)
        lag = compute[slowest] - median
        for r, c in compute.items():
            fig = ranks.setdefault(r, _Rank(stage, [], [], [], [], []))
            fig.steps += 1
            fig.compute.append(c)
            fig.wait.append(compute[slowest] - c)
        ranks[slowest].slowest_steps.append(step)
        ranks[slowest].lag.append(lag)
        ranks[slowest].lag_frac.append(lag / median if median > 0 else 0.0)
        windows[stage][step] = (min(r.t_start for r in rows), max(r.t_end for r in rows),
                                slowest)
    return ranks, windows


def _device_medians(telemetry: pa.Table, spans: list[tuple[float, float]],
                    devices: set[tuple[int, int]]) -> tuple[float | None, float | None]:
    """Median temperature and SM clock of ``devices`` (node, device) inside ``spans``."""
    gpu = telemetry.filter(pc.equal(telemetry["source"], "gpu")) if telemetry.num_rows else None
    if gpu is None or gpu.num_rows == 0 or not spans or not devices:
        return None, None
    spans = sorted(spans)
    windows = StepWindows(np.arange(len(spans), dtype=np.int32),
                          np.array([a for a, _ in spans]), np.array([b for _, b in spans]),
                          np.full(len(spans), MEASURED, np.int8))
    inside = window_index(gpu["t"].to_numpy(), windows) >= 0
    node = pc.fill_null(gpu["node"], -1).to_numpy()
    device = pc.fill_null(gpu["device"], -1).to_numpy()
    mine = np.zeros(len(node), bool)
    for n, d in devices:
        mine |= (node == n) & (device == d)
    rows = inside & mine
    out = []
    for name in ("temp_gpu_c", "clock_sm_mhz"):
        x = gpu[name].to_numpy(zero_copy_only=False).astype(float)[rows]
        x = x[~np.isnan(x)]
        out.append(float(np.median(x)) if len(x) else None)
    return out[0], out[1]


def untimed_reason(engine: str, phase_timers: bool) -> str:
    """Why a run's steps have no phase timers: its engine has none (only megatron times
    phases), ``--no-phase-timers``, or else its CUDA-graphed step."""
    if engine != "megatron":
        return f"the {engine} engine"
    return "--no-phase-timers" if not phase_timers else "CUDA-graph steps"


def straggler_summary(steps: list[RankStep], telemetry: pa.Table,
                      device_of: Callable[[int], tuple[int, int]],
                      untimed: str) -> dict[str, Any]:
    """``metrics.json`` ``stragglers`` (module docstring) from the ranks' measured steps.

    Args:
        steps: Every rank's measured steps (:class:`RankStep`).
        telemetry: Rows of ``telemetry.parquet``; GPU rows give temperature and clock.
        device_of: A rank's ``(node, device)``, the device by its driver index (the one the
            telemetry rows name).
        untimed: Why steps without phase timers have none (:func:`untimed_reason`).
    """
    if not steps:
        return _unmeasured("no measured steps")
    if not any(s.phases is not None for s in steps):
        return _unmeasured(f"no per-phase step timers ({untimed}): a rank's compute and its "
                           "waiting cannot be told apart")
    ranks, windows = _compare(steps)
    if not ranks:
        return _unmeasured("no pipeline stage has two or more ranks with timed steps: "
                           "nothing to compare")
    worst = min(ranks, key=lambda r: (-sum(ranks[r].lag), -len(ranks[r].lag), r))
    fig = ranks[worst]
    device = device_of(worst)
    peers = {device_of(r) for r, f in ranks.items() if f.stage == fig.stage and r != worst}
    spans = [(a, b) for step, (a, b, _) in windows[fig.stage].items()
             if step in set(fig.slowest_steps)]
    temp, clock = _device_medians(telemetry, spans, {device})
    others_temp, others_clock = _device_medians(telemetry, spans, peers)
    return {
        "basis": "phase timers",
        "steps": len(windows[fig.stage]),
        "slowest_rank": worst,
        "stage": fig.stage,
        "ranks_compared": 1 + len(peers),
        "slowest_frac": len(fig.slowest_steps) / fig.steps,
        "lag_s_median": _median(fig.lag),
        "lag_s_p90": _p90(fig.lag),
        "lag_frac_median": _median(fig.lag_frac),
        "temp_gpu_c": temp,
        "clock_sm_mhz": clock,
        "others_temp_gpu_c": others_temp,
        "others_clock_sm_mhz": others_clock,
        "per_rank": [{"rank": r, "stage": f.stage, "steps": f.steps,
                      "slowest_steps": len(f.slowest_steps),
                      "slowest_frac": len(f.slowest_steps) / f.steps,
                      "compute_s_median": _median(f.compute), "wait_s_median": _median(f.wait),
                      "wait_s_p90": _p90(f.wait), "lag_s_median": _median(f.lag),
                      "lag_s_p90": _p90(f.lag), "lag_s_total": sum(f.lag)}
                     for r, f in sorted(ranks.items())],
        "reason": None,
    }


def straggler_line(stragglers: dict[str, Any]) -> str:
    """One line for people, e.g. ``rank 1 (stage 0) slowest in 38 of 40 steps (95%, 2 ranks
    compared), lag median 0.21 s, p90 0.25 s (35% of the others' compute); GPU 71 C at 1755 MHz,
    the others 65 C at 1980 MHz``; ``not measured: ...`` or ``n/a`` (an older bundle).

    Raises:
        ValueError: ``slowest_rank`` names no rank of ``per_rank`` (an edited bundle).
    """
    if not stragglers:
        return "n/a (bundle written before the kit measured stragglers)"
    if stragglers.get("slowest_rank") is None:
        return f"not measured: {stragglers.get('reason')}"
    s = stragglers
    per = next((p for p in s["per_rank"] if p["rank"] == s["slowest_rank"]), None)
    if per is None:  # an edited bundle: guard.bundle_input_errors makes this one error line
        raise ValueError(f"stragglers.slowest_rank {s['slowest_rank']!r} names no rank of "
                         "stragglers.per_rank")
    line = (f"rank {s['slowest_rank']} (stage {s['stage']}) slowest in {per['slowest_steps']} "
            f"of {per['steps']} steps ({s['slowest_frac'] * 100:.0f}%, {s['ranks_compared']} "
            f"ranks compared), lag median {s['lag_s_median']:.3g} s, p90 {s['lag_s_p90']:.3g} s "
            f"({s['lag_frac_median'] * 100:.0f}% of the others' compute)")
    if s.get("temp_gpu_c") is not None or s.get("clock_sm_mhz") is not None:
        line += (f"; GPU {_thermal(s['temp_gpu_c'], s['clock_sm_mhz'])}, the others "
                 f"{_thermal(s['others_temp_gpu_c'], s['others_clock_sm_mhz'])}")
    return line


def _thermal(temp: float | None, clock: float | None) -> str:
    t = "n/a C" if temp is None else f"{temp:.0f} C"
    c = "n/a MHz" if clock is None else f"{clock:.0f} MHz"
    return f"{t} at {c}"
