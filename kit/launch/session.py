"""One run from resolved config to published bundle.

Order: staging directory -> telemetry sampler (own process) -> ranks -> sampler stopped ->
bundle assembled and published (kit.launch.assemble). From staging to publication SIGINT and
SIGTERM only count (kit.launch.signals), so whatever happens after staging exists (a rank
failure, a dead sampler, Ctrl-C, a job's end) a bundle is published whose manifest says how the
run ended; a CLI run then ignores them until it exits, so its exit code is the run's. Only a
launcher killed outright leaves its staging folder, with everything streamed so far, for
``bundle recover``.
"""

import contextlib
import errno
import importlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kit.bundle.writer import BundleStaging, new_bundle_id
from kit.cache import compile_cache
from kit.config.run import RunConfig
from kit.config.run_kind import run_kind
from kit.errors import RunNotPublished
from kit.launch.local import LaunchOutcome, launch_local
from kit.launch.progress import RunProgress
from kit.launch.rankfile import (
    mark_unpublished,
    read_rank_result,
    write_config,
    write_launcher_record,
)
from kit.launch.signals import SignalCounter
from kit.launch.watchdog import StallWatchdog, stall_end, stall_watchdog
from kit.lifecycle import Marks, describe, launcher_marks
from kit.telemetry import RANK_SIDE_SOURCES, load_source_class, source_target
from kit.telemetry.base import TelemetryError
from kit.telemetry.edges import EDGE_ENV, SAMPLER_START_TIMEOUT_S, mark_sampler_ready
from kit.telemetry.sampler import SamplerReport, SourceSpec, TelemetrySampler

SAMPLER_STOP_TIMEOUT_S = 10.0
"""How long the sampler may take to write its last chunk and report once asked to stop."""


@dataclass
class SessionResult:
    """What the CLI prints after a run."""

    bundle: Path
    status: str
    error: str | None
    summary: dict[str, Any]
    cfg: RunConfig
    timing: str | None = None
    """Where start-up and teardown spent their time, one line (kit.lifecycle.describe)."""
    lifecycle: dict[str, Any] | None = None
    """``metrics.json``'s ``lifecycle`` plus ``last_step_to_published_s``, for ``--json``."""
    compile_cache: dict[str, Any] | None = None
    """The compile cache the ranks used (kit.cache.compile_cache.prepare), None when off."""


def telemetry_plan(cfg: RunConfig, node: int = 0) -> tuple[list[SourceSpec], str]:
    """Sources node ``node``'s sampler builds (each backend's own :meth:`plan`), and why a
    field no source fills is empty.

    Zeus is not a sampler source: its windows live in the ranks (see kit.launch.worker).
    """
    if cfg.telemetry_interval_ms == 0:
        return [], "telemetry off (--telemetry-interval-ms 0)"
    backends = {name: load_source_class(source_target(name))
                for name in cfg.platform.telemetry if name not in RANK_SIDE_SOURCES}
    specs: list[SourceSpec] = [(name, cls.plan(cfg, node=node)) for name, cls in backends.items()]
    device_backends = [name for name, cls in backends.items() if cls.reads_devices]
    why = (f"no backend of {device_backends} could read it" if device_backends
           else f"platform {cfg.platform.name} has no device telemetry backend")
    return specs, why


def missing_reason(why: str, report: SamplerReport | None, notes: list[str]) -> str:
    """Why a field has no source; a sampler that failed left no report, maybe some rows."""
    if report is not None or not notes:
        return why
    return f"the sampler gave no report ({notes[-1]}); rows it streamed before are kept"


@contextlib.contextmanager
def _edge_env(sampler: TelemetrySampler | None) -> Iterator[None]:
    """The ranks started inside find the sampler's edge pipe (kit.telemetry.edges)."""
    if sampler is None:
        yield
        return
    os.environ[EDGE_ENV] = str(sampler.edge_path)
    try:
        yield
    finally:
        os.environ.pop(EDGE_ENV, None)


