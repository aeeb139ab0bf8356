"""Run the study on this node: the matrix as one sweep, the fabric benchmark, then the findings.

Layout of ``<out>/<study name>/`` (e.g. ``results/study-h200x4/``): the sweep folder of the
matrix (``sweep.json``, one folder per point; ``matrix.yaml`` is the matrix as a sweep file with
the findings each point serves), ``fabric/`` with the fabric benchmark's bundle,
``<node>-findings.json``, ``report.html`` (Findings first) and ``findings/`` (its figures).
Everything resumes: ``--resume`` keeps each point whose bundle verifies and a fabric bundle that
ended ok, and recomputes the findings and the report from all of them.
"""

import json
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml
from tabulate import tabulate

from kit.bundle.reader import read_bundle
from kit.bundle.verify import verify_bundle
from kit.errors import BundleError, KitInputError
from kit.study.estimate import FABRIC_S, REPORT_S, fmt_duration, point_s
from kit.study.facts import read_facts
from kit.study.matrix import StudyMatrix
from kit.study.render import (
    FIGURE_DIR,
    findings_html,
    findings_json,
    findings_markdown,
    write_figures,
)
from kit.study.verdicts import FindingResult, all_findings
from kit.sweep.folder import read_sweep_folder
from kit.sweep.index import INDEX_FILE
from kit.sweep.plan import PlannedPoint, plan_sweep

MATRIX_FILE = "matrix.yaml"
FABRIC_DIR = "fabric"
REPORT_FILE = "report.html"


@dataclass(frozen=True)
class PlannedStudy:
    """The matrix, each point's verdict (valid or skipped, why) and the time it should take."""

    matrix: StudyMatrix
    plan: list[PlannedPoint]
    estimates: dict[str, float]
    """Point id -> estimated seconds, for the valid points."""

    @property
    def fabric_s(self) -> float:
        """The fabric benchmark's estimate (0 when the matrix has none)."""
        if self.matrix.fabric is None:
            return 0.0
        return FABRIC_S["cpu" if self.matrix.node.is_cpu else "gpu"]

    @property
    def total_s(self) -> float:
        """The whole study: points, fabric and report."""
        return sum(self.estimates.values()) + self.fabric_s + REPORT_S


def plan_study(matrix: StudyMatrix, require_present: bool) -> PlannedStudy:
    """Check every point as ``charllm-kit sweep`` would and estimate its time.

    Raises:
        KitInputError: As :func:`kit.sweep.plan.plan_sweep`.
    """
    plan = plan_sweep(matrix.sweep_spec(), require_present)
    return PlannedStudy(matrix, plan, {p.id: point_s(p.cfg) for p in plan if p.cfg and p.valid})


def plan_text(planned: PlannedStudy) -> str:
    """The dry run's listing: every point, the findings it serves, its verdict and time."""
    m = planned.matrix
    rows = []
    for p, sp in zip(planned.plan, m.points, strict=True):
        est = planned.estimates.get(p.id)
        rows.append([p.id, ", ".join(sp.findings), "valid" if p.valid else "skipped",
                     fmt_duration(est) if est else "", p.skip_reason or ""])
    if m.fabric is not None:
        rows.append(["fabric", "tp-pp-links", "valid", fmt_duration(planned.fabric_s),
                     f"ops {m.fabric['ops']}, sizes {m.fabric['sizes']}"])
    table = tabulate(rows, headers=["point", "findings", "verdict", "estimate", "reason"],
                     tablefmt="simple", maxcolwidths=[None, 40, None, None, 60])
    valid = sum(p.valid for p in planned.plan)
    head = (f"study {m.name}: {m.workload} on {m.node.label}, "
            f"{m.base['steps']} measured + {m.base['warmup']} warmup steps per point"
            + ("" if m.node.is_cpu else ", more where steps are short (steps<N> in the id)"))
    return (f"{head}\n{table}\n{len(planned.plan)} points: {valid} valid, "
            f"{len(planned.plan) - valid} skipped; estimated {fmt_duration(planned.total_s)} "
            "(start-up per point, steps at an assumed MFU, fabric and report; docs/study.md)")


def _write_matrix(matrix: StudyMatrix, path: Path) -> None:
    """The matrix as a sweep file, each point preceded by the findings it serves."""
    spec = matrix.sweep_spec()
    lines = [f"# charllm-kit study: {matrix.name} ({matrix.workload} on {matrix.node.label})",
             yaml.safe_dump({"name": spec.name, "description": spec.description,
                             "base": spec.base}, sort_keys=False).rstrip(),
             "axes:", "  - points:"]
    for p in matrix.points:
        lines += [f"      # {', '.join(p.findings)}",
                  f"      - {json.dumps(p.values)}"]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


class _Progress:
    """Lines for each point with the time left.

    The time left is the estimate of the points left, scaled by how long the points run so far
    took against their estimates.
    """

    def __init__(self, planned: PlannedStudy, say: Callable[[str], None]) -> None:
        self.planned, self.say = planned, say
        self.left = dict(planned.estimates)
        self.spent_s = self.spent_est_s = 0.0
        self.started: dict[str, float] = {}

    def time_left_s(self) -> float:
        """Seconds the rest should take."""
        ratio = self.spent_s / self.spent_est_s if self.spent_est_s else 1.0
        return (sum(self.left.values()) + self.planned.fabric_s + REPORT_S) * ratio

    def __call__(self, line: str) -> None:
        match = re.search(r"point \d+/\d+ (\S+): (.*)$", line)
        if match is None:
            self.say(line)
            return
        pid, what = match.groups()
        if what == "running":
            self.started[pid] = time.monotonic()
            self.say(line)
            return
        est = self.left.pop(pid, 0.0)
        if pid in self.started:
            self.spent_s += time.monotonic() - self.started.pop(pid)
            self.spent_est_s += est
        done = len(self.planned.estimates) - len(self.left)
        self.say(f"{line} [{done}/{len(self.planned.estimates)} points, about "
                 f"{fmt_duration(self.time_left_s())} left]")


