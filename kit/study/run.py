"""Run the study on this node: the matrix as one sweep, the fabric benchmark, then the findings.

Layout of ``<out>/<study name>/`` (e.g. ``results/study-h200x4/``): the sweep folder of the
matrix (``sweep.json``, one folder per point; ``matrix.yaml`` is the matrix as a sweep file with
the findings each point serves), ``fabric/`` with the fabric benchmark's bundle,
``<node>-findings.json``, ``report.html`` (Findings first) and ``findings/`` (its figures).
Everything resumes: ``--resume`` keeps each point whose bundle verifies and a fabric bundle that
ended ok, and recomputes the findings and the report from all of them.

After the matrix, each point's warm-up is checked (:mod:`kit.study.warmup`) and a point whose
first measured step still carried its start runs once more with more warmup, as points after
the matrix's in the same sweep folder (``matrix.yaml`` says why); the findings read the rerun.
The findings file also records what the matrix did (``matrix``: its model, each finding's
execution mode or why it had no points, the warm-up checks, the estimate and the wall time).
"""

import json
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from tabulate import tabulate

from kit.bundle.reader import read_bundle
from kit.bundle.verify import verify_bundle
from kit.errors import BundleError, KitInputError
from kit.study.estimate import (
    FABRIC_S,
    REPORT_S,
    Pace,
    fmt_duration,
    learned_pace,
    platform_pace,
    point_s,
)
from kit.study.facts import read_facts
from kit.study.matrix import StudyMatrix, StudyPoint
from kit.study.render import (
    FIGURE_DIR,
    findings_html,
    findings_json,
    findings_markdown,
    write_figures,
)
from kit.study.verdicts import HELD, FindingResult, all_findings
from kit.study.warmup import (
    FIRST_STEP_EXCESS,
    RERUN_WARMUP_FACTOR,
    WarmupCheck,
    check_warmup,
    rerun_values,
)
from kit.sweep.folder import read_sweep_folder
from kit.sweep.index import INDEX_FILE, SweepIndex
from kit.sweep.plan import PlannedPoint, plan_sweep

if TYPE_CHECKING:
    from kit.sweep.runner import SweepOutcome

MATRIX_FILE = "matrix.yaml"
FABRIC_DIR = "fabric"
REPORT_FILE = "report.html"

STUDY_AXES: tuple[str, ...] = tuple(sorted(set().union(
    *(held.factor for finding, held in HELD.items() if finding != "scale-up"))))
"""What the study varies on purpose, as run fields: every finding's factor but scale-up's
(which compares nodes). Bundles concluded from outside a study folder (``study --from``) have
no sweep index to say so, and the report's comparability names these as swept."""


@dataclass(frozen=True)
class PlannedStudy:
    """The matrix, each point's verdict (valid or skipped, why) and the time it should take."""

    matrix: StudyMatrix
    plan: list[PlannedPoint]
    estimates: dict[str, float]
    """Point id -> estimated seconds, for the valid points."""
    pace: Pace
    """The start-up and MFU the estimates rest on, and where they come from."""

    @property
    def fabric_s(self) -> float:
        """The fabric benchmark's estimate (0 when the matrix has none)."""
        if self.matrix.fabric is None:
            return 0.0
        return FABRIC_S["cpu" if self.matrix.node.is_cpu else "gpu"]

    @property
    def report_s(self) -> float:
        """The findings' and the report's estimate."""
        return REPORT_S["cpu" if self.matrix.node.is_cpu else "gpu"]

    @property
    def total_s(self) -> float:
        """The whole study: points, fabric and report."""
        return sum(self.estimates.values()) + self.fabric_s + self.report_s


def plan_study(matrix: StudyMatrix, require_present: bool, out: Path) -> PlannedStudy:
    """Check every point as ``charllm-kit sweep`` would and estimate its time, at the pace of
    this node's earlier studies in ``out`` where there are some, else its platform's.

    Raises:
        KitInputError: As :func:`kit.sweep.plan.plan_sweep`.
    """
    plan = plan_sweep(matrix.sweep_spec(), require_present)
    node = matrix.node
    platform = node.spec()
    pace = (learned_pace(out, node.label, platform, node.devices)
            or platform_pace(platform, node.devices))
    return PlannedStudy(matrix, plan, {p.id: point_s(p.cfg, pace) for p in plan
                                       if p.cfg and p.valid}, pace)


