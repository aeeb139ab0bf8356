"""The reference study's findings, one entry each: what it reported, in its own terms.

Go et al., "Characterizing the Efficiency of Distributed Training: A Power, Performance, and
Thermal Perspective" (MICRO 2025, arXiv 2509.10371). The ids name the entries of
``findings.json`` and ``charllm-kit study --only``.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class StudyFinding:
    """One finding of the study."""

    id: str
    title: str
    reported: str


FINDINGS: tuple[StudyFinding, ...] = (
    StudyFinding(
        "scale-up", "Scale-up vs scale-out",
        "Fewer, larger-memory GPUs (32 H200) can beat more, smaller ones (64 H100) when "
        "communication-bound, but only when carefully tuned; otherwise scale-out wins."),
    StudyFinding(
        "tp-pp-links", "TP with PP under-uses the links",
        "Tensor combined with pipeline parallelism under-uses link bandwidth because of "
        "inefficient data chunking (sparse, uncoordinated SendRecv)."),
    StudyFinding(
        "microbatch-bursts", "Larger micro-batches turn execution bursty",
        "Past some micro-batch size, peak power excursions rise, thermal throttling worsens, "
        "and throughput can drop."),
    StudyFinding(
        "thermal-position", "Thermal imbalance follows chassis position",
        "GPU temperatures differ by position in the chassis (airflow), whatever the layout."),
    StudyFinding(
        "pp-throttle", "Hot GPUs throttle under PP-heavy layouts",
        "Under pipeline-heavy layouts the hot GPUs throttle persistently."),
    StudyFinding(
        "thermal-placement", "Thermal-aware stage placement",
        "Placing heavier pipeline stages on cooler GPUs gained a few percent on one model and "
        "lost on another."),
    StudyFinding(
        "recompute-power", "Recomputation changes power and thermals",
        "Full activation recomputation changes power and temperature, not only speed."),
    StudyFinding(
        "overlap-power", "Overlap changes power and thermals",
        "Compute-communication overlap changes power and temperature, not only speed."),
)

FINDING_IDS: tuple[str, ...] = tuple(f.id for f in FINDINGS)


def finding(finding_id: str) -> StudyFinding:
    """The finding of this id (KeyError for an unknown one)."""
    return {f.id: f for f in FINDINGS}[finding_id]
