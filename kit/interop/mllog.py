"""A bundle as MLPerf-style ``:::MLLOG {json}`` lines, readable by mlperf_logging's parsers.

Each line is ``:::MLLOG `` and one JSON object with mllog's keys in its order: ``namespace``,
``time_ms``, ``event_type`` (``INTERVAL_START``, ``INTERVAL_END``, ``POINT_IN_TIME``), ``key``,
``value``, ``metadata``. As mllog's own logger does, every event's metadata starts with the
``file`` and ``lineno`` of the code that logged it: here, the line of this module that maps the
bundle onto that event. How a kit run maps onto MLPerf's timeline:

- ``init_start``: the earliest time in the bundle (first telemetry sample or first step);
  warmup steps belong to initialization, as compilation and warmup do in MLPerf.
- ``init_stop`` = ``run_start``: start of the first measured step (earliest rank).
- one ``block_start`` / ``block_stop`` per measured optimizer step (earliest start, latest end
  over ranks) with ``samples_count`` and ``step_num`` metadata, and a ``train_loss`` event at
  its end (mean over the ranks that computed a loss; absent when none did).
- ``run_stop``: end of the last measured step; ``status`` ``success`` when the run ended ``ok``,
  else ``aborted`` with the kit's status beside it.

Configuration events (submission, batch sizes, seed, optimizer, parallel degrees, numerical
precisions, config file) come from the manifest at ``init_start``; keys are mllog's names
(:mod:`kit.interop.mllog_constants`), and the kit's own where mllog has none. There are no
eval events: kit runs train on synthetic tokens and do not evaluate, so MLPerf's
per-benchmark compliance rules do not apply to them.

A bundle that failed verification and is exported only because of ``--allow-unverified`` gets
a ``kit_bundle_unverified`` event right after ``init_start`` whose value says what failed; a
verified bundle has none.
"""

import inspect
import json
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from kit.bundle.reader import Bundle
from kit.errors import KitInputError
from kit.interop import mllog_constants as c
from kit.interop.system_desc import DIVISION, system_name

MLLOG_PREFIX = ":::MLLOG "

_SOURCE_ROOT = str(Path(__file__).parents[2]) + os.sep
"""Trimmed from ``file`` metadata, as mllog's ``root_dir`` is: ``kit/interop/mllog.py``."""

PRECISION = {"fp32": "fp32", "bf16": "bfloat16", "fp16": "fp16"}
"""The kit's dtype names as mllog's precision values (ruleset 6.1.0's list)."""

CONFIG_FILENAME = "manifest.json"
"""The run's configuration file: its ``config`` is the resolved run (workload, platform,
overrides), which the workload YAML alone does not reproduce."""

UNVERIFIED_KEY = "kit_bundle_unverified"
"""The kit's own event marking an export of a bundle that failed verification."""


@dataclass(frozen=True)
class MLLogEvent:
    """One mllog event: what happened, when (unix ms), and its value and metadata."""

    time_ms: int
    event_type: str
    key: str
    value: Any
    metadata: dict[str, Any]

    def line(self) -> str:
        """Render as mllog does: prefix, then the fields in mllog's order."""
        body = {"namespace": "", "time_ms": self.time_ms, "event_type": self.event_type,
                "key": self.key, "value": self.value, "metadata": self.metadata}
        return MLLOG_PREFIX + json.dumps(body, allow_nan=False)


def _event(time_ms: int, event_type: str, key: str, value: Any = None,
           metadata: dict[str, Any] | None = None) -> MLLogEvent:
    """An event whose metadata starts with its caller's ``file`` and ``lineno``, as mllog's."""
    frame = inspect.currentframe()
    caller = frame.f_back if frame is not None else None
    site: dict[str, Any] = {}
    if caller is not None:
        site = {"file": caller.f_code.co_filename.removeprefix(_SOURCE_ROOT),
                "lineno": caller.f_lineno}
    return MLLogEvent(time_ms, event_type, key, value, {**site, **(metadata or {})})


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
    return datetime.fromisoformat(bundle.manifest.created_utc.replace("Z", "+00:00")).timestamp()


def _comm_precision(cfg: dict[str, Any]) -> str:
    """The lowest precision any collective of the run carries, as the kit's engines set them.

    Activations between tensor-, pipeline-, context- and expert-parallel ranks travel in the
    training dtype, and so do the parameters that megatron's distributed optimizer or
    Megatron-FSDP gathers and the gradients DeepSpeed reduces (its default communication dtype
    is the model's). The megatron engine reduces data-parallel gradients in fp32
    (``grad_reduce_in_fp32``), so a megatron run with data parallelism alone communicates in fp32.
    """
    parallel, optim = cfg["parallel"], cfg["optim"]
    model_parallel = any(parallel[d] > 1 for d in ("tp", "pp", "cp", "ep"))
    sharded = optim["dist_optimizer"] or optim["fsdp"]
    if cfg["engine"] == "megatron" and not (model_parallel or sharded):
        return PRECISION["fp32"]
    return PRECISION[cfg["dtype"]]


