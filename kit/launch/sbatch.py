"""The sbatch script ``charllm-kit submit`` writes: what an HPC engineer would write by hand.

One task per node (``srun --ntasks-per-node=1``), each task a node agent of ``--launcher slurm``
(kit.launch.slurm), whole nodes (``--exclusive``: telemetry of a shared node measures someone
else), the platform's GPUs per node, its collective-library ``env``, and, when a container is
asked for, the agents started in it by pyxis/enroot (``srun --container-image``) or Apptainer
(kit.container.command). The job's output goes to ``OUT/slurm-<job id>.out``.
"""

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise
from pathlib import Path
from typing import Literal, get_args

from kit.config.argv import model_argv
from kit.config.run import RunConfig
from kit.container.command import container_command
from kit.errors import KitInputError
from kit.launch.slurm import AGENT_ENV, PORT_BASE, srun_agents
from kit.neutralize import control_problem, terminal_safe
from kit.plan.resolve import RunRequest

JobRuntime = Literal["pyxis", "apptainer", "none"]
JOB_RUNTIMES: tuple[str, ...] = get_args(JobRuntime)
"""Container runtimes a Slurm job starts the agents in; none runs this Python on the nodes."""
NOT_RUN_FIELDS = ("workload", "launcher", "node_rank", "rdzv_endpoint")
"""RunRequest fields that are not ``submit`` options: the script sets them itself."""

SLURM_TIME = re.compile(r"(?:\d+(?::\d{1,2}){0,2}|\d+-\d{1,2}(?::\d{1,2}){0,2}|UNLIMITED|INFINITE)")
"""``--time`` as sbatch takes it: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S, or no limit."""
SLURM_NAME = re.compile(r"[\w.,+@-]+", re.ASCII)
"""A partition or account (a comma-separated list of partitions included)."""
_SBATCH_BARE = re.compile(r"[\w./:@%+,=-]+", re.ASCII)
"""A ``#SBATCH`` value that needs no quotes (sbatch splits at spaces and ends at ``#``)."""


@dataclass(frozen=True, kw_only=True)
class JobOptions:
    """Slurm's side of a submission: where the job runs and in what.

    Attributes:
        partition: ``--partition``; None: the cluster's default.
        account: ``--account``; None: the user's default.
        time: ``--time`` as Slurm takes it (``HH:MM:SS``, ``D-HH``, minutes).
        runtime: Container runtime; None: pyxis when the platform names a ``container_image``
            and this host's srun has pyxis (or there is no srun here to ask), else none
            (:func:`job_runtime`).
        image: The image; None: the platform's ``container_image``.
        job_name: ``--job-name``; None: ``charllm-<workload>``.
    """

    partition: str | None = None
    account: str | None = None
    time: str = "01:00:00"
    runtime: JobRuntime | None = None
    image: str | None = None
    job_name: str | None = None

    def __post_init__(self) -> None:
        """Refuse a value sbatch would misread or a shell could run, in one line."""
        if not SLURM_TIME.fullmatch(self.time):
            raise KitInputError(f"--time {self.time!r} is not a Slurm time limit: minutes, "
                                "MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (e.g. 01:30:00)")
        for option, value in (("--partition", self.partition), ("--account", self.account)):
            if value is not None and not SLURM_NAME.fullmatch(value):
                raise KitInputError(f"{option} {value!r} is not a Slurm {option[2:]} name "
                                    "(letters, digits and _ . , + @ - only)")
        for option, value in (("--image", self.image), ("--job-name", self.job_name)):
            problem = value and control_problem(value, option)
            if problem:
                raise KitInputError(problem)


