"""One run from resolved config to published bundle.

Order: staging directory -> telemetry sampler (own process) -> ranks -> sampler stopped ->
step records, telemetry and metrics assembled -> bundle finalized. Whatever happens after
staging exists (a rank failure, Ctrl-C, a bug in assembly of one part), a bundle is published
whose manifest says how the run ended.
"""

import shutil
import subprocess
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa

import kit
from kit.analysis.metrics import summarize
from kit.bundle.schema import (
    STEPS_SCHEMA,
    TELEMETRY_FIELDS,
    FieldSource,
    Manifest,
    MetricsFile,
    RankRecord,
)
from kit.bundle.writer import BundleStaging, concat_chunks, new_bundle_id
from kit.launch.inventory import node_inventory
from kit.launch.local import LaunchOutcome, launch_local
from kit.launch.progress import ProgressWatcher
from kit.launch.rankfile import (
    CONFIG_FILE,
    RANKS_DIR,
    RankResult,
    read_rank_result,
    recover_rank_result,
    steps_log_path,
    write_config,
)
from kit.spec.run import RunConfig
from kit.telemetry.base import TelemetryError
from kit.telemetry.sampler import SamplerReport, SourceSpec, TelemetrySampler


@dataclass
class SessionResult:
    """What the CLI prints after a run."""

    bundle: Path
    status: str
    error: str | None
    summary: dict[str, Any]
    cfg: RunConfig


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(Path(kit.__file__).parent), "rev-parse", "HEAD"],
            capture_output=True, text=True, timeout=5, check=True,
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def overall_status(
    cfg: RunConfig, outcome: LaunchOutcome, results: list[RankResult | None]
) -> tuple[str, str | None]:
    """Fold per-rank results into the run's status and first error."""
    for res in results:
        if res is not None and res.status in ("failed", "oom"):
            return res.status, res.error
    missing = [r for r, res in enumerate(results) if res is None]
    if missing:
        codes = ", ".join(f"rank {r} exit {outcome.exit_codes.get(r)}" for r in missing)
        return "failed", f"ranks ended without a result ({codes}); see logs/"
    if outcome.interrupted or any(res.status == "interrupted" for res in results if res):
        return "interrupted", "stopped by a signal before all steps ran"
    return "ok", None


def steps_table(results: list[RankResult | None]) -> pa.Table:
    """Rows of ``steps.parquet`` from every rank that reported."""
    rows = []
    for res in results:
        if res is None:
            continue
        stage = res.placement.get("pp_rank", 0)
        for s in res.steps:
            rows.append({"step": s.step, "rank": res.rank, "phase": s.phase, "t_start": s.t_start,
                         "t_end": s.t_end, "tokens": s.tokens, "loss": s.loss, "stage": stage,
                         "gpu_energy_j": s.gpu_energy_j})
    return pa.Table.from_pylist(rows, schema=STEPS_SCHEMA)


def phase_means(res: RankResult) -> dict[str, float] | None:
    """Mean seconds per measured step by phase on one rank; null where none was timed."""
    timed = [s.phases for s in res.steps if s.phase == "measured" and s.phases]
    if not timed:
        return None
    return {k: sum(p[k] for p in timed) / len(timed) for k in timed[0]}


def rank_records(cfg: RunConfig, results: list[RankResult | None], status: str) -> list[RankRecord]:
    """Manifest entries for every rank, including ranks that died silently."""
    out = []
    for r, res in enumerate(results):
        pl = res.placement if res else {}
        rank_status = res.status if res else "failed"
        if rank_status == "ok" and status == "interrupted":
            rank_status = "interrupted"
        out.append(RankRecord(
            rank=r, node=res.node if res else 0, local_rank=res.local_rank if res else r,
            stage=pl.get("pp_rank", 0), tp_rank=pl.get("tp_rank", 0),
            pp_rank=pl.get("pp_rank", 0), dp_rank=pl.get("dp_rank", 0),
            status=rank_status,
            error=(res.error if res else "no result: killed or crashed, see its log")
            if rank_status != "ok" else None,
        ))
    return out


def telemetry_plan(cfg: RunConfig) -> tuple[list[SourceSpec], str]:
    """Sources the node sampler builds, and why a field no source fills is empty.

    Zeus is not a sampler source: its windows live in the ranks (see kit.launch.worker).
    """
    if cfg.telemetry_interval_ms == 0:
        return [], "telemetry off (--telemetry-interval-ms 0)"
    devices = list(range(cfg.devices_per_node or 0))
    specs: list[SourceSpec] = []
    for backend in cfg.platform.telemetry:
        if backend == "host":
            specs.append(("host", {"node": 0}))
        elif backend in ("nvml", "amdsmi"):
            specs.append((backend, {"node": 0, "devices": devices}))
        elif backend == "replay":
            specs.append(("replay", {"node": 0, "trace": cfg.platform.replay_trace}))
    gpu_backends = [b for b in cfg.platform.telemetry if b not in ("host", "zeus")]
    why = (f"no backend of {gpu_backends} could read it" if gpu_backends
           else f"platform {cfg.platform.name} has no device telemetry backend")
    return specs, why


