"""Turn a staging folder into a published bundle: rank results, steps, telemetry, metrics.

One path for every way a run ends: the launcher calls it when its ranks are done (however they
ended), and ``bundle recover`` calls it on the staging folder a killed launcher left. It reads
only what is on disk in the staging folder (``run-config.json``, ``ranks/``, telemetry chunks,
the sampler's report, ``logs/``) plus how the launcher saw the ranks end, when it saw it.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

import kit
from kit import lifecycle
from kit.bundle.schema import (
    STEPS_SCHEMA,
    FieldSource,
    Manifest,
    MetricsFile,
    NodeInventory,
    RankRecord,
)
from kit.bundle.telemetry_fields import TELEMETRY_FIELDS
from kit.bundle.writer import BundleStaging, concat_chunks
from kit.cache.compile_cache import entries
from kit.config.run import RunConfig
from kit.config.run_kind import run_kind
from kit.container.detect import container_record
from kit.engines import engine_spec
from kit.launch.inventory import node_inventory
from kit.launch.local import LaunchOutcome, RankExit
from kit.launch.rankfile import SCRATCH, RankResult, read_rank_result, recover_rank_result
from kit.metrics.expert_load import expert_load_summary, experts_rows
from kit.metrics.labels import device_index
from kit.metrics.stragglers import RankStep, straggler_summary, untimed_reason
from kit.metrics.summary import summarize
from kit.telemetry.sampler import REPORT_NAME, SamplerReport

LOG_TAIL_LINES = 10
"""Lines of a failed rank's log kept in its manifest record."""


@dataclass
class RunEnd:
    """How the run ended, as its launcher (or ``bundle recover``) saw it.

    Attributes:
        status: The run's status.
        error: The headline error; None when ok.
        exits: Per rank, how and when its process ended, where the launcher saw it.
        notes: Notes for ``metrics.json`` (telemetry problems, recovery).
    """

    status: str
    error: str | None
    exits: dict[int, RankExit] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass
class NodeData:
    """One node's part of a run, as assembly needs it.

    Attributes:
        inventory: What the node was (with its clock against node 0's on multi-node runs).
        chunks_dir: Where its sampler wrote telemetry chunks and its report.
        report: Its sampler's report, or None.
        offset_s: Seconds added to its step times and telemetry to put them on node 0's clock.
    """

    inventory: NodeInventory
    chunks_dir: Path
    report: SamplerReport | None
    offset_s: float = 0.0


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> list[str]:
    """The last ``lines`` non-empty lines of a log (empty when it is missing)."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    return [ln for ln in text.splitlines() if ln.strip()][-lines:]


def _failed(res: RankResult | None, ex: RankExit | None) -> bool:
    """A rank failed when it left no result, reported a failure, or ended badly before it said
    it finished (a crash after writing an ok result leaves its measurements whole: a note)."""
    if res is None or res.status in ("failed", "oom"):
        return True
    return ex is not None and ex.failed and res.status != "ok"


def _crashed_after_result(
    results: list[RankResult | None], exits: dict[int, RankExit]
) -> list[str]:
    """Notes for ranks that wrote an ok result and then ended badly (e.g. a framework's
    teardown aborting at exit)."""
    return [f"rank {r}: {exits[r].describe()} after writing its ok result (at exit, e.g. in "
            "the framework's teardown); its steps are complete"
            for r, res in enumerate(results)
            if res is not None and res.status == "ok" and r in exits and exits[r].failed]


def run_end(
    outcome: LaunchOutcome,
    results: list[RankResult | None],
    logs_dir: Path,
    interrupted_by: str | None,
    where: Callable[[int], str] | None = None,
) -> RunEnd:
    """Fold how the ranks ended into the run's status and headline error.

    A signal to the launcher makes the run ``interrupted`` whatever the ranks did (ranks it
    killed after their grace are named). Otherwise the headline is the first rank to end
    among those that failed, by the time the launcher reaped it, as torchrun reports it: a
    rank killed by SIGKILL is blamed, not the peer whose collective then broke (at equal times,
    a rank ended by a signal comes first).
    ``where`` names a rank's node on multi-node runs (e.g. ``node 1 (n2)``).
    """
    exits = outcome.exits
    if outcome.interrupted:
        error = interrupted_by or "stopped by a signal before all steps ran"
        if outcome.killed:
            error += (f"; ranks {', '.join(map(str, outcome.killed))} did not stop in time and "
                      "were killed")
        return RunEnd("interrupted", error, exits)
    failed = [r for r, res in enumerate(results) if _failed(res, exits.get(r))]
    if not failed:
        return RunEnd("ok", None, exits, _crashed_after_result(results, exits))
    first = min(failed, key=lambda r: (exits[r].t if r in exits else float("inf"),
                                       not (r in exits and exits[r].signal), r))
    res, ex = results[first], exits.get(first)
    how = ex.describe() if ex else "end not seen"
    if where is not None:
        how += f" on {where(first)}"
    if res is not None and res.status in ("failed", "oom") and res.error:
        return RunEnd(res.status, f"{res.error} ({how}, the first rank to end)", exits)
    tail = log_tail(logs_dir / f"rank{first}.log", 1)
    last = f"; last log line: {tail[-1].strip()!r}" if tail else "; its log is empty"
    return RunEnd("failed", f"rank {first}: {how}, the first rank to end{last}", exits)


def steps_table(
    results: list[RankResult | None], offset_s: Callable[[int], float] = lambda rank: 0.0
) -> pa.Table:
    """Rows of ``steps.parquet`` from every rank that reported, times shifted by the offset of
    the rank's node to node 0's clock."""
    rows = []
    for res in results:
        if res is None:
            continue
        stage = res.placement.get("pp_rank", 0)
        dt = offset_s(res.rank)
        for s in res.steps:
            rows.append({"step": s.step, "rank": res.rank, "phase": s.phase,
                         "t_start": s.t_start + dt, "t_end": s.t_end + dt, "tokens": s.tokens,
                         "loss": s.loss, "stage": stage, "gpu_energy_j": s.gpu_energy_j})
    return pa.Table.from_pylist(rows, schema=STEPS_SCHEMA)


def experts_table(results: list[RankResult | None]) -> pa.Table | None:
    """Rows of ``experts.parquet`` from every rank's counted steps.

    None when no step was counted (a dense run, or an engine that does not count routing).
    """
    counted = [(s.step, res.rank, s.phase, s.expert_tokens)
               for res in results if res is not None for s in res.steps if s.expert_tokens]
    return experts_rows(counted) if counted else None


def phase_means(res: RankResult) -> dict[str, float] | None:
    """Mean seconds per measured step by phase on one rank; null where none was timed."""
    timed = [s.phases for s in res.steps if s.phase == "measured" and s.phases]
    if not timed:
        return None
    return {k: sum(p[k] for p in timed) / len(timed) for k in timed[0]}


def rank_records(
    cfg: RunConfig, results: list[RankResult | None], end: RunEnd, logs_dir: Path
) -> list[RankRecord]:
    """Manifest entries for every rank: placement from the layout, how its process ended."""
    out = []
    for r, res in enumerate(results):
        pl = engine_spec(cfg.engine).placement(cfg.parallel, r)
        ex = end.exits.get(r)
        if res is not None:
            status = res.status
            error = res.error
        else:
            status = "interrupted" if end.status == "interrupted" else "failed"
            error = f"rank {r}: {ex.describe() if ex else 'ended'} without writing its result"
        if status == "ok" and end.status == "interrupted":
            status = "interrupted"
        ok = status == "ok" and (ex is None or not ex.failed)
        per_node = cfg.ranks_per_node
        out.append(RankRecord(
            rank=r, node=r // per_node, local_rank=res.local_rank if res else r % per_node,
            stage=pl["pp_rank"], **pl, status=status,
            error=None if status == "ok" else error,
            exit_code=ex.code if ex else None, signal=ex.signal if ex else None,
            log_tail=[] if ok else log_tail(logs_dir / f"rank{r}.log"),
        ))
    return out


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
                period = (report.field_periods_ms.get(src, {}).get(name) if report else None)
                if period is None:  # not measured: the period asked of the tick or the field
                    period = (report.mean_period_ms if report and report.mean_period_ms
                              else interval_ms)
                    period = max(period, info.read_period_ms or 0.0)
                notes = [n for n in (
                    info.reason,
                    f"counter updates every {info.update_period_ms:g} ms"
                    if info.update_period_ms else None,
                    None if report is None or report.complete
                    else "the sampler ended early: rows stop where it did",
                ) if n]
                out[name] = FieldSource(source=src, period_ms=float(period),
                                        reason="; ".join(notes) or None)
                break
            reason = f"{src}: {info.reason}"
        else:
            out[name] = FieldSource(source=None, period_ms=None, reason=reason)
    return out


def device_facts(report: SamplerReport | None, replay: bool) -> list[dict[str, Any]]:
    """Static facts of node 0's devices from the first device backend that reported them.

    With ``replay`` False a replayed trace's devices are skipped: they describe the machine the
    trace was recorded on, not this node.
    """
    for name, devices in (report.devices if report else {}).items():
        if devices and (replay or name != "replay"):
            return devices
    return []


def read_sampler_report(chunks_dir: Path) -> SamplerReport | None:
    """The sampler's report in a staging folder, complete or as a killed sampler left it."""
    path = chunks_dir / REPORT_NAME
    try:
        return SamplerReport.read(path) if path.is_file() else None
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _share(part: float | None, whole: float | None) -> float | None:
    """``part / whole``; None where either is unknown or ``whole`` is 0."""
    return part / whole if part is not None and whole else None