def plan_text(planned: PlannedStudy) -> str:
    """The dry run's listing: every point, the findings it serves, its verdict and time; then
    the findings the node runs no point for, each finding's execution mode, and the pace."""
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
    lines = [head, table]
    lines += [f"not measurable here: {f}: {why}" for f, why in m.not_run.items()]
    modes: dict[str, list[str]] = {}
    for f, mode in m.execution.items():
        modes.setdefault(mode.describe(), []).append(f)
    lines += [f"execution: {', '.join(fs)}: {mode}" for mode, fs in modes.items()]
    if not m.node.is_cpu:
        lines.append(f"warm-up check: a point whose first measured step is over "
                     f"{FIRST_STEP_EXCESS:.0%} slower than the median of its measured steps "
                     f"runs once more with {RERUN_WARMUP_FACTOR} times the warmup (not in the "
                     "estimate)")
    lines.append(f"{len(planned.plan)} points: {valid} valid, {len(planned.plan) - valid} "
                 f"skipped; estimated {fmt_duration(planned.total_s)} "
                 f"({planned.pace.describe(m.node.is_cpu)}; fabric and report; docs/study.md)")
    return "\n".join(lines)


def _write_matrix(matrix: StudyMatrix, path: Path, reruns: list["_Rerun"] | None = None) -> None:
    """The matrix as a sweep file, each point preceded by the findings it serves; the warm-up
    check's reruns after them, each preceded by why."""
    spec = matrix.sweep_spec()
    lines = [f"# charllm-kit study: {matrix.name} ({matrix.workload} on {matrix.node.label})",
             yaml.safe_dump({"name": spec.name, "description": spec.description,
                             "base": spec.base}, sort_keys=False).rstrip(),
             "axes:", "  - points:"]
    for p in matrix.points:
        lines += [f"      # {', '.join(p.findings)}",
                  f"      - {json.dumps(p.values)}"]
    for r in reruns or []:
        lines += [f"      # warm-up check: rerun of {r.check.point}: {r.check.describe()}",
                  f"      - {json.dumps(r.point.values)}"]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


class _Progress:
    """Lines for each point with the time left.

    The time left is the estimate of the points left, scaled by how long the points run so far
    took against their estimates. Lines of points in :attr:`quiet` are not repeated (a second
    pass of the sweep keeps the points the first one ran).
    """

    def __init__(self, planned: PlannedStudy, say: Callable[[str], None]) -> None:
        self.planned, self.say = planned, say
        self.estimates = dict(planned.estimates)
        self.left = dict(planned.estimates)
        self.spent_s = self.spent_est_s = 0.0
        self.started: dict[str, float] = {}
        self.quiet: set[str] = set()

    def expect(self, estimates: dict[str, float]) -> None:
        """Points added to the study while it runs (the warm-up check's reruns)."""
        self.estimates.update(estimates)
        self.left.update(estimates)

    def time_left_s(self) -> float:
        """Seconds the rest should take."""
        ratio = self.spent_s / self.spent_est_s if self.spent_est_s else 1.0
        return (sum(self.left.values()) + self.planned.fabric_s + self.planned.report_s) * ratio

    def __call__(self, line: str) -> None:
        match = re.search(r"point \d+/\d+ (\S+): (.*)$", line)
        if match is None:
            self.say(line)
            return
        pid, what = match.groups()
        if pid in self.quiet:
            return
        if what == "running":
            self.started[pid] = time.monotonic()
            self.say(line)
            return
        est = self.left.pop(pid, 0.0)
        if pid in self.started:
            self.spent_s += time.monotonic() - self.started.pop(pid)
            self.spent_est_s += est
        done = len(self.estimates) - len(self.left)
        self.say(f"{line} [{done}/{len(self.estimates)} points, about "
                 f"{fmt_duration(self.time_left_s())} left]")