def telemetry_sources(
    report: SamplerReport | None, interval_ms: int, why: str
) -> dict[str, FieldSource]:
    """Which backend fed each canonical field at what period, or why none did."""
    out: dict[str, FieldSource] = {}
    for name in TELEMETRY_FIELDS:
        reason = why
        for src, fields in (report.sources if report else {}).items():
            info = fields.get(name)
            if info is None:
                continue
            if info.readable:
                period = report.mean_period_ms if report and report.mean_period_ms else interval_ms
                period = max(period, info.read_period_ms or 0.0)  # a slow field: its own rate
                notes = [n for n in (
                    info.reason,
                    f"counter updates every {info.update_period_ms:g} ms"
                    if info.update_period_ms else None,
                ) if n]
                out[name] = FieldSource(source=src, period_ms=float(period),
                                        reason="; ".join(notes) or None)
                break
            reason = f"{src}: {info.reason}"
        else:
            out[name] = FieldSource(source=None, period_ms=None, reason=reason)
    return out


def _missing_reason(why: str, report: SamplerReport | None, notes: list[str]) -> str:
    """Why a field has no source; a sampler that failed left no report, maybe some rows."""
    if report is not None or not notes:
        return why
    return f"the sampler gave no report ({notes[-1]}); rows it streamed before are kept"


def device_facts(report: SamplerReport | None, replay: bool) -> list[dict[str, Any]]:
    """Static facts of node 0's devices from the first device backend that reported them.

    With ``replay`` False a replayed trace's devices are skipped: they describe the machine the
    trace was recorded on, not this node.
    """
    for name, devices in (report.devices if report else {}).items():
        if devices and (replay or name != "replay"):
            return devices
    return []


def run_session(cfg: RunConfig, out: Path, command: list[str]) -> SessionResult:
    """Launch ``cfg``, sample telemetry, and publish its bundle under ``out``."""
    staging = BundleStaging(out, new_bundle_id(cfg.workload.name, cfg.platform.name))
    write_config(staging.path, cfg)
    sources, missing_why = telemetry_plan(cfg)
    sampler = TelemetrySampler(
        sources, interval_ms=cfg.telemetry_interval_ms, chunks_dir=staging.chunks_dir
    ) if sources else None
    report: SamplerReport | None = None
    telemetry_notes: list[str] = []
    outcome = LaunchOutcome()
    label = f"{cfg.workload.name} on {cfg.platform.name} x{cfg.world_size}"
    watcher = ProgressWatcher(steps_log_path(staging.path, 0), cfg.total_steps, cfg.warmup, label)
    launch_error: str | None = None
    try:
        try:
            if sampler is not None:
                sampler.start()
        except TelemetryError as e:  # telemetry is lost, the run is not
            telemetry_notes.append(f"telemetry: sampler did not start: {e}")
        outcome = launch_local(cfg, staging.path, staging.logs_dir, on_poll=watcher.poll)
    except Exception as e:  # the launcher itself broke: still publish a bundle saying so
        launch_error = f"launcher: {type(e).__name__}: {e}"
    finally:
        watcher.close()
        if sampler is not None and not telemetry_notes:
            try:
                report = sampler.stop()
            except TelemetryError as e:
                telemetry_notes.append(f"telemetry: {e}")

    results = [read_rank_result(staging.path, r) for r in range(cfg.world_size)]
    status, error = overall_status(cfg, outcome, results)
    if launch_error:
        status, error = "failed", launch_error
    steps = steps_table([r or recover_rank_result(staging.path, i) for i, r in enumerate(results)])
    telemetry = concat_chunks(staging.chunks_dir)
    facts = [{"node": 0, **d} for d in device_facts(report, replay=True)]
    summary, per_device, power, notes = summarize(
        cfg, steps, telemetry, [r.mem_peak_bytes for r in results if r], facts
    )
    notes += [n for r in results[:1] if r for n in r.notes]
    notes += telemetry_notes
    if report is not None:
        notes += [f"telemetry: {e.source} failed at {e.t:.3f}: {e.message}" for e in report.errors]
    metrics = MetricsFile(
        summary=summary,
        per_rank=[{"rank": r.rank, "status": r.status, "mem_peak_bytes": r.mem_peak_bytes,
                   "measured_steps": sum(s.phase == "measured" for s in r.steps),
                   "zeus_measured_energy_j": r.measured_energy_j,
                   "stage": r.placement.get("pp_rank", 0), "phase_time_s": phase_means(r),
                   **r.placement}
                  for r in results if r],
        per_device=per_device,
        power=power,
        notes=notes,
    )
    inventory = node_inventory(device_facts(report, replay=False))
    manifest = Manifest(
        kit_version=kit.__version__,
        git_commit=_git_commit(),
        created_utc=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        status=status,
        error=error,
        command=list(command),
        config=cfg.model_dump(mode="json"),
        workload={**cfg.workload.model_dump(mode="json"),
                  "scaling": cfg.scaling.model_dump(mode="json") if cfg.scaling else None},
        platform=cfg.platform.model_dump(mode="json"),
        inventory=[inventory],
        telemetry_sources=telemetry_sources(report, cfg.telemetry_interval_ms,
                                            _missing_reason(missing_why, report, telemetry_notes)),
        ranks=rank_records(cfg, results, status),
    )
    (staging.path / CONFIG_FILE).unlink(missing_ok=True)
    shutil.rmtree(staging.path / RANKS_DIR, ignore_errors=True)
    path = staging.finalize(manifest, metrics, steps, telemetry)
    return SessionResult(bundle=path, status=status, error=error, summary=summary, cfg=cfg)
