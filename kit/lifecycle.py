"""Wall-clock marks of a run's start-up and teardown, on the launcher and in every rank.

A run spends time outside its steps: the launcher's imports and staging, each rank's imports,
process groups, model build, the first (compiling) step, and after the last step the ranks'
exit, the sampler's last chunk and the bundle's assembly. Each process marks when it passes
each phase (unix seconds); the bundle's ``metrics.json`` keeps them as ``lifecycle`` (see
:func:`summarize`), and rank 0's marks, streamed to a file as they happen, let the launcher
say what the ranks are doing before the first step.
"""

import json
import os
import time
from pathlib import Path
from typing import Any

import psutil

RANK_PHASES: dict[str, str] = {
    "started": "process started",
    "imported": "imported torch and the kit",
    "engine_imported": "imported the training engine (megatron-core, DeepSpeed)",
    "process_groups": "created process groups (on cpu the default group's rendezvous runs "
                      "beside the engine's import: this is what is left of it after, and the "
                      "subgroups)",
    "model_built": "built the model, optimizer and data",
    "first_step": "ran the first step (compiles, captures, allocates)",
    "last_step": "ran the last step",
    "exiting": "wrote its result, exiting",
}
"""Marks a rank makes, in order, with what the time up to each was spent on."""

NEXT_RANK_PHASE: dict[str, str] = {
    "started": "importing torch and the kit",
    "imported": "importing the training engine (meeting its peers meanwhile)",
    "engine_imported": "creating process groups",
    "process_groups": "building the model",
    "model_built": "first step (compiling, allocating)",
}
"""What a rank does after each mark, as the launcher's progress line says it."""


def process_start_time() -> float:
    """When this process started (unix seconds), from the OS."""
    return psutil.Process().create_time()


SETUP_ENV = "CHARLLM_SETUP"
"""Set by ``run.sh`` just before it ``exec``s the kit in its own process: ``PID START END``, its
pid and when its set-up (venv, pip) began and ended (unix seconds). The process's start is then
the script's, so the kit's clock starts at END and the set-up is reported as its own phase; a
child process (another pid) ignores it."""

_PROCESS_START_USED = False


def _setup_span() -> tuple[float, float] | None:
    """When ``run.sh``'s set-up began and ended, if this process is the one it ``exec``ed."""
    try:
        pid, start, end = os.environ[SETUP_ENV].split()
        if int(pid) == os.getpid():
            return float(start), float(end)
    except (KeyError, ValueError):
        pass
    return None


def started_by_run_sh() -> bool:
    """Whether ``run.sh`` ``exec``ed this process (:data:`SETUP_ENV`): its user types
    ``./run.sh ...``, not ``charllm-kit ...``, which may not be on their PATH."""
    return _setup_span() is not None


def launcher_start_time() -> tuple[float, float | None]:
    """When this launch began, and when a set-up before it began (None: there was none).

    A CLI ``run``'s first launch starts with its process (its imports count), or where
    ``run.sh`` ran a set-up in this process first, when that ended (:data:`SETUP_ENV`: the
    set-up is reported as its own phase); every later launch (a sweep runs many in one
    process) starts with the call itself.
    """
    global _PROCESS_START_USED
    if _PROCESS_START_USED:
        return time.time(), None
    _PROCESS_START_USED = True
    setup = _setup_span()
    if setup is not None:
        return setup[1], setup[0]
    return process_start_time(), None


def launcher_marks() -> "Marks":
    """The launcher's marks, started at :func:`launcher_start_time` (with ``setup_started``
    where a set-up came first)."""
    started, setup = launcher_start_time()
    marks = Marks(started=started)
    if setup is not None:
        marks.times["setup_started"] = setup
    return marks


class Marks:
    """This process's marks; optionally streamed, one JSON line each, to ``path``."""

    def __init__(self, path: Path | None = None, started: float | None = None) -> None:
        self.times: dict[str, float] = {
            "started": process_start_time() if started is None else started}
        self._path = path
        if path is not None:
            self._write("started")

    def mark(self, name: str, t: float | None = None) -> None:
        """Record that this process reached ``name`` now (or at ``t``)."""
        self.times[name] = time.time() if t is None else t
        if self._path is not None:
            self._write(name)

    def _write(self, name: str) -> None:
        try:
            with self._path.open("a") as f:  # type: ignore[union-attr]
                f.write(json.dumps({"mark": name, "t": self.times[name]}) + "\n")
        except OSError:  # a full disk loses a progress line, never the run
            pass


_RANK_MARKS: Marks | None = None


def start_rank_marks(path: Path | None, started: float | None = None) -> Marks:
    """Begin this rank's marks (the worker calls it first); engines add theirs by :func:`mark`.

    ``started``: when the rank's imports began, if not when this process did (a forked rank).
    """
    global _RANK_MARKS
    _RANK_MARKS = Marks(path, started)
    return _RANK_MARKS