def sample_and_launch(
    cfg: RunConfig,
    chunks_dir: Path,
    node: int,
    launch: Callable[[Callable[[], None]], LaunchOutcome],
    watcher: RunProgress | None,
    watchdog: StallWatchdog | None = None,
    marks: Marks | None = None,
) -> tuple[LaunchOutcome, SamplerReport | None, list[str], str | None]:
    """Start this node's sampler beside the ranks, run ``launch(on_poll)``, stop the sampler;
    never raises.

    The sampler's process is begun before ``launch`` and its first sample awaited by
    ``on_poll``, so its start overlaps the ranks'. ``on_poll`` also updates the progress
    display and polls the stall watchdog. ``marks`` gets the launcher's ``sampler_started``
    (its first sample), ``ranks_ended`` and ``sampler_stopped``.

    Returns:
        How the ranks ended, the sampler's report, telemetry notes, and the launcher's own
        failure (one line) when it raised.
    """
    sources, _ = telemetry_plan(cfg, node)
    notes: list[str] = []
    report: SamplerReport | None = None
    sampler: TelemetrySampler | None = None
    pending: list[TelemetrySampler] = []  # begun, first sample not yet seen
    deadline = time.monotonic() + SAMPLER_START_TIMEOUT_S
    who = "sampler" if node == 0 else f"node {node}'s sampler"
    outcome = LaunchOutcome()
    launch_error: str | None = None

    def sampler_started(wait_s: float = 0.0) -> None:
        """Note the sampler's first sample once it came (or its failure: telemetry is lost,
        the run is not)."""
        nonlocal sampler
        if not pending:
            return
        try:
            if not pending[0].poll_started(deadline, wait_s):
                return
            if marks is not None:
                marks.mark("sampler_started")
        except TelemetryError as e:
            notes.append(f"telemetry: {who} did not start: {e}")
            mark_sampler_ready(pending[0].edge_path)  # the ranks wait for it no longer
            sampler = None
        pending.clear()

    try:
        if sources:
            # begun here, confirmed while the ranks start: its first sample comes long before
            # their first step (their imports alone take seconds)
            sampler = TelemetrySampler(
                sources, interval_ms=cfg.telemetry_interval_ms, chunks_dir=chunks_dir
            )
            try:
                sampler.begin()
                pending.append(sampler)
            except TelemetryError as e:
                notes.append(f"telemetry: {who} did not start: {e}")
                sampler = None
        elif marks is not None:
            marks.mark("sampler_started")
        polls = [sampler_started] + [p.poll for p in (watcher, watchdog) if p is not None]

        def on_poll() -> None:
            for poll in polls:
                poll()

        with _edge_env(sampler):
            outcome = launch(on_poll)
    except Exception as e:  # the launcher itself broke: still publish a bundle saying so
        launch_error = f"launcher: {type(e).__name__}: {str(e).strip().splitlines()[0]}"
    finally:
        if marks is not None:
            marks.mark("ranks_ended")
        if watcher is not None:
            watcher.close()
            watcher.say("ranks done; stopping telemetry, writing the bundle")
        sampler_started(max(0.0, deadline - time.monotonic()))
        if sampler is not None:
            try:
                report = sampler.stop(SAMPLER_STOP_TIMEOUT_S)
            except TelemetryError as e:
                notes.append(f"telemetry: {e}")
        if marks is not None:
            marks.mark("sampler_stopped")
    return outcome, report, notes, launch_error


def progress_watcher(cfg: RunConfig, staging: Path) -> RunProgress:
    """What the launcher shows while the ranks run: rank 0's start-up and steps, or a fabric
    run's points (the run kind's ``progress``, kit.config.run_kind)."""
    label = f"{cfg.workload.name} on {cfg.platform.name} x{cfg.world_size}"
    progress: RunProgress = run_kind(cfg).progress_class().for_run(cfg, staging, label)
    return progress


WARM_IMPORTS = ("kit.launch.assemble", "kit.container.command")
"""Modules the bundle's assembly needs, imported in the background once the ranks are started:
neither before (pyarrow.compute, the analysis: 0.2-0.3 s of CPU the ranks would wait for) nor
after the last step (torch is not one: the node inventory reads its versions from its files,
kit.launch.inventory.torch_versions)."""


