"""A bundle as MLPerf-style ``:::MLLOG {json}`` lines, readable by mlperf_logging's parsers.

Each line is ``:::MLLOG `` and one JSON object with mllog's keys in its order: ``namespace``,
``time_ms``, ``event_type`` (``INTERVAL_START``, ``INTERVAL_END``, ``POINT_IN_TIME``), ``key``,
``value``, ``metadata``. How a kit run maps onto MLPerf's timeline:

- ``init_start``: the earliest time in the bundle (first telemetry sample or first step);
  warmup steps belong to initialization, as compilation and warmup do in MLPerf.
- ``init_stop`` = ``run_start``: start of the first measured step (earliest rank).
- one ``block_start`` / ``block_stop`` per measured optimizer step (earliest start, latest end
  over ranks) with ``samples_count`` and ``step_num`` metadata, and a ``train_loss`` event at
  its end (mean over the ranks that computed a loss; absent when none did).
- ``run_stop``: end of the last measured step; ``status`` ``success`` when the run ended ``ok``,
  else ``aborted`` with the kit's status beside it.

Configuration events (submission, batch sizes, seed, optimizer, parallel degrees) come from
the manifest at ``init_start``. There are no eval events: kit runs train on synthetic tokens and
do not evaluate, so MLPerf's per-benchmark compliance rules do not apply to them.

A bundle that failed verification and is exported only because of ``--allow-unverified`` gets
a ``kit_bundle_unverified`` event right after ``init_start`` whose value says what failed; a
verified bundle has none.
"""

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from kit.bundle.reader import Bundle
from kit.interop.system_desc import DIVISION, system_name

MLLOG_PREFIX = ":::MLLOG "

INTERVAL_START = "INTERVAL_START"
INTERVAL_END = "INTERVAL_END"
POINT_IN_TIME = "POINT_IN_TIME"

UNVERIFIED_KEY = "kit_bundle_unverified"
"""The kit's own event marking an export of a bundle that failed verification."""

SUBMISSION_STATUS = "research"
"""mllog's submission status for work that is neither on-premise nor cloud availability."""


@dataclass(frozen=True)
class MLLogEvent:
    """One mllog event: what happened, when (unix ms), and its value and metadata."""

    time_ms: int
    event_type: str
    key: str
    value: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        """Render as mllog does: prefix, then the fields in mllog's order."""
        body = {"namespace": "", "time_ms": self.time_ms, "event_type": self.event_type,
                "key": self.key, "value": self.value, "metadata": self.metadata}
        return MLLOG_PREFIX + json.dumps(body, allow_nan=False)


@dataclass(frozen=True)
class _Step:
    step: int
    t_start: float
    t_end: float
    loss: float | None


def _measured_steps(steps: pa.Table) -> list[_Step]:
    """One entry per measured step: earliest start, latest end, mean loss over ranks."""
    measured = steps.filter(pc.equal(steps["phase"], "measured"))
    grouped = measured.group_by("step").aggregate(
        [("t_start", "min"), ("t_end", "max"), ("loss", "mean")]
    ).sort_by("step")
    return [
        _Step(r["step"], r["t_start_min"], r["t_end_max"], r["loss_mean"])
        for r in grouped.to_pylist()
    ]


def _ms(t: float) -> int:
    return round(t * 1000)


def _first_time(bundle: Bundle) -> float:
    """The earliest time the bundle records, or when it was written if it records none."""
    times = [pc.min(bundle.steps["t_start"]).as_py(), pc.min(bundle.telemetry["t"]).as_py()]
    known = [t for t in times if t is not None]
    if known:
        return min(known)
    return datetime.fromisoformat(bundle.manifest["created_utc"].replace("Z", "+00:00")).timestamp()


def _config_events(bundle: Bundle, t_ms: int, org: str) -> list[MLLogEvent]:
    """Submission, hyperparameter and parallelism events from the manifest."""
    manifest = bundle.manifest
    cfg, parallel = manifest["config"], manifest["config"]["parallel"]
    micro, glob = cfg["micro_batch_size"], cfg["global_batch_size"]
    values: list[tuple[str, Any]] = [
        ("submission_benchmark", manifest["workload"]["name"]),
        ("submission_org", org),
        ("submission_division", DIVISION),
        ("submission_status", SUBMISSION_STATUS),
        ("submission_platform", system_name(manifest)),
        ("seed", cfg["seed"]),
        ("global_batch_size", glob),
        ("micro_batch_size", micro),
        ("gradient_accumulation_steps", glob // (micro * parallel["dp"])),
        ("max_sequence_length", manifest["workload"]["seq_length"]),
        ("opt_name", "adamw"),
        ("opt_base_learning_rate", cfg["lr"]),
        ("tensor_model_parallel_size", parallel["tp"]),
        ("pipeline_model_parallel_size", parallel["pp"]),
        ("context_parallel_size", parallel["cp"]),
        ("expert_model_parallel_size", parallel["ep"]),
        ("data_parallel_size", parallel["dp"]),  # not an mllog constant; the kit adds it
    ]
    return [MLLogEvent(t_ms, POINT_IN_TIME, key, value) for key, value in values]


def mllog_events(bundle: Bundle, org: str) -> list[MLLogEvent]:
    """The run as mllog events, in time order (see the module docstring for the mapping).

    Args:
        bundle: A bundle from :func:`kit.bundle.verified.read_verified_bundle`.
        org: Value of ``submission_org``.
    """
    steps = _measured_steps(bundle.steps)
    t_init = _ms(_first_time(bundle))
    t_run = _ms(steps[0].t_start) if steps else t_init
    t_stop = _ms(steps[-1].t_end) if steps else t_run
    glob = bundle.manifest["config"]["global_batch_size"]
    events = [MLLogEvent(t_init, INTERVAL_START, "init_start")]
    if bundle.verification_error is not None:
        events.append(MLLogEvent(t_init, POINT_IN_TIME, UNVERIFIED_KEY,
                                 bundle.verification_error))
    events += _config_events(bundle, t_init, org)
    events += [MLLogEvent(t_run, INTERVAL_END, "init_stop"),
               MLLogEvent(t_run, INTERVAL_START, "run_start")]
    for n, s in enumerate(steps):
        before = {"samples_count": n * glob, "step_num": s.step}
        after = {"samples_count": (n + 1) * glob, "step_num": s.step}
        events.append(MLLogEvent(_ms(s.t_start), INTERVAL_START, "block_start", None, before))
        if s.loss is not None:
            events.append(MLLogEvent(_ms(s.t_end), POINT_IN_TIME, "train_loss", s.loss, after))
        events.append(MLLogEvent(_ms(s.t_end), INTERVAL_END, "block_stop", None, after))
    status = bundle.manifest["status"]
    events.append(MLLogEvent(t_stop, INTERVAL_END, "run_stop", None, {
        "status": "success" if status == "ok" else "aborted", "kit_status": status,
    }))
    return events


def mllog_text(bundle: Bundle, org: str) -> str:
    """The run as ``:::MLLOG`` lines, one per event, newline-terminated."""
    return "".join(e.line() + "\n" for e in mllog_events(bundle, org))
