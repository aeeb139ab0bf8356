"""``--launcher slurm``: inside an allocation, one node agent per node through ``srun``.

``charllm-kit run ... --launcher slurm`` in an allocation (``salloc``, an sbatch script) starts
``srun --ntasks-per-node=1`` of the same command; each task is that node's agent
(kit.launch.node_session) with its node index from ``SLURM_NODEID``. The rendezvous endpoint is
the address of the allocation's first node (its ``NodeAddr``: a Slurm node name need not
resolve) on a port derived from the job and step ids, so concurrent jobs on one host do not
clash. Under Slurm a SIGTERM is ``scancel`` or the time limit: node 0 asks Slurm which.
"""

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from kit.errors import KitInputError

if TYPE_CHECKING:  # torch.distributed: only the node agents need it, not `submit`
    from kit.launch.rendezvous import NodeRole

AGENT_ENV = "CHARLLM_SLURM_AGENT"
"""Set in the srun tasks: this process is a node agent, not the command that starts them."""
PORT_BASE = 20000
JOB_SCRIPT = "job/sbatch.sh"
"""Where a bundle keeps the batch script of the Slurm job it ran in."""


def _scontrol(*args: str) -> str:
    try:
        return subprocess.run(["scontrol", *args], capture_output=True, text=True, check=True,
                              timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise KitInputError(f"scontrol {' '.join(args)} failed: {e}") from None


def first_node_address(nodelist: str) -> str:
    """The address (NodeAddr) of the first node of ``nodelist`` (e.g. ``n[1-2]``)."""
    first = _scontrol("show", "hostnames", nodelist).split()[0]
    match = re.search(r"\bNodeAddr=(\S+)", _scontrol("show", "node", first))
    return match.group(1) if match else first


def rendezvous_port(job_id: int) -> int:
    """A port for this job's rendezvous, distinct between concurrent jobs."""
    return PORT_BASE + job_id % 10000


def in_allocation() -> str:
    """The job id of the allocation this process runs in.

    Raises:
        KitInputError: Not inside one.
    """
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        raise KitInputError("--launcher slurm runs inside a Slurm allocation (salloc, or an "
                            "sbatch script); outside one use `charllm-kit submit`")
    return job


def srun_agents(nodes: int) -> list[str]:
    """The srun that starts one node agent per node.

    One agent ending does not kill the others: node 0 names it in the bundle.
    """
    return ["srun", f"--nodes={nodes}", "--ntasks-per-node=1", f"--ntasks={nodes}",
            "--kill-on-bad-exit=0"]


def start_agents(nodes: int, argv: list[str]) -> int:
    """Run ``argv`` (this command) as one agent per node with srun; return srun's exit code.

    SIGINT/SIGTERM reach srun (and through Slurm every agent), not this process: it waits for
    the agents to publish the bundle.

    Raises:
        KitInputError: Not in an allocation, or it has another number of nodes than ``nodes``.
    """
    in_allocation()
    have = int(os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES") or 0)
    if have != nodes:
        raise KitInputError(f"--nodes {nodes} but this allocation has {have} node(s): use "
                            f"--nodes {have}, or allocate {nodes}")
    from kit.launch.signals import SignalCounter

    cmd = [*srun_agents(nodes), f"--export=ALL,{AGENT_ENV}=1",
           sys.executable, "-m", "kit", *argv[1:]]
    with SignalCounter(final=True):  # the command exits with srun's code, whatever comes later
        return subprocess.run(cmd).returncode


def slurm_role(nodes: int, timeout_s: float) -> "NodeRole":
    """This srun task's place: node index from SLURM_NODEID, node 0's address from the list."""
    from kit.launch.rendezvous import NodeRole

    job = int(in_allocation())
    return NodeRole(
        node=int(os.environ["SLURM_NODEID"]), nodes=nodes,
        host=first_node_address(os.environ["SLURM_JOB_NODELIST"]),
        port=rendezvous_port(job), timeout_s=timeout_s, run_id=f"slurm-{job}",
        slurm_node=os.environ.get("SLURMD_NODENAME"),
    )


def batch_script(job_id: str) -> str | None:
    """The script Slurm runs as ``job_id``'s batch step.

    None for an ``salloc`` job (it has no script), or when Slurm cannot say.
    """
    try:
        return subprocess.run(["scontrol", "write", "batch_script", job_id, "-"],
                              capture_output=True, text=True, check=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def record_job(staging: Path) -> str | None:
    """The Slurm job this process runs in, its batch script (if any) kept in ``staging``.

    Returns:
        The job id, or None outside Slurm.
    """
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return None
    script = batch_script(job)
    if script is not None:
        dest = staging / JOB_SCRIPT
        dest.parent.mkdir(exist_ok=True)
        dest.write_text(script)
    return job


def termination_cause() -> str | None:
    """Why Slurm sent SIGTERM to this job, when it says: ``scancel`` or the time limit."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return None
    try:
        text = _scontrol("show", "job", job)
    except KitInputError:
        return None
    state = re.search(r"\bJobState=(\S+)", text)
    run = re.search(r"\bRunTime=(\S+)", text)
    limit = re.search(r"\bTimeLimit=(\S+)", text)
    if state and state.group(1) == "TIMEOUT" or (
            run and limit and limit.group(1) != "UNLIMITED"
            and _seconds(run.group(1)) >= _seconds(limit.group(1))):
        return f"Slurm job {job} reached its time limit"
    # Still COMPLETING when its tasks get the signal; before the time limit that is scancel
    return f"Slurm job {job} was cancelled (scancel)"


def _seconds(text: str) -> int:
    """Slurm's ``[D-]HH:MM:SS`` (or ``MM:SS``) as seconds."""
    days, _, clock = text.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    return int(days or 0) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]
