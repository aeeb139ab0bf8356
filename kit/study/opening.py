"""The study report's first screen: the study it tests (title and link), what this node measured
on what, what it could not and why, and the verdicts in one line."""

import html
from collections import Counter

from kit.analysis.report import Opening
from kit.study.facts import BundleFacts
from kit.study.verdicts import FindingResult

STUDY_TITLE = ("Characterizing the Efficiency of Distributed Training: A Power, Performance, "
               "and Thermal Perspective")
STUDY_CITATION = "Go et al., MICRO 2025, arXiv 2509.10371"
STUDY_URL = "https://arxiv.org/abs/2509.10371"

MEASURES = (
    ("step time", "step_time_s"),
    ("throughput", "tokens_per_s"),
    ("MFU", "mfu"),
    ("peak memory", "mem_peak_gib"),
    ("power", "power_w_mean"),
    ("energy per token", "energy_j_per_token"),
    ("GPU temperature", "temp_gpu_c_max"),
    ("SM clock", "clock_sm_frac_of_max"),
    ("throttling", "throttle_frac"),
)
"""What a run can measure, in words, and the summary key that says whether it did."""

VERDICTS = ("agrees", "disagrees", "confounded", "not measurable here")


def report_title(node: str) -> str:
    """The study report's heading: the study's title and the node it ran on."""
    return f"{STUDY_TITLE}: the findings on {node}"


def _words(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def opening_lines(facts: list[BundleFacts], results: list[FindingResult],
                  node: str) -> list[str]:
    """The first screen's sentences, plain text (module docstring)."""
    runs = [f for f in facts if f.fabric is None]
    measured = [name for name, key in MEASURES
                if any(f.summary.get(key) is not None for f in runs)]
    missing = [name for name, key in MEASURES if name not in measured]
    platforms = sorted({f.platform for f in runs})
    workloads = sorted({f.workload for f in runs})
    lines = [f"This report tests the findings of {STUDY_CITATION} on {node}: "
             f"{len(runs)} run(s) of {_words(workloads or ['no workload'])} on "
             f"{_words(platforms or ['no platform'])}"
             + (", and a fabric benchmark" if len(runs) < len(facts) else "") + "."]
    if measured:
        lines.append(f"Measured: {_words(measured)}.")
    if missing:
        why = ("this is a CPU host, without GPU power, energy, thermal or clock sensors: the "
               "report demonstrates the study's flow (runs, comparisons, verdicts), not its "
               "power and thermal findings; run the study on a GPU node for those"
               if platforms == ["cpu"] else
               "no run recorded them (each run's telemetry line below says why)")
        lines.append(f"Not measured: {_words(missing)}; {why}.")
    counts = Counter(r.verdict for r in results)
    lines.append("Verdicts: " + ", ".join(f"{counts[v]} {v}" for v in VERDICTS if counts[v])
                 + " (Findings, below).")
    return lines


def study_opening(facts: list[BundleFacts], results: list[FindingResult],
                  node: str) -> Opening:
    """The first screen for both formats, the study linked."""
    lines = opening_lines(facts, results, node)
    cite = html.escape(STUDY_CITATION)
    first = html.escape(lines[0]).replace(
        cite, f'<a href="{STUDY_URL}">{cite}</a>', 1)
    body = [first, *(html.escape(line) for line in lines[1:])]
    return Opening(
        html='<div id="opening">' + "".join(f"<p>{b}</p>" for b in body) + "</div>",
        markdown="\n\n".join([lines[0].replace(STUDY_CITATION,
                                               f"[{STUDY_CITATION}]({STUDY_URL})", 1),
                              *lines[1:]]))