@dataclass(frozen=True)
class _Rerun:
    """A point the warm-up check runs again, and the check that asked for it."""

    check: WarmupCheck
    point: StudyPoint


def _warmup_checks(matrix: StudyMatrix, index: SweepIndex,
                   folder: Path) -> tuple[list[WarmupCheck], list[_Rerun]]:
    """The warm-up check of every matrix point that ran to an ok bundle (``index`` is the
    matrix's own sweep: its points in the matrix's order), and a rerun with more warmup for
    each point that failed it."""
    checks, reruns = [], []
    for rec, point in zip(index.points, matrix.points, strict=True):
        check = (check_warmup(rec.id, folder / rec.bundle)
                 if rec.status == "ok" and rec.bundle else None)
        if check is not None:
            checks.append(check)
            if not check.ok:
                reruns.append(_Rerun(check, StudyPoint(rerun_values(point.values, check.warmup),
                                                       point.findings)))
    return checks, reruns


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
             say: Callable[[str], None] = print, matrix: dict[str, Any] | None = None,
             unverified: Mapping[str, str] | None = None,
             ) -> tuple[list[FindingResult], Path, Path | None]:
    """Findings over ``bundles``, written to ``folder``: the JSON, the figures and the report.

    ``matrix`` is what the study's own matrix did (:func:`_matrix_record`): the findings file
    carries it as ``matrix`` and, in each finding's entry, that finding's ``execution`` (the
    mode all its points ran in) or ``not_run`` (why it had no points on this node).
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
    doc = findings_json(results, label, unverified)
    if matrix is not None:
        doc["matrix"] = matrix
        for entry in doc["findings"]:
            for key in ("execution", "not_run"):
                if entry["finding"] in matrix[key]:
                    entry[key] = matrix[key][entry["finding"]]
    findings_file.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
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
                     swept=sweep.varied() if (sweep := read_sweep_folder(folder)) else STUDY_AXES,
                     allow_unverified=bool(unverified))
    except KitInputError as e:
        say(f"report not written: {e}")
        report = None
    return results, findings_file, report


def _matrix_record(planned: PlannedStudy, checks: list[dict[str, Any]],
                   resumed: bool) -> dict[str, Any]:
    """What the matrix did, for the findings file: its model and steps, each finding's
    execution mode or why it had no points, the warm-up checks and the time estimate."""
    m = planned.matrix
    return {"node": m.node.label, "workload": m.workload, "steps": m.base["steps"],
            "warmup": m.base["warmup"],
            "execution": {f: mode.as_json() for f, mode in m.execution.items()},
            "not_run": dict(m.not_run),
            "warmup_checks": {"first_step_excess_max": FIRST_STEP_EXCESS, "points": checks},
            "timing": {"estimate_s": round(planned.total_s, 1), "wall_s": None,
                       "pace": planned.pace.describe(m.node.is_cpu), "resumed": resumed}}


def _run_reruns(planned: PlannedStudy, reruns: list[_Rerun], records: list[dict[str, Any]],
                out: Path, command: list[str], progress: _Progress,
                say: Callable[[str], None]) -> tuple["SweepOutcome", set[str]]:
    """Run the warm-up check's reruns after the matrix's points, in its sweep folder, and add
    each rerun's own check to its point's record in ``records``.

    Returns:
        The sweep's outcome, and the points whose rerun ended ok (the findings read the rerun
        instead).
    """
    from kit.sweep.runner import run_sweep

    matrix = planned.matrix
    folder, matrix_file = out / matrix.name, out / matrix.name / MATRIX_FILE
    for r in reruns:
        say(f"study {matrix.name}: warm-up check: {r.check.point}: {r.check.describe()}; "
            f"its rerun has {r.point.values['warmup']} warmup steps")
    _write_matrix(matrix, matrix_file, reruns)
    spec = matrix.sweep_spec([r.point for r in reruns])
    planned_reruns = plan_sweep(spec, require_present=True)[len(matrix.points):]
    progress.quiet = {p.id for p in planned.plan}
    progress.expect({p.id: point_s(p.cfg, planned.pace) for p in planned_reruns
                     if p.cfg and p.valid})
    outcome = run_sweep(spec, matrix_file, out, True, command, progress=progress)
    by_point = {c["point"]: c for c in records}
    replaced = set()
    for r, rec in zip(reruns, outcome.index.points[len(matrix.points):], strict=True):
        after = (check_warmup(rec.id, folder / rec.bundle)
                 if rec.status == "ok" and rec.bundle else None)
        by_point[r.check.point]["rerun"] = (
            after.as_json() if after else {"point": rec.id, "status": rec.status})
        if after is not None:
            replaced.add(r.check.point)
            if not after.ok:
                say(f"study {matrix.name}: warm-up check: {rec.id}: still {after.describe()}; "
                    "the findings read it, the findings file says so")
    return outcome, replaced


def run_study(planned: PlannedStudy, out: Path, resume: bool, command: list[str],
              say: Callable[[str], None]) -> StudyOutcome:
    """Run the matrix (resuming), check each point's warm-up and run the points that fail it
    once more with more, run the fabric benchmark, then write findings and the report.

    Raises:
        KitInputError: As :func:`kit.sweep.runner.run_sweep` (the folder exists without
            ``resume``, no point can run here, the matrix changed since the folder was run).
    """
    from kit.sweep.runner import run_sweep

    started = time.monotonic()
    matrix = planned.matrix
    folder = out / matrix.name
    if (folder / INDEX_FILE).exists() and not resume:
        raise KitInputError(f"study folder {folder} exists; pass --resume to continue it, or "
                            "--out another directory")
    folder.mkdir(parents=True, exist_ok=True)
    matrix_file = folder / MATRIX_FILE
    _write_matrix(matrix, matrix_file)
    say(f"study {matrix.name}: {len(planned.estimates)} points, estimated "
        f"{fmt_duration(planned.total_s)} ({planned.pace.describe(matrix.node.is_cpu)})")
    progress = _Progress(planned, say)
    outcome = run_sweep(matrix.sweep_spec(), matrix_file, out, resume, command, progress=progress)
    any_failed = outcome.any_failed
    stopped = any(p.status == "interrupted" for p in outcome.index.points)
    checks, reruns = ([], []) if stopped else _warmup_checks(matrix, outcome.index, folder)
    records = [c.as_json() for c in checks]
    replaced: set[str] = set()
    if reruns:
        outcome, replaced = _run_reruns(planned, reruns, records, out, command, progress, say)
        any_failed = any_failed or outcome.any_failed
        stopped = any(p.status == "interrupted" for p in outcome.index.points)
    if stopped:
        say(f"study {matrix.name}: stopped; findings so far below, --resume continues")
    fabric = (_run_fabric(matrix, folder / FABRIC_DIR, resume, command, say)
              if matrix.fabric is not None and not stopped
              else _fabric_bundle(folder / FABRIC_DIR, True))
    sweep = read_sweep_folder(folder)
    points = [p for p in sweep.index.points if p.id not in replaced] if sweep else []
    bundles = [folder / p.bundle for p in points if p.bundle] + ([fabric] if fabric else [])
    record = _matrix_record(planned, records, resume)
    results, findings_file, report = conclude(folder, bundles, matrix.node.label, say, record)
    wall_s = time.monotonic() - started
    record["timing"]["wall_s"] = round(wall_s, 1)
    doc = json.loads(findings_file.read_text(encoding="utf-8"))
    doc["matrix"] = record
    findings_file.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    say(f"study {matrix.name}: ran in {fmt_duration(wall_s)} against an estimate of "
        f"{fmt_duration(planned.total_s)} ({wall_s / planned.total_s - 1:+.0%})"
        + (" (resumed: kept points took no time)" if resume else ""))
    return StudyOutcome(folder, results, findings_file, report, any_failed)


def stderr(line: str) -> None:
    """Print a progress line on stderr."""
    print(line, file=sys.stderr, flush=True)