def _fabric_bundle(folder: Path, resume: bool) -> Path | None:
    """The newest fabric bundle that verifies and ended ok, when resuming."""
    if not resume or not folder.is_dir():
        return None
    for path in sorted((p for p in folder.iterdir() if p.is_dir()), reverse=True):
        try:
            verify_bundle(path)
            if read_bundle(path).manifest.status == "ok":
                return path
        except BundleError:
            continue
    return None


def _run_fabric(matrix: StudyMatrix, folder: Path, resume: bool, command: list[str],
                say: Callable[[str], None]) -> Path | None:
    """Run (or keep) the fabric benchmark; None when it could not run (the findings say so)."""
    from kit.fabric.request import fabric_request
    from kit.fabric.run import resolve_fabric, run_fabric

    assert matrix.fabric is not None
    kept = _fabric_bundle(folder, resume)
    if kept is not None:
        say(f"study {matrix.name}: fabric: kept ({kept.name}, bundle verifies)")
        return kept
    say(f"study {matrix.name}: fabric: running")
    req = fabric_request(**matrix.fabric)
    try:
        result = run_fabric(resolve_fabric(req), req, folder, command)
    except Exception as e:  # the findings that need it say why; the rest still stand
        say(f"study {matrix.name}: fabric: error {type(e).__name__}: {e}")
        return None
    if result is None:
        return None
    say(f"study {matrix.name}: fabric: {result.status}")
    return result.bundle


@dataclass
class StudyOutcome:
    """What the study wrote and found."""

    folder: Path
    findings: list[FindingResult]
    findings_file: Path
    report: Path | None
    any_failed: bool


def conclude(folder: Path, bundles: list[Path], label: str,
             say: Callable[[str], None] = print, unverified: Mapping[str, str] | None = None,
             ) -> tuple[list[FindingResult], Path, Path | None]:
    """Findings over ``bundles``, written to ``folder``: the JSON, the figures and the report.

    ``unverified`` (bundle name -> why it failed verification) marks bundles used only because
    of ``--allow-unverified`` (``study --from``, :mod:`kit.study.existing`).

    Returns:
        The findings, the findings file, and the report (None when it could not be built;
        ``say`` tells why).
    """
    facts = []
    for b in bundles:
        try:
            facts.append(read_facts(b))
        except KitInputError as e:  # a bundle without its metrics: the findings go without it
            say(f"left out of the findings: {e}")
    results = all_findings(facts)
    findings_file = folder / f"{label}-findings.json"
    findings_file.write_text(json.dumps(findings_json(results, label, unverified), indent=1)
                             + "\n", encoding="utf-8")
    figures = {k: f"{FIGURE_DIR}/{p.name}"
               for k, p in write_figures(results, folder / FIGURE_DIR).items()}
    from kit.analysis.report import LeadSection, write_report
    from kit.study.opening import report_title, study_opening

    lead = LeadSection("findings", "Findings", findings_html(results, figures, unverified),
                       findings_markdown(results, figures, unverified))
    report: Path | None = folder / REPORT_FILE
    try:
        write_report([str(b) for b in bundles], report, lead=[lead], title=report_title(label),
                     opening=study_opening(facts, results, label),
                     allow_unverified=bool(unverified))
    except KitInputError as e:
        say(f"report not written: {e}")
        report = None
    return results, findings_file, report


def run_study(planned: PlannedStudy, out: Path, resume: bool, command: list[str],
              say: Callable[[str], None]) -> StudyOutcome:
    """Run the matrix (resuming), the fabric benchmark, then write findings and the report.

    Raises:
        KitInputError: As :func:`kit.sweep.runner.run_sweep` (the folder exists without
            ``resume``, no point can run here, the matrix changed since the folder was run).
    """
    from kit.sweep.runner import run_sweep

    matrix = planned.matrix
    folder = out / matrix.name
    if (folder / INDEX_FILE).exists() and not resume:
        raise KitInputError(f"study folder {folder} exists; pass --resume to continue it, or "
                            "--out another directory")
    folder.mkdir(parents=True, exist_ok=True)
    matrix_file = folder / MATRIX_FILE
    _write_matrix(matrix, matrix_file)
    say(f"study {matrix.name}: {len(planned.estimates)} points, estimated "
        f"{fmt_duration(planned.total_s)}")
    outcome = run_sweep(matrix.sweep_spec(), matrix_file, out, resume, command,
                        progress=_Progress(planned, say))
    stopped = any(p.status == "interrupted" for p in outcome.index.points)
    if stopped:
        say(f"study {matrix.name}: stopped; findings so far below, --resume continues")
    fabric = (_run_fabric(matrix, folder / FABRIC_DIR, resume, command, say)
              if matrix.fabric is not None and not stopped
              else _fabric_bundle(folder / FABRIC_DIR, True))
    sweep = read_sweep_folder(folder)
    bundles = (sweep.bundles if sweep else []) + ([fabric] if fabric else [])
    results, findings_file, report = conclude(folder, bundles, matrix.node.label, say)
    return StudyOutcome(folder, results, findings_file, report, outcome.any_failed)


def stderr(line: str) -> None:
    """Print a progress line on stderr."""
    print(line, file=sys.stderr, flush=True)