def sbatch_value(value: str) -> str:
    """``value`` as an ``#SBATCH`` line takes it: bare when safe, else in double quotes.

    sbatch reads its directives itself, not through a shell: it splits at white space, honours
    double quotes and backslashes (not single quotes) and ends the line at an unquoted ``#``.

    Raises:
        KitInputError: ``value`` holds a line break or another control character, which would
            end the directive and start a line of the script.
    """
    problem = control_problem(value, f"#SBATCH value {value!r}")
    if problem:
        raise KitInputError(problem)
    if _SBATCH_BARE.fullmatch(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def slurm_pattern(path: Path, field: str) -> str:
    """``path`` as a Slurm file name pattern names it: each ``%`` doubled.

    Slurm expands ``%j``, ``%u``, ``%x``... in ``--output``; a folder named ``%u`` would
    otherwise become the user's name, and the kit would look for the job's output elsewhere.

    Raises:
        KitInputError: ``path`` holds a backslash, which turns Slurm's expansion off (the
            job's own ``%j`` with it).
    """
    if "\\" in str(path):
        raise KitInputError(f"{field} {str(path)!r} holds a backslash, which stops Slurm from "
                            "naming the job's output by its id")
    return str(path).replace("%", "%%")


def job_output(out: Path, job_id: str) -> Path:
    """The file Slurm writes job ``job_id``'s stdout and stderr into."""
    return out.absolute() / f"slurm-{job_id}.out"


def _is_yaml(name: str | None) -> bool:
    return name is not None and Path(name).suffix in (".yaml", ".yml")


def absolute_files(req: RunRequest) -> RunRequest:
    """``req`` with a workload or platform YAML path made absolute, as the nodes must see it."""
    update = {f: str(Path(v).absolute()) for f in ("workload", "platform")
              if _is_yaml(v := getattr(req, f))}
    return req.model_copy(update=update)


@lru_cache(maxsize=1)
def srun_has_pyxis() -> bool | None:
    """Whether this host's srun can start a container (pyxis); None where there is no srun.

    Pyxis is a SPANK plugin of srun: where it is loaded, ``srun --help`` lists its
    ``--container-image`` option. An srun without it fails a job that uses it within a second.
    """
    try:
        r = subprocess.run(["srun", "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return "--container-image" in r.stdout + r.stderr


NO_PYXIS = "this host's srun has no pyxis (no --container-image option)"


def job_runtime(cfg: RunConfig, job: JobOptions,
                submitting: bool = False) -> tuple[JobRuntime, str | None]:
    """The runtime the job's node agents start in, and a line for the user when it is not the
    platform's image although the platform names one, or cannot work from here.

    Without ``--container-runtime``: pyxis when the platform names a ``container_image``, unless
    this host's srun has no pyxis: then none (this Python on the nodes), said in the line.

    Raises:
        KitInputError: ``submitting`` a job that asks for pyxis where srun has none: it would
            fail at once.
    """
    no_pyxis = srun_has_pyxis() is False
    if job.runtime is not None:
        if job.runtime == "pyxis" and no_pyxis:
            why = (f"{NO_PYXIS}: a job using it fails at once; use --container-runtime "
                   "apptainer or none")
            if submitting:
                raise KitInputError(f"--container-runtime pyxis: {why}")
            return "pyxis", why
        return job.runtime, None
    if not cfg.platform.container_image:
        return "none", None
    if no_pyxis:
        return "none", (f"{NO_PYXIS}: the job runs this Python on the nodes, not the "
                        f"{cfg.platform.name} platform's image {cfg.platform.container_image} "
                        "(--container-runtime apptainer runs that)")
    return "pyxis", None


def sweep_runtime_note(runtime: str | None) -> str | None:
    """The line ``sweep --launcher slurm`` says once when its jobs cannot start the platforms'
    images with pyxis from here (:func:`job_runtime` decides per point)."""
    if runtime not in (None, "pyxis") or srun_has_pyxis() is not False:
        return None
    return f"{NO_PYXIS}: " + ("jobs using it fail at once" if runtime else
                              "points whose platform names a container_image run this Python "
                              "on the nodes instead")


def _agent_command(cfg: RunConfig, req: RunRequest, out: Path, job: JobOptions,
                   force: bool) -> list[str]:
    """What each srun task runs: ``charllm-kit run`` of ``req``, in the container if asked."""
    run_args = ["run", req.workload, *model_argv(req, skip=("workload",)), "--out", str(out),
                *(["--force"] if force else [])]
    runtime, _ = job_runtime(cfg, job)
    if runtime == "none":
        return [*srun_agents(cfg.nodes), sys.executable, "-m", "kit", *run_args]
    image = job.image or cfg.platform.container_image
    if image is None:
        raise KitInputError(f"platform {cfg.platform.name} names no container_image; pass "
                            "--image, or --container-runtime none")
    image_field = "--image" if job.image else f"platform {cfg.platform.name}'s container_image"
    binds = {"--out": out, **{f: Path(v) for f in ("workload", "platform")
                              if _is_yaml(v := getattr(req, f))}}
    argv = container_command(cfg.platform, runtime, image, run_args, binds,
                             image_field=image_field)
    if runtime == "pyxis":  # container_command's own srun, with the node agents' placement
        return [*srun_agents(cfg.nodes), *argv[1:]]
    return [*srun_agents(cfg.nodes), *argv]


def _sbatch_lines(cfg: RunConfig, out: Path, job: JobOptions) -> list[str]:
    flags: list[tuple[str, object]] = [
        ("job-name", job.job_name or "charllm-" + cfg.workload.name), ("nodes", cfg.nodes),
        ("ntasks-per-node", 1)]
    if not cfg.platform.is_cpu:
        flags.append(("gpus-per-node", cfg.devices_per_node))
    flags += [("exclusive", None), ("time", job.time)]
    flags += [(k, v) for k, v in (("partition", job.partition), ("account", job.account)) if v]
    flags += [("output", slurm_pattern(out.absolute(), "--out") + "/slurm-%j.out"),
              ("chdir", os.getcwd())]
    return [f"#SBATCH --{k}" if v is None else f"#SBATCH --{k}={sbatch_value(str(v))}"
            for k, v in flags]


def _export_line(name: str, value: str) -> str:
    """``export NAME='value'``; a name that is not a shell identifier is refused."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise KitInputError(f"platform env name {name!r} is not a shell variable name")
    return f"export {name}={shlex.quote(value)}"


def _wrap(argv: Sequence[str]) -> str:
    """A long command as shell lines of about 88 columns at most, continued with backslashes.

    A line never breaks between an option and its value.
    """
    words = [shlex.quote(a) for a in argv]
    lines, current = [], words[0]
    for prev, word in pairwise(words):
        value = prev.startswith("-") and "=" not in prev and not word.startswith("-")
        if not value and len(current) + len(word) > 84:
            lines.append(current)
            current = "    " + word
        else:
            current += " " + word
    return " \\\n".join([*lines, current])


def sbatch_script(cfg: RunConfig, req: RunRequest, out: Path, job: JobOptions,
                  force: bool = False) -> str:
    """The batch script that runs ``req`` (resolved as ``cfg``) as one Slurm job.

    Args:
        cfg: The run, resolved with ``launcher: slurm``.
        req: What the user asked for; its YAML paths are made absolute (:func:`absolute_files`).
        out: The folder every node mounts that receives the bundle and the job's output.
        job: Partition, account, time limit, container.
        force: Run even where the memory estimate predicts the run will not fit.

    Raises:
        KitInputError: A container without an image; a value that would split a list argument
            of srun or the container runtime (:func:`kit.container.command.list_element`).
    """
    out = out.absolute()
    req = absolute_files(req)  # the nodes' paths, and their mounts' (a sweep's are relative)
    p = cfg.parallel
    lines = ["#!/bin/bash",
             f"# charllm-kit submit: {terminal_safe(cfg.workload.name)} on "
             f"{terminal_safe(cfg.platform.name)}, {cfg.nodes} "
             f"node(s) x {cfg.ranks_per_node} rank(s), TP{p.tp} PP{p.pp} CP{p.cp} DP{p.dp}",
             *_sbatch_lines(cfg, out, job), "set -u", ""]
    if cfg.platform.env:
        lines.append(f"# The {terminal_safe(cfg.platform.name)} platform's collective-library "
                     "environment")
        lines += [_export_line(k, v) for k, v in sorted(cfg.platform.env.items())]
        lines.append("")
    lines += [
        "# Rendezvous: node 0's store on the NodeAddr of the first node of $SLURM_JOB_NODELIST,",
        f"# port {PORT_BASE} + job id % 10000 (docs/multi-node.md)",
        f"echo \"rendezvous: $(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1):"
        f"$(({PORT_BASE} + SLURM_JOB_ID % 10000))\"",
        "# Each srun task is one node agent; node 0 writes the bundle into the shared --out",
        f"export {AGENT_ENV}=1",
        _wrap(_agent_command(cfg, req, out, job, force)),
    ]
    return "\n".join(lines) + "\n"
