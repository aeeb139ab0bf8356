"""Show training progress while ranks run, from the step lines and start-up marks rank 0
streams (rankfile, kit.lifecycle)."""

import json
import sys
from pathlib import Path
from typing import Protocol

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kit.config.run import RunConfig
from kit.engines import engine_spec
from kit.launch.rankfile import marks_path, steps_log_path
from kit.lifecycle import NEXT_RANK_PHASE, read_marks


class RunProgress(Protocol):
    """What the launcher shows while ranks run, whatever the run's kind (kit.config.run_kind:
    its ``progress`` class, built with ``for_run(cfg, staging, label)``)."""

    def poll(self) -> None:
        """Show what is new since the last call."""

    def say(self, info: str) -> None:
        """Show one line about the run (e.g. that the bundle is being written)."""

    def close(self) -> None:
        """Stop showing (the ranks have ended)."""


class ProgressWatcher:
    """Poll rank 0's step log and draw a bar on a terminal, or print one line per step."""

    @classmethod
    def for_run(cls, cfg: RunConfig, staging: Path, label: str) -> "ProgressWatcher":
        """Rank 0's start-up and steps of the training run ``cfg`` staged in ``staging``."""
        execution = engine_spec(cfg.engine).execution(cfg)
        # on a GPU an eager step is a fallback from the graphed one, which each step line names
        fallback = None if execution.graphed or cfg.platform.is_cpu else execution.describe()
        return cls(steps_log_path(staging, 0), cfg.total_steps, cfg.warmup, label,
                   marks_path(staging, 0), fallback, pipelined=cfg.parallel.pp > 1)

    def __init__(self, path: Path, total: int, warmup: int, label: str,
                 marks: Path | None = None, eager: str | None = None,
                 pipelined: bool = False) -> None:
        """``eager``: on a GPU, why the step runs eager instead of graphed (each step line
        says so, since it paces the GPU from the host); None when graphed or on a CPU.
        ``pipelined``: the loss lives on the last pipeline stage, not on rank 0."""
        self.path, self.total, self.label, self.marks = path, total, label, marks
        self._eager = eager
        self.no_loss = "on the last stage" if pipelined else "n/a"
        self._offset = 0
        self._stage: str | None = None
        self._stepped = False
        self._console = Console(stderr=True)
        self._bar: Progress | None = None
        self._task: int | None = None
        if self._console.is_terminal:
            self._bar = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=self._console,
            )
            self._task = self._bar.add_task(label, total=total, info="starting ranks")
            self._bar.start()
        else:
            print(f"{label}: starting {total} steps ({warmup} warmup)", file=sys.stderr)
        if eager is not None:
            self.say(f"step {eager}")

    def say(self, info: str) -> None:
        """Show what the run is doing now, between steps or before the first."""
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, info=info)
        else:
            print(f"{self.label}: {info}", file=sys.stderr)

    def _start_up(self) -> None:
        """Before the first step: say which start-up phase rank 0 is in, once per phase."""
        marks = read_marks(self.marks) if self.marks is not None else {}
        last = max(marks, key=marks.__getitem__, default=None)
        stage = NEXT_RANK_PHASE.get(last or "")
        if stage is not None and stage != self._stage:
            self._stage = stage
            self.say(f"ranks {stage}")

    def poll(self) -> None:
        """Read new step lines and show them."""
        if not self._stepped:
            self._start_up()
        if not self.path.is_file():
            return
        with self.path.open() as f:
            f.seek(self._offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind("\n") + 1]
        self._offset += len(complete.encode())
        for line in complete.splitlines():
            rec = json.loads(line)
            self._stepped = True
            loss = self.no_loss if rec["loss"] is None else f"{rec['loss']:.4f}"
            info = f"{rec['phase']} {rec['t_end'] - rec['t_start']:.3f}s/step loss {loss}"
            if self._eager is not None:
                info += f" [{self._eager}]"
            if rec["step"] >= self.total:  # rank 0 extended a measured phase that was short
                self.total = rec["step"] + 1
                info += " (measured phase extended to its minimum length)"
                if self._bar is not None and self._task is not None:
                    self._bar.update(self._task, total=self.total)
            if self._bar is not None and self._task is not None:
                self._bar.update(self._task, completed=rec["step"] + 1, info=info)
            else:
                print(f"{self.label}: step {rec['step'] + 1}/{self.total} {info}", file=sys.stderr)

    def close(self) -> None:
        """Stop drawing."""
        self.poll()
        if self._bar is not None:
            self._bar.stop()
            self._bar = None  # what is said from now on is printed as lines
