"""``sweep --launcher slurm``: each point one Slurm job, submitted up front, then followed.

Every point's job writes its bundle into the point's folder, as a local point does. The index
records each point's job id as soon as it is submitted, so a sweep stopped while its jobs run
(Ctrl-C, a closed terminal) loses nothing: ``--resume`` follows the jobs Slurm still lists
instead of submitting them again, and keeps the bundles of those that ended.
"""

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from kit.bundle.reader import read_bundle
from kit.bundle.verify import verify_bundle
from kit.errors import BundleError
from kit.launch.sbatch import JobOptions, job_output, sbatch_script
from kit.launch.submit import follow_job, job_state, submit_job
from kit.sweep.file import SweepSpec
from kit.sweep.index import INDEX_FILE, PointRecord, SweepIndex, summary_subset
from kit.sweep.plan import PlannedPoint
from kit.sweep.tables import PlannedJob


def running_jobs(folder: Path) -> dict[str, str]:
    """Point id -> job id of the earlier index's points whose jobs Slurm still lists."""
    try:
        index = SweepIndex.model_validate_json((folder / INDEX_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {p.id: p.job for p in index.points
            if p.job is not None and p.bundle is None and job_state(p.job) is not None}


def slurm_sweep(spec: SweepSpec) -> SweepSpec:
    """``spec`` with every point run by ``--launcher slurm``, as its jobs run it."""
    return spec.model_copy(update={"base": {**spec.base, "launcher": "slurm"}})


def job_name(point: PlannedPoint) -> str:
    """The Slurm job name of a point's job (``squeue`` shows it)."""
    return f"charllm-{point.id}"


def point_script(point: PlannedPoint, point_dir: Path, job: JobOptions) -> str:
    """The sbatch script of ``point``'s job, writing into ``point_dir``.

    Raises:
        KitInputError: A container runtime without an image.
    """
    assert point.request is not None and point.cfg is not None
    return sbatch_script(point.cfg, point.request, point_dir,
                         replace(job, job_name=job_name(point)))


def planned_jobs(plan: list[PlannedPoint], folder: Path,
                 job: JobOptions) -> dict[str, PlannedJob]:
    """Point id -> the job ``sweep --launcher slurm`` would submit for each valid point of
    ``plan`` into ``folder`` (the sweep folder), as :func:`submit_point` builds it.

    Raises:
        KitInputError: A container runtime without an image (the real sweep stops on it too).
    """
    out = {}
    for p in plan:
        if p.valid and p.cfg is not None:
            point_dir = (folder / p.id).absolute()
            out[p.id] = PlannedJob(job_name(p), p.cfg.nodes, point_dir,
                                   point_script(p, point_dir, job))
    return out


def submit_point(point: PlannedPoint, point_dir: Path, job: JobOptions) -> str:
    """Submit ``point`` as one job writing into ``point_dir``; return its job id.

    Raises:
        KitInputError: sbatch refused the job (it would refuse every point: the sweep stops).
    """
    return submit_job(point_script(point, point_dir, job))


def follow_point(rec: PointRecord, folder: Path, progress: Callable[[str], None]) -> None:
    """Wait for ``rec``'s job and record how its run ended.

    The status is ``error`` when the job left no bundle that verifies.
    """
    assert rec.job is not None
    point_dir = folder / rec.id
    bundle = follow_job(rec.job, point_dir, progress)
    if bundle is None:
        rec.status = "error"
        rec.reason = f"job {rec.job} ended without a bundle; see {job_output(point_dir, rec.job)}"
        return
    try:
        verify_bundle(bundle)
        read = read_bundle(bundle)
    except BundleError as e:
        rec.status, rec.reason = "error", str(e)
        return
    rec.status, rec.reason = read.manifest.status, read.manifest.error
    rec.bundle = str(bundle.relative_to(folder))
    rec.summary = summary_subset(read.metrics.summary)
