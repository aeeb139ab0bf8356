"""Run a sweep: one bundle per valid point in one stable folder, recording every outcome.

Layout: ``<out>/<sweep name>/`` holds ``sweep.json`` (the index), ``sweep.yaml`` (a copy of the
file) and one folder per point, ``<point id>/``, with the point's ``request.json`` and its bundle.
The folder name is stable (no timestamp) so that ``--resume`` finds the points already run; a
second sweep of the same name without ``--resume`` is refused instead of mixing the two.
"""

import json
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kit.bundle.reader import Bundle, read_bundle
from kit.bundle.verify import verify_bundle
from kit.errors import BundleError, KitInputError
from kit.launch.sbatch import JobOptions
from kit.launch.session import run_session
from kit.neutralize import terminal_safe
from kit.sweep.file import SweepSpec
from kit.sweep.index import INDEX_FILE, PointRecord, SweepIndex, summary_subset, write_index
from kit.sweep.jobs import follow_point, running_jobs, slurm_sweep, submit_point
from kit.sweep.plan import PlannedPoint, plan_sweep

REQUEST_FILE = "request.json"
SPEC_COPY = "sweep.yaml"
SUPERSEDED_DIR = "superseded"
FAILED_STATUSES = frozenset({"failed", "oom", "interrupted", "error"})


@dataclass
class SweepOutcome:
    """The sweep folder and its final index."""

    folder: Path
    index: SweepIndex

    @property
    def any_failed(self) -> bool:
        """Whether a point ran and did not end ok (the CLI exits 1)."""
        return any(p.status in FAILED_STATUSES for p in self.index.points)


def _stderr(line: str) -> None:
    print(terminal_safe(line), file=sys.stderr, flush=True)  # reasons quote the sweep file


def _bundles_in(point_dir: Path) -> list[Path]:
    """Published bundles (and leftovers) of a point, oldest first; staging dirs excluded."""
    if not point_dir.is_dir():
        return []
    return sorted(p for p in point_dir.iterdir()
                  if p.is_dir() and not p.name.startswith(".") and p.name != SUPERSEDED_DIR)


def kept_points(plan: list[PlannedPoint], folder: Path) -> dict[str, str]:
    """The valid points ``--resume`` would keep in sweep ``folder``, with their bundles' status.

    Raises:
        KitInputError: A point folder was run with other settings (:func:`earlier_bundle`).
    """
    kept = {}
    for p in plan:
        if p.valid and p.request is not None:
            bundle = earlier_bundle(folder / p.id, p.request.model_dump(mode="json"))
            if bundle is not None:
                kept[p.id] = bundle.manifest.status
    return kept


def earlier_bundle(point_dir: Path, request_json: dict) -> Bundle | None:
    """The bundle ``--resume`` keeps for a point: its newest, if it verifies and ran to an end.

    An ``interrupted`` bundle is not kept (the sweep was stopped there); ``failed`` and ``oom``
    are outcomes and are kept. A point folder without a readable ``request.json`` (the
    settings it ran with) is run again.

    Raises:
        KitInputError: The point folder was run with other run fields than the sweep file now
            gives (the file changed): resuming would mix two sweeps.
    """
    try:
        recorded = json.loads((point_dir / REQUEST_FILE).read_text())
    except (OSError, ValueError):  # no readable record of its settings: run it again
        return None
    if recorded != request_json:
        raise KitInputError(
            f"{point_dir} was run with other settings than the sweep file now gives; "
            "use another --out (or remove that folder) to run the changed sweep"
        )
    bundles = _bundles_in(point_dir)
    if not bundles:
        return None
    try:
        verify_bundle(bundles[-1])
        bundle = read_bundle(bundles[-1])
    except BundleError:
        return None
    return None if bundle.manifest.status == "interrupted" else bundle


def _set_aside(point_dir: Path) -> None:
    """Move an earlier attempt's leftovers to ``superseded/``: one bundle per point."""
    for old in _bundles_in(point_dir):
        (point_dir / SUPERSEDED_DIR).mkdir(exist_ok=True)
        old.rename(point_dir / SUPERSEDED_DIR / old.name)


def _record_bundle(rec: PointRecord, folder: Path, bundle: Path, status: str,
                   error: str | None, summary: dict) -> None:
    rec.status = status  # type: ignore[assignment]
    rec.reason = error
    rec.bundle = str(bundle.relative_to(folder))
    rec.summary = summary_subset(summary)


def _prepare_point(point: PlannedPoint, folder: Path) -> Path:
    """The point's folder, earlier leftovers set aside and its settings recorded."""
    assert point.request is not None
    point_dir = folder / point.id
    _set_aside(point_dir)
    point_dir.mkdir(parents=True, exist_ok=True)
    (point_dir / REQUEST_FILE).write_text(
        json.dumps(point.request.model_dump(mode="json"), indent=2) + "\n")
    return point_dir