def sampler_record(node: int, report: SamplerReport) -> dict[str, Any]:
    """What one node's sampler cost and did, for ``metrics.json`` ``samplers``; from a sampler
    that was killed, what its report said after its first tick (``complete`` False). The
    ``measured_*`` figures cover the measured phase only (between the sampler's edge pokes):
    what the instrument took from the training, its start-up left out."""
    ticks, missed = report.measured_ticks, report.measured_missed_ticks
    return {"node": node, "complete": report.complete, "cpu_s": report.cpu_s,
            "wall_s": report.wall_s, "cpu_cores": _share(report.cpu_s, report.wall_s),
            "ticks": report.ticks, "missed_ticks": report.missed_ticks,
            "missed_tick_frac": _share(report.missed_ticks, report.ticks + report.missed_ticks),
            "mean_period_ms": report.mean_period_ms, "rows_written": report.rows_written,
            "measured_cpu_cores": _share(report.measured_cpu_s, report.measured_wall_s),
            "measured_wall_s": report.measured_wall_s,
            "measured_missed_tick_frac": None if ticks is None or missed is None
            else _share(missed, ticks + missed)}


def telemetry_notes(report: SamplerReport | None) -> list[str]:
    """The sampler's failures and how it ended, for ``metrics.json``."""
    if report is None:
        return []
    notes = [f"telemetry: {e.source} failed at {e.t:.3f}: {e.message}" for e in report.errors]
    if report.ended_by == "SIGTERM":
        notes.append("telemetry: the sampler got SIGTERM and stopped there; the run's last "
                     "moments may have no samples")
    return notes


def node_telemetry(nodes: list[NodeData]) -> pa.Table:
    """Every node's telemetry chunks, each node's timestamps shifted onto node 0's clock."""
    tables = []
    for n in nodes:
        table = concat_chunks(n.chunks_dir)
        if n.offset_s and table.num_rows:
            t = table.schema.get_field_index("t")
            table = table.set_column(t, table.schema.field(t),
                                     pc.add(table.column(t), pa.scalar(n.offset_s)))
        tables.append(table)
    return pa.concat_tables(tables)