def mark(name: str) -> None:
    """Mark phase ``name`` in this rank's marks, if the worker started them (else nothing)."""
    if _RANK_MARKS is not None:
        _RANK_MARKS.mark(name)


def read_marks(path: Path) -> dict[str, float]:
    """The marks streamed to ``path`` so far (complete lines only)."""
    marks: dict[str, float] = {}
    try:
        text = path.read_text()
    except OSError:
        return marks
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line still being written
        marks[rec["mark"]] = rec["t"]
    return marks


def _span(later: float | None, earlier: float | None) -> float | None:
    return None if later is None or earlier is None else round(later - earlier, 3)


def summarize(launcher: dict[str, float], ranks: list[dict[str, float]],
              first_step_start: float | None) -> dict[str, Any]:
    """``metrics.json``'s ``lifecycle``: where start-up and teardown spent their time.

    Args:
        launcher: The launcher's marks: ``started``, ``staged``, ``sampler_started``,
            ``ranks_spawned``, ``ranks_ended``, ``sampler_stopped``, ``assembling``, and
            ``setup_started`` where a set-up (run.sh's) ran in the process before the kit.
        ranks: Each rank's marks (:data:`RANK_PHASES`).
        first_step_start: When the first step began (the earliest rank's step 0 start).

    Returns:
        ``setup_s`` (only with ``setup_started``: the set-up before the kit started, outside
        every other figure), ``launch_to_first_step_s`` (launcher start to the first step's
        start),
        ``launch_to_first_step_end_s``, ``last_step_to_assembly_s`` (the last rank's last step
        to the start of the bundle's assembly), and ``phases_s``: for each phase the seconds
        from the previous mark, ranks' phases taken at the slowest rank.
    """
    t0 = launcher.get("started")

    def slowest(name: str) -> float | None:
        values = [r[name] for r in ranks if name in r]
        return max(values) if values else None

    rank_at = {name: slowest(name) for name in RANK_PHASES}
    ordered: list[tuple[str, float | None]] = [
        ("launcher", launcher.get("ranks_spawned")),
        ("rank_imports", rank_at["imported"]),
        ("engine_imports", rank_at["engine_imported"]),
        ("process_groups", rank_at["process_groups"]),
        ("model_build", rank_at["model_built"]),
        ("first_step", rank_at["first_step"]),
    ]
    phases: dict[str, float | None] = {}
    previous = t0
    for name, t in ordered:
        phases[name] = _span(t, previous)
        previous = t if t is not None else previous
    teardown: list[tuple[str, float | None]] = [
        ("rank_exit", rank_at["exiting"]),
        ("ranks_reaped", launcher.get("ranks_ended")),
        ("sampler_stop", launcher.get("sampler_stopped")),
        ("bundle_start", launcher.get("assembling")),
    ]
    previous = rank_at["last_step"]
    for name, t in teardown:
        phases[name] = _span(t, previous)
        previous = t if t is not None else previous
    setup = {"setup_s": _span(t0, launcher["setup_started"])} if "setup_started" in launcher else {}
    return {
        **setup,
        "launch_to_first_step_s": _span(first_step_start, t0),
        "launch_to_first_step_end_s": _span(rank_at["first_step"], t0),
        "last_step_to_assembly_s": _span(launcher.get("assembling"), rank_at["last_step"]),
        "phases_s": phases,
    }


START_PHASES = ("launcher", "rank_imports", "engine_imports", "process_groups", "model_build",
                "first_step")
END_PHASES = ("rank_exit", "ranks_reaped", "sampler_stop", "bundle_start")


def describe(lifecycle: dict[str, Any], published_s: float | None = None) -> str:
    """One line for the run's summary: start-up and teardown, phase by phase (seconds).

    Args:
        lifecycle: ``metrics.json``'s ``lifecycle`` (:func:`summarize`).
        published_s: The last step to the published bundle, measured by the launcher after
            publishing (the bundle itself can only hold the time to its assembly).
    """
    phases = lifecycle.get("phases_s") or {}

    def part(names: tuple[str, ...]) -> str:
        return ", ".join(f"{n.replace('_', ' ')} {phases[n]:.1f}" for n in names
                         if phases.get(n) is not None)

    text = []
    if lifecycle.get("setup_s") is not None:
        text.append(f"set-up before the kit started {lifecycle['setup_s']:.1f} s")
    start = lifecycle.get("launch_to_first_step_end_s")
    if start is not None:
        text.append(f"launch to first step done {start:.1f} s ({part(START_PHASES)})")
    end, label = published_s, "last step to published bundle"
    if end is None:
        end, label = lifecycle.get("last_step_to_assembly_s"), "last step to bundle assembly"
    if end is not None:
        text.append(f"{label} {end:.1f} s ({part(END_PHASES)})")
    return "; ".join(text)