def warm_imports() -> None:
    """Import :data:`WARM_IMPORTS` in a daemon thread (an import that fails here fails again,
    with its error, where it is needed)."""
    def load() -> None:
        for name in WARM_IMPORTS:
            with contextlib.suppress(Exception):
                importlib.import_module(name)

    threading.Thread(target=load, name="warm-imports", daemon=True).start()


def run_session(cfg: RunConfig, out: Path, command: list[str],
                ends_process: bool = False) -> SessionResult:
    """Launch ``cfg``, sample telemetry, and publish its bundle under ``out``.

    ``ends_process``: SIGINT/SIGTERM stay ignored after publication (kit.launch.signals).

    Raises:
        RunNotPublished: The bundle could not be written (e.g. no space left); the staging
            folder keeps the run for ``bundle recover``.
    """
    marks = launcher_marks()
    cache = compile_cache.prepare()  # before the ranks start: they inherit its environment
    with SignalCounter(final=ends_process) as interrupts:
        staging = BundleStaging(out, new_bundle_id(cfg.workload.name, cfg.platform.name))
        write_launcher_record(staging.path, command, [])
        write_config(staging.path, cfg)
        marks.mark("staged")

        watchdog = stall_watchdog(cfg, staging.path, 0, interrupts)

        def started(pids: list[int], spawned: float) -> None:
            marks.mark("ranks_spawned", spawned)
            if watchdog is not None:
                watchdog.know_ranks(pids)
            warm_imports()  # after the spawn, not competing with it
            write_launcher_record(staging.path, command, pids)

        outcome, report, notes, launch_error = sample_and_launch(
            cfg, staging.chunks_dir, 0,
            lambda on_poll: launch_local(
                cfg, staging.path, staging.logs_dir, interrupts,
                on_started=started, on_poll=on_poll),
            progress_watcher(cfg, staging.path), watchdog, marks)
        from kit.launch.assemble import RunEnd, assemble_bundle, run_end  # warm: see above

        results = [read_rank_result(staging.path, r) for r in range(cfg.world_size)]
        end = stall_end(run_end(outcome, results, staging.logs_dir,
                                interrupts.describe() if interrupts.count else None),
                        staging.logs_dir)
        if launch_error:
            end = RunEnd("failed", launch_error, end.exits)
        end.notes += notes
        _, missing_why = telemetry_plan(cfg)
        marks.mark("assembling")
        try:
            path, summary = assemble_bundle(staging, cfg, command, end, report,
                                            missing_reason(missing_why, report, notes),
                                            launcher_marks=marks.times, compile_cache=cache)
        except OSError as e:
            raise not_published(e, staging) from e
    life = published_lifecycle(path, results)
    return SessionResult(bundle=path, status=end.status, error=end.error, summary=summary, cfg=cfg,
                         timing=describe(life, life.get("last_step_to_published_s")) or None,
                         lifecycle=life, compile_cache=cache)


def published_lifecycle(bundle: Path, results: list[Any]) -> dict[str, Any]:
    """The published bundle's ``lifecycle``, with ``last_step_to_published_s`` measured now
    (the bundle itself can only hold the time to its assembly); empty when unreadable."""
    published = time.time()
    last = [r.timeline["last_step"] for r in results if r and "last_step" in r.timeline]
    try:
        life = json.loads((bundle / "metrics.json").read_text()).get("lifecycle") or {}
    except (OSError, ValueError):
        return {}
    if last and life:
        life["last_step_to_published_s"] = round(published - max(last), 3)
    return life


def not_published(e: OSError, staging: BundleStaging) -> RunNotPublished:
    """The error of a bundle that could not be written: one line saying what, why and how to
    publish the run later; the staging folder is marked with why, for ``bundle recover``."""
    mark_unpublished(staging.path, e)
    why = "no space left on device" if e.errno == errno.ENOSPC else (e.strerror or str(e))
    where = e.filename or staging.path
    return RunNotPublished(f"{where}: {why}; the run's data stays in {staging.path}: fix that, "
                           f"then run `charllm-kit bundle recover {staging.path}`")