def assemble_bundle(
    staging: BundleStaging,
    cfg: RunConfig,
    command: list[str],
    end: RunEnd,
    report: SamplerReport | None,
    missing_why: str,
    nodes: list[NodeData] | None = None,
    slurm_job_id: str | None = None,
    launcher_marks: dict[str, float] | None = None,
    compile_cache: dict[str, Any] | None = None,
) -> tuple[Path, dict[str, Any]]:
    """Write the manifest, metrics, steps and telemetry of ``staging`` and publish it.

    Args:
        staging: The run's staging folder.
        cfg: The run's resolved config.
        command: The argv that started the run.
        end: How the run ended (:func:`run_end`, or a recovery's verdict).
        report: The sampler's report, or None when there was none.
        missing_why: Why a telemetry field no source fed is empty.
        nodes: Every node's inventory, telemetry and clock offset, in node order; default: this
            node alone, with ``report`` and the staging folder's chunks.
        slurm_job_id: The Slurm job the run ran in, if any.
        launcher_marks: The launcher's start-up and teardown marks (kit.lifecycle), for
            ``metrics.json``'s ``lifecycle``.
        compile_cache: The compile cache the ranks used (kit.cache.compile_cache.prepare), for the
            manifest; its file count now is added as ``entries_after``.

    Returns:
        The published bundle directory and its summary metrics.

    Raises:
        OSError: A file could not be written; the staging folder keeps its inputs.
    """
    if nodes is None:
        inventory = node_inventory(device_facts(report, replay=False), cfg.devices_per_node)
        nodes = [NodeData(inventory, staging.chunks_dir, report)]
    results = [read_rank_result(staging.path, r) for r in range(cfg.world_size)]
    streamed = [r or recover_rank_result(staging.path, i) for i, r in enumerate(results)]

    def node_of(rank: int) -> int:
        return min(rank // cfg.ranks_per_node, len(nodes) - 1)

    def offset_s(rank: int) -> float:
        return nodes[node_of(rank)].offset_s

    def device_of(rank: int) -> tuple[int, int]:
        """A rank's node and the driver index of its GPU (its node's listed GPUs, in order)."""
        node = node_of(rank)
        return node, device_index(nodes[node].inventory.gpus, rank % cfg.ranks_per_node)

    steps = steps_table(streamed, offset_s)
    experts = experts_table(streamed)
    telemetry = node_telemetry(nodes)
    facts = [{"node": i, **d} for i, n in enumerate(nodes)
             for d in device_facts(n.report, replay=True)]
    summary, per_device, power, notes = summarize(
        cfg, steps, telemetry, [r.mem_peak_bytes for r in results if r], facts,
        zeus_phase_j=[r.measured_energy_j for r in results
                      if r and any(s.phase == "measured" for s in r.steps)])
    notes += [n for r in results[:1] if r for n in r.notes]
    notes += end.notes + telemetry_notes(report)
    trains = run_kind(cfg).trains  # a fabric run has no workload model, no step
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
        lifecycle=lifecycle.summarize(
            launcher_marks or {}, [r.timeline for r in results if r],
            min((s.t_start for r in results if r for s in r.steps if s.step == 0), default=None)),
        stragglers=straggler_summary(
            [RankStep(res.rank, res.placement.get("pp_rank", 0), s.step,
                      s.t_start + offset_s(res.rank), s.t_end + offset_s(res.rank), s.phases)
             for res in streamed if res for s in res.steps if s.phase == "measured"],
            telemetry, device_of, untimed_reason(cfg.engine, cfg.phase_timers)),
        expert_load=expert_load_summary(experts, getattr(cfg.workload, "moe_top_k", 0) or 0,
                                        cfg.parallel.ep, cfg.tokens_per_step if trains else None),
        execution=engine_spec(cfg.engine).execution(cfg).as_json() if trains else {},
        notes=notes,
        samplers=[sampler_record(i, n.report) for i, n in enumerate(nodes) if n.report],
    )
    manifest = Manifest(
        kit_version=kit.__version__,
        git_commit=kit.git_commit(),
        created_utc=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        status=end.status,
        error=end.error,
        command=list(command),
        config=cfg.model_dump(mode="json"),
        workload={**cfg.workload.model_dump(mode="json"),
                  "scaling": cfg.scaling.model_dump(mode="json") if cfg.scaling else None},
        platform=cfg.platform.model_dump(mode="json"),
        inventory=[n.inventory for n in nodes],
        telemetry_sources=telemetry_sources(report, cfg.telemetry_interval_ms, missing_why),
        ranks=rank_records(cfg, results, end, staging.logs_dir),
        container=container_record(),
        slurm_job_id=slurm_job_id,
        compile_cache=None if compile_cache is None else {
            **compile_cache, "entries_after": entries(Path(compile_cache["dir"]))},
    )
    return staging.finalize(manifest, metrics, steps, telemetry, SCRATCH, experts), summary
