"""Hand a batch script to Slurm (``sbatch``) and follow the job until its bundle is written.

Slurm's answers are what the kit trusts: ``sbatch --parsable`` for the job id, a refusal's own
words as the one-line error, ``squeue`` for the state while the job is known to it, and the
bundle whose manifest names the job for how the run ended.
"""

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from kit.errors import KitInputError
from kit.launch.sbatch import job_output

POLL_S = 2.0
EARLY_CHECK_S = 5.0
"""How long ``submit`` watches a job it did not follow, for one that fails as it starts (a
container srun cannot start, a Python missing on the nodes)."""


def submit_job(script: str) -> str:
    """Submit ``script`` with sbatch; return the job id.

    Raises:
        KitInputError: sbatch is not installed, or refused the job (an unknown partition or
            account, a time limit over the partition's): its reasons in one line.
    """
    try:
        r = subprocess.run(["sbatch", "--parsable"], input=script, capture_output=True,
                           text=True, timeout=120)
    except FileNotFoundError:
        raise KitInputError("sbatch is not installed here: submit from a host of the Slurm "
                            "cluster (a login node)") from None
    except subprocess.TimeoutExpired:
        raise KitInputError("sbatch did not answer within 120 s: is slurmctld up?") from None
    if r.returncode:
        why = [line.removeprefix("sbatch: error: ").strip()
               for line in r.stderr.splitlines() if line.strip()]
        raise KitInputError("sbatch refused the job: " + ("; ".join(why) or
                                                           f"exit code {r.returncode}"))
    return r.stdout.strip().split(";")[0]  # "<id>[;<cluster>]"


def keep_script(out: Path, job_id: str, script: str) -> Path:
    """Keep the submitted script beside the job's output (``OUT/slurm-<job id>.sbatch``): the
    bundle keeps Slurm's own copy, but only once the job has run."""
    path = job_output(out, job_id).with_suffix(".sbatch")
    path.write_text(script)
    return path


def job_state(job_id: str) -> str | None:
    """``STATE ELAPSED`` of a job Slurm still lists as pending, running or completing; else None.

    When squeue itself fails (slurmctld busy or restarting), ``UNKNOWN`` and squeue's words: the
    job is not taken for ended.
    """
    try:
        r = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T %M"], capture_output=True,
                           text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "UNKNOWN squeue did not answer within 60 s"
    if r.returncode and "Invalid job id" not in r.stderr:  # purged: it ended long ago
        return "UNKNOWN " + " ".join(r.stderr.split())
    return r.stdout.strip() or None


def find_bundle(out: Path, job_id: str) -> Path | None:
    """The bundle in ``out`` whose manifest names Slurm job ``job_id``."""
    for path in sorted(out.iterdir()) if out.is_dir() else ():
        if path.name.startswith(".") or not (path / "manifest.json").is_file():
            continue
        try:
            manifest = json.loads((path / "manifest.json").read_text())
        except (OSError, ValueError):
            continue
        if manifest.get("slurm_job_id") == job_id:
            return path
    return None


def _last_line(path: Path) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, 2) - 4096))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    return next((line.strip() for line in reversed(lines) if line.strip()), "")


def follow_job(job_id: str, out: Path, progress: Callable[[str], None],
               poll_s: float = POLL_S) -> Path | None:
    """Wait for job ``job_id`` to end, calling ``progress`` with a line whenever it changes.

    The line is the job's state and elapsed time and the last line of its output (the run's
    own step lines). Returns the bundle the job wrote into ``out``, or None when it wrote none.
    """
    shown = None
    output = job_output(out, job_id)
    while (state := job_state(job_id)) is not None:
        name, _, elapsed = state.partition(" ")
        tail = _last_line(output)
        if (name, tail) != shown:  # not every tick of the elapsed time
            progress(f"job {job_id} {name} {elapsed}" + (f": {tail}" if tail else ""))
            shown = (name, tail)
        time.sleep(poll_s)
    return find_bundle(out, job_id)


def job_end(job_id: str) -> str:
    """How an ended job ended, as Slurm's controller still knows it: ``FAILED (exit code
    1:0)``; ``ended`` once the controller has forgotten it."""
    try:
        r = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True,
                           text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return "ended"
    fields = dict(f.split("=", 1) for f in r.stdout.split() if "=" in f)
    state = fields.get("JobState")
    if not state:
        return "ended"
    return state + (f" (exit code {fields['ExitCode']})" if "ExitCode" in fields else "")


def early_failure(job_id: str, out: Path, check_s: float = EARLY_CHECK_S,
                  poll_s: float = 0.5) -> str | None:
    """Watch job ``job_id`` for ``check_s``: why it already failed, or None.

    A job that ended with a bundle is judged by the bundle (a short run may end ok); one that
    ended without, by Slurm's state and the last line of its output.
    """
    deadline = time.monotonic() + check_s
    while job_state(job_id) is not None:
        if time.monotonic() > deadline:
            return None
        time.sleep(poll_s)
    bundle = find_bundle(out, job_id)
    if bundle is not None:
        manifest = json.loads((bundle / "manifest.json").read_text())
        if manifest["status"] == "ok":
            return None
        return f"job {job_id} ended {manifest['status']}: {manifest['error']}; bundle {bundle}"
    output = job_output(out, job_id)
    tail = _last_line(output)
    return (f"job {job_id} {job_end(job_id)} within seconds, without a bundle"
            + (f": {tail}" if tail else "") + f"; see {output}")
