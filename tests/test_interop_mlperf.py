"""`bundle export-mllog` and `bundle system-desc` on a real CPU run and a recorded H100 run.

MLCommons' own checkers on these exports: ``test_interop_mlperf_checkers.py``.
"""

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from .conftest import REPO, why_failed
from .test_bundle_archive import H100, rehash

pytestmark = pytest.mark.timeout(300)

PREFIX = ":::MLLOG "
PARALLEL_KEYS = {"tensor_parallelism": "tp", "pipeline_parallelism": "pp",
                 "context_parallelism": "cp", "expert_parallelism": "ep",
                 "data_parallel_size": "dp"}
PRECISION_KEYS = ["lowest_numerical_precision_in_linear", "lowest_numerical_precision_in_attn",
                  "lowest_numerical_precision_in_comm"]


def parse_mllog(text: str) -> list[dict]:
    """Parse as mlperf_logging does: each line is the prefix and one JSON object."""
    events = []
    for line in text.splitlines():
        assert line.startswith(PREFIX), line
        event = json.loads(line[len(PREFIX):])
        assert list(event) == ["namespace", "time_ms", "event_type", "key", "value", "metadata"]
        events.append(event)
    return events


def call_site(event: dict) -> str:
    """The source line an event's ``file``/``lineno`` metadata names (mllog's first two keys)."""
    assert list(event["metadata"])[:2] == ["file", "lineno"]
    lines = (REPO / event["metadata"]["file"]).read_text().splitlines()
    return lines[event["metadata"]["lineno"] - 1]


def points(events: list[dict]) -> dict:
    return {e["key"]: e["value"] for e in events if e["event_type"] == "POINT_IN_TIME"}


def export(cli, bundle: Path, *extra: str) -> list[dict]:
    r = cli("bundle", "export-mllog", str(bundle), *extra)
    assert r.returncode == 0, why_failed(r)
    return parse_mllog(r.stdout)


def test_mllog_of_a_cpu_run_carries_its_layout_and_steps(cli, cpu_bundle, tmp_path):
    out = tmp_path / "result_0.txt"
    r = cli("bundle", "export-mllog", str(cpu_bundle), "-o", str(out), "--org", "ExampleLab")
    assert r.returncode == 0 and r.stdout == ""
    events = parse_mllog(out.read_text())
    manifest = json.loads((cpu_bundle / "manifest.json").read_text())
    values = points(events)
    for key, degree in PARALLEL_KEYS.items():
        assert values[key] == manifest["config"]["parallel"][degree]
    assert values["tensor_parallelism"] == 2
    assert values["micro_batch_size"] == manifest["config"]["micro_batch_size"]
    assert values["global_batch_size"] == manifest["config"]["global_batch_size"]
    assert values["seed"] == manifest["config"]["seed"]
    assert values["submission_org"] == "ExampleLab"
    assert values["submission_benchmark"] == "gpt3-tiny"
    assert values["config_filename"] == "manifest.json"
    assert [values[k] for k in PRECISION_KEYS] == ["fp32"] * 3  # the cpu platform trains in fp32
    for event in events:  # each names the exporter line that made it, as mllog names its caller
        assert event["metadata"]["file"] == "kit/interop/mllog.py"
        assert "_event(" in call_site(event)
    assert "RUN_STOP" in call_site(events[-1])
    keys = [e["key"] for e in events]
    order = ["init_start", "init_stop", "run_start", "block_start", "block_stop", "run_stop"]
    assert [keys.index(k) for k in order] == sorted(keys.index(k) for k in order)
    assert keys.count("block_start") == keys.count("block_stop") == manifest["config"]["steps"]
    times = [e["time_ms"] for e in events]
    assert times == sorted(times)

    steps = pq.read_table(cpu_bundle / "steps.parquet").to_pylist()
    measured = [s for s in steps if s["phase"] == "measured"]
    losses = [e for e in events if e["key"] == "train_loss"]
    for event in losses:
        rows = [s for s in measured if s["step"] == event["metadata"]["step_num"]]
        assert event["value"] == sum(s["loss"] for s in rows) / len(rows)
        assert event["time_ms"] == round(max(s["t_end"] for s in rows) * 1000)
    run_start = next(e for e in events if e["key"] == "run_start")
    assert run_start["time_ms"] == round(min(s["t_start"] for s in measured) * 1000)
    assert events[-1]["key"] == "run_stop" and events[-1]["metadata"]["status"] == "success"