def _run_point(point: PlannedPoint, rec: PointRecord, folder: Path, command: list[str]) -> None:
    """Run one point into its folder; an exception is recorded as status ``error``."""
    assert point.cfg is not None
    point_dir = _prepare_point(point, folder)
    try:
        result = run_session(point.cfg, point_dir, command)
    except Exception as e:  # one broken point must not end the sweep
        rec.status, rec.reason = "error", f"{type(e).__name__}: {e}"
        return
    _record_bundle(rec, folder, result.bundle, result.status, result.error, result.summary)


def run_sweep(
    spec: SweepSpec, sweep_file: Path, out: Path, resume: bool, command: list[str],
    progress: Callable[[str], None] = _stderr, job: JobOptions | None = None,
) -> SweepOutcome:
    """Run every valid point of ``spec`` under ``out/<name>/`` and keep ``sweep.json`` current.

    A point that fails, runs out of memory or raises is recorded and the sweep goes on; a point
    interrupted by a signal (Ctrl-C) stops the sweep, and ``--resume`` reruns it and the rest.
    With ``job``, each point is one Slurm job of ``--launcher slurm`` (kit.sweep.jobs): all are
    submitted, then followed in turn; the nodes, not this host, need the platform.

    ``resume`` of a folder that holds no sweep yet starts it (and says so).

    Raises:
        KitInputError: The folder exists and ``resume`` is off, no point can run on this
            host, a point folder was run with other settings, or sbatch refused a job.
    """
    if job is not None:
        spec = slurm_sweep(spec)
    folder = out / spec.name
    if (folder / INDEX_FILE).exists() and not resume:
        raise KitInputError(f"sweep folder {folder} exists; pass --resume to continue it, "
                            "or --out another directory")
    if resume and not (folder / INDEX_FILE).is_file():  # a job script that always resumes
        progress(f"sweep {spec.name}: nothing to resume in {folder} (no {INDEX_FILE}): "
                 "starting it")
        resume = False
    plan = plan_sweep(spec, require_present=job is None)
    runnable = [p for p in plan if p.valid]
    if not runnable:
        first = plan[0].skip_reason if plan else "it has no points"
        raise KitInputError(f"sweep {spec.name}: no point can run on this host (first: "
                            f"{first}); see --dry-run")
    kept = {p.id: earlier_bundle(folder / p.id, p.request.model_dump(mode="json"))
            for p in runnable if resume and p.request is not None}
    running = running_jobs(folder) if resume and job is not None else {}
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(sweep_file, folder / SPEC_COPY)
    records = {p.id: PointRecord(id=p.id, values=p.values, reason=p.skip_reason,
                                 status="pending" if p.valid else "skipped") for p in plan}
    index = SweepIndex(name=spec.name, sweep_file=str(sweep_file), updated_utc="",
                       points=list(records.values()))
    write_index(folder, index)
    try:
        for n, point in enumerate(runnable, 1):
            rec = records[point.id]
            earlier = kept.get(point.id)
            if earlier is not None:
                m = earlier.manifest
                _record_bundle(rec, folder, earlier.path, m.status, m.error,
                               earlier.metrics.summary)
                rec.resumed, rec.job = True, m.slurm_job_id
                progress(f"sweep {spec.name}: point {n}/{len(runnable)} {point.id}: "
                         f"kept ({m.status}, bundle verifies)")
                continue
            where = f"sweep {spec.name}: point {n}/{len(runnable)} {point.id}"
            if job is not None:
                rec.job = running.get(point.id) or submit_point(
                    point, _prepare_point(point, folder), job)
                said = "still queued or running" if point.id in running else "submitted"
                progress(f"{where}: Slurm job {rec.job} {said}")
                write_index(folder, index)
                continue
            progress(f"{where}: running")
            _run_point(point, rec, folder, command)
            progress(f"{where}: {rec.status}")
            write_index(folder, index)
            if rec.status == "interrupted":
                progress(f"sweep {spec.name}: stopped; --resume reruns {point.id} and the rest")
                break
        for n, point in enumerate(runnable, 1):  # the jobs submitted above, in turn
            rec = records[point.id]
            if rec.job is None or rec.resumed:
                continue
            where = f"sweep {spec.name}: point {n}/{len(runnable)} {point.id}"
            follow_point(rec, folder, lambda line, w=where: progress(f"{w}: {line}"))
            progress(f"{where}: {rec.status}")
            write_index(folder, index)
    finally:
        write_index(folder, index)
    return SweepOutcome(folder, index)