def _config_events(bundle: Bundle, t_ms: int, org: str) -> list[MLLogEvent]:
    """Submission, hyperparameter, parallelism and precision events from the manifest."""
    manifest = bundle.manifest
    cfg, parallel = manifest.config, manifest.config["parallel"]
    micro, glob = cfg["micro_batch_size"], cfg["global_batch_size"]
    values: list[tuple[str, Any]] = [
        (c.SUBMISSION_BENCHMARK, manifest.workload["name"]),
        (c.SUBMISSION_ORG, org),
        (c.SUBMISSION_DIVISION, DIVISION),
        (c.SUBMISSION_STATUS, c.RESEARCH),
        (c.SUBMISSION_PLATFORM, system_name(manifest)),
        (c.CONFIG_FILENAME, CONFIG_FILENAME),
        (c.SEED, cfg["seed"]),
        (c.GLOBAL_BATCH_SIZE, glob),
        (c.MICRO_BATCH_SIZE, micro),
        (c.GRADIENT_ACCUMULATION_STEPS, glob // (micro * parallel["dp"])),
        (c.MAX_SEQUENCE_LENGTH, manifest.workload["seq_length"]),
        (c.OPT_NAME, c.ADAMW),
        (c.OPT_BASE_LR, cfg["lr"]),
        (c.TENSOR_PARALLELISM, parallel["tp"]),
        (c.PIPELINE_PARALLELISM, parallel["pp"]),
        (c.CONTEXT_PARALLELISM, parallel["cp"]),
        (c.EXPERT_PARALLELISM, parallel["ep"]),
        (c.KIT_DATA_PARALLEL_SIZE, parallel["dp"]),
        (c.LOWEST_NUMERICAL_PRECISION_IN_LINEAR, PRECISION[cfg["dtype"]]),
        (c.LOWEST_NUMERICAL_PRECISION_IN_ATTN, PRECISION[cfg["dtype"]]),
        (c.LOWEST_NUMERICAL_PRECISION_IN_COMM, _comm_precision(cfg)),
    ]
    return [_event(t_ms, c.POINT_IN_TIME, key, value) for key, value in values]


def mllog_events(bundle: Bundle, org: str) -> list[MLLogEvent]:
    """The run as mllog events, in time order (see the module docstring for the mapping).

    Args:
        bundle: A bundle from :func:`kit.bundle.verified.read_verified_bundle`.
        org: Value of ``submission_org``.
    """
    if bundle.manifest.workload.get("family") == "fabric":
        raise KitInputError(f"{bundle.path.name} is a fabric benchmark (collectives, no model); "
                            "MLLOG describes training runs")
    steps = _measured_steps(bundle.steps)
    t_init = _ms(_first_time(bundle))
    t_run = _ms(steps[0].t_start) if steps else t_init
    t_stop = _ms(steps[-1].t_end) if steps else t_run
    glob = bundle.manifest.config["global_batch_size"]
    events = [_event(t_init, c.INTERVAL_START, c.INIT_START)]
    if bundle.verification_error is not None:
        events.append(_event(t_init, c.POINT_IN_TIME, UNVERIFIED_KEY,
                             bundle.verification_error))
    events += _config_events(bundle, t_init, org)
    events += [_event(t_run, c.INTERVAL_END, c.INIT_STOP),
               _event(t_run, c.INTERVAL_START, c.RUN_START)]
    for n, s in enumerate(steps):
        before = {c.SAMPLES_COUNT: n * glob, c.STEP_NUM: s.step}
        after = {c.SAMPLES_COUNT: (n + 1) * glob, c.STEP_NUM: s.step}
        events.append(_event(_ms(s.t_start), c.INTERVAL_START, c.BLOCK_START, None, before))
        if s.loss is not None:
            events.append(_event(_ms(s.t_end), c.POINT_IN_TIME, c.KIT_TRAIN_LOSS, s.loss, after))
        events.append(_event(_ms(s.t_end), c.INTERVAL_END, c.BLOCK_STOP, None, after))
    status = bundle.manifest.status
    events.append(_event(t_stop, c.INTERVAL_END, c.RUN_STOP, None, {
        c.STATUS: c.SUCCESS if status == "ok" else c.ABORTED, c.KIT_STATUS: status,
    }))
    return events


def mllog_text(bundle: Bundle, org: str) -> str:
    """The run as ``:::MLLOG`` lines, one per event, newline-terminated."""
    return "".join(e.line() + "\n" for e in mllog_events(bundle, org))