def test_mllog_marks_a_failed_run_aborted(cli, cpu_bundle, tmp_path):
    bundle = shutil.copytree(cpu_bundle, tmp_path / cpu_bundle.name)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest.update(status="oom", error="rank 1: CUDA out of memory")
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    rehash(bundle)
    stop = export(cli, bundle)[-1]
    assert stop["key"] == "run_stop"
    assert list(stop["metadata"]) == ["file", "lineno", "status", "kit_status"]
    assert stop["metadata"]["status"] == "aborted" and stop["metadata"]["kit_status"] == "oom"


def test_mllog_of_the_recorded_h100_run(cli):
    events = export(cli, H100)
    blocks = [e for e in events if e["key"] == "block_stop"]
    assert len(blocks) == 20 and blocks[-1]["metadata"]["samples_count"] == 20 * 16
    assert sum(e["key"] == "train_loss" for e in events) == 20
    # bf16 in linear layers and attention; one GPU with megatron's fp32 gradient reduction.
    assert [points(events)[k] for k in PRECISION_KEYS] == ["bfloat16", "bfloat16", "fp32"]


@pytest.mark.parametrize("change", [{"optim": {"dist_optimizer": True}}, {"engine": "deepspeed"},
                                    {"parallel": {"tp": 2, "dp": 1}}])
def test_mllog_comm_precision_follows_what_travels_in_bf16(cli, tmp_path, change):
    """Gathered bf16 parameters, DeepSpeed's bf16 gradients, tensor-parallel activations."""
    bundle = shutil.copytree(H100, tmp_path / H100.name)
    manifest = json.loads((bundle / "manifest.json").read_text())
    for key, value in change.items():
        config = manifest["config"]
        config[key] = {**config[key], **value} if isinstance(value, dict) else value
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    rehash(bundle)
    assert points(export(cli, bundle))["lowest_numerical_precision_in_comm"] == "bfloat16"


def test_system_desc_of_the_recorded_h100_run(cli, tmp_path):
    out = tmp_path / "h100_n1.json"
    r = cli("bundle", "system-desc", str(H100), "-o", str(out), "--org", "ExampleLab")
    assert r.returncode == 0, why_failed(r)
    desc = json.loads(out.read_text())
    assert desc["submitter"] == "ExampleLab" and desc["system_name"] == "h100_n1"
    assert desc["accelerator_model_name"] == "NVIDIA H100 80GB HBM3"
    assert desc["accelerators_per_node"] == "1" and desc["number_of_nodes"] == "1"
    assert desc["host_processor_vcpu_count"].isdigit()
    assert desc["accelerator_memory_capacity"] == "80 GiB"
    assert desc["framework"].startswith("megatron-core 0.19.2, PyTorch 2.11.0")
    assert desc["operating_system"] == ""  # not recorded: stated as unknown, not guessed


def test_system_desc_of_a_cpu_run(cli, cpu_bundle):
    r = cli("bundle", "system-desc", str(cpu_bundle))
    assert r.returncode == 0, why_failed(r)
    desc = json.loads(r.stdout)
    assert desc["accelerators_per_node"] == "0" and desc["accelerator_model_name"] == ""
    assert int(desc["host_processor_vcpu_count"]) > 0 and desc["system_name"] == "cpu_n1"
    assert all(isinstance(v, str) for k, v in desc.items() if k != "other_software_stack")
    # the engine the run trained with, not every engine installed beside it
    assert desc["framework"].startswith("megatron-core ") and "deepspeed" not in desc["framework"]
    assert "deepspeed" not in desc["other_software_stack"]


def test_system_desc_names_the_engine_the_run_used(cli, cpu_bundle, tmp_path):
    bundle = shutil.copytree(cpu_bundle, tmp_path / cpu_bundle.name)
    manifest = json.loads((bundle / "manifest.json").read_text())
    versions = manifest["inventory"][0]["engine_versions"]
    assert {"megatron-core", "deepspeed"} <= set(versions)  # both installed on this host
    manifest["config"]["engine"] = "deepspeed"
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    rehash(bundle)
    r = cli("bundle", "system-desc", str(bundle))
    assert r.returncode == 0, why_failed(r)
    desc = json.loads(r.stdout)
    assert desc["framework"].startswith(f"deepspeed {versions['deepspeed']}, PyTorch ")
    assert "megatron-core" not in desc["framework"] + json.dumps(desc["other_software_stack"])
