"""Result bundles on real files: write, read, verify, refuse tampering, show."""

# ruff: noqa: D103  (test names say what they check)

import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from kit.analysis.show import format_bundle
from kit.bundle import (
    STEPS_SCHEMA,
    SUMMARY_KEYS,
    TELEMETRY_SCHEMA,
    BundleStaging,
    FieldSource,
    Manifest,
    MetricsFile,
    NodeInventory,
    RankRecord,
    concat_chunks,
    new_bundle_id,
    read_bundle,
    verify_bundle,
)
from kit.config.platform import PlatformSpec
from kit.config.run import OptimizationConfig, ParallelConfig, RunConfig
from kit.config.workload import ScalingRule, WorkloadSpec
from kit.errors import BundleError, KitInputError
from kit.plan.resolve import apply_scaling

BUNDLE_ID = "20261122T091500Z-gpt3-tiny-cpu-abc123"


def run_config() -> RunConfig:
    """A two-rank pipeline run of a workload the cpu platform scales down."""
    original = WorkloadSpec(
        name="gpt3-tiny",
        family="gpt3",
        num_layers=4,
        hidden_size=64,
        num_attention_heads=4,
        ffn_hidden_size=256,
        seq_length=32,
        vocab_size=128,
        activation="gelu",
        normalization="layernorm",
        position_embedding="learned_absolute",
        global_batch_size=4,
    )
    platform = PlatformSpec(
        name="cpu",
        vendor="cpu",
        device_name="host CPU",
        dtype="fp32",
        comm_backend="gloo",
        telemetry=["host"],
        scaling={"gpt3-tiny": ScalingRule(reason="CI time", set={"num_layers": 2})},
    )
    workload, scaling = apply_scaling(original, platform)
    return RunConfig(
        workload=workload,
        scaling=scaling,
        platform=platform,
        parallel=ParallelConfig(pp=2),
        optim=OptimizationConfig(),
        micro_batch_size=1,
        global_batch_size=4,
        dtype="fp32",
        steps=2,
        warmup=1,
        telemetry_interval_ms=20,
    )


def make_manifest(**changes: object) -> Manifest:
    cfg = run_config()
    data: dict[str, object] = dict(
        kit_version="0.1.0",
        git_commit=None,
        # fixed: two manifests made a second apart must compare equal (a busy host's fixture
        # and test body can straddle a second)
        created_utc="2026-11-22T09:15:00Z",
        status="ok",
        error=None,
        command=["charllm-kit", "run", "gpt3-tiny", "--platform", "cpu", "--pp", "2"],
        config=cfg.model_dump(mode="json"),
        workload={
            **cfg.workload.model_dump(mode="json"),
            "scaling": cfg.scaling.model_dump(mode="json"),
        },
        platform=cfg.platform.model_dump(mode="json"),
        inventory=[
            NodeInventory(
                host="ci",
                cpu="AMD EPYC",
                cpu_count=2,
                memory_bytes=24 * 2**30,
                gpus=[],
                driver=None,
                cuda=None,
                rocm=None,
                python="3.11.7",
                torch="2.6.0",
                engine_versions={"megatron-core": "0.16.0"},
            )
        ],
        telemetry_sources={
            "cpu_util_pct": FieldSource(source="host:/proc/stat", period_ms=20.0, reason=None),
            "power_w": FieldSource(source=None, period_ms=None, reason="no GPU on cpu"),
        },
        ranks=[
            RankRecord(
                rank=r,
                node=0,
                local_rank=r,
                stage=r,
                tp_rank=0,
                pp_rank=r,
                dp_rank=0,
                status="ok",
                error=None,
            )
            for r in range(2)
        ],
    )
    data.update(changes)
    return Manifest.model_validate(data)


def make_metrics() -> MetricsFile:
    summary: dict[str, float | int | None] = dict.fromkeys(SUMMARY_KEYS)
    summary.update(
        step_time_s=0.125, tokens_per_s=1024.0, tflops_per_gpu=0.5, mfu=0.41, world_size=2
    )
    return MetricsFile(
        summary=summary,
        per_rank=[{"rank": r, "stage": r, "step_time_s": 0.125} for r in range(2)],
        notes=["energy: not measurable on cpu"],
    )


def make_steps() -> pa.Table:
    rows = [
        {
            "step": s,
            "rank": r,
            "phase": "warmup" if s == 0 else "measured",
            "t_start": 1e9 + s,
            "t_end": 1e9 + s + 0.125,
            "tokens": 128,
            "loss": 5.0 - s if r == 1 else None,
            "stage": r,
        }
        for s in range(3)
        for r in range(2)
    ]
    return pa.Table.from_pylist(rows, schema=STEPS_SCHEMA)


def host_rows(t0: float) -> pa.Table:
    rows = [
        {
            "t": t0 + i * 0.02,
            "node": 0,
            "device": None,
            "source": "host",
            "cpu_util_pct": 90.0,
            "host_mem_used_bytes": 2**30,
        }
        for i in range(2)
    ]
    return pa.Table.from_pylist(rows, schema=TELEMETRY_SCHEMA)


def stage(out: Path) -> BundleStaging:
    """A staging directory as a run leaves it: rank logs and two telemetry chunks."""
    staging = BundleStaging(out, BUNDLE_ID)
    for r in range(2):
        (staging.logs_dir / f"rank{r}.log").write_text(f"rank {r} trained\n")
    pq.write_table(host_rows(1e9 + 0.04), staging.chunks_dir / "node0-000001.parquet")
    pq.write_table(host_rows(1e9), staging.chunks_dir / "node0-000000.parquet")
    return staging


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    staging = stage(tmp_path)
    telemetry = concat_chunks(staging.chunks_dir)
    return staging.finalize(make_manifest(), make_metrics(), make_steps(), telemetry)


def rewrite(bundle: Path, rel: str, content: bytes) -> None:
    """Change a file and fix its SHA256SUMS line, so only later checks can catch it."""
    (bundle / rel).write_bytes(content)
    digest = hashlib.sha256(content).hexdigest()
    sums = bundle / "SHA256SUMS"
    lines = sums.read_text().splitlines()
    sums.write_text(
        "".join(f"{digest}  {rel}\n" if ln.endswith(f"  {rel}") else ln + "\n" for ln in lines)
    )


def refused(match: str, func: Callable[..., object], *args: object) -> BundleError:
    """Call ``func`` expecting a one-line BundleError that matches ``match``."""
    with pytest.raises(BundleError, match=match) as info:
        func(*args)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, KitInputError)
    return info.value


EXPECTED_FILES = [
    "logs/rank0.log",
    "logs/rank1.log",
    "manifest.json",
    "metrics.json",
    "steps.parquet",
    "telemetry.parquet",
]


def test_finalize_publishes_the_bundle_and_removes_staging(tmp_path: Path, bundle: Path) -> None:
    assert bundle == tmp_path / BUNDLE_ID
    assert [p.name for p in tmp_path.iterdir()] == [BUNDLE_ID]
    files = sorted(p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file())
    assert files == sorted([*EXPECTED_FILES, "SHA256SUMS"])


def test_sha256sums_lists_every_file_in_sha256sum_format(bundle: Path) -> None:
    expected = "".join(
        f"{hashlib.sha256((bundle / rel).read_bytes()).hexdigest()}  {rel}\n"
        for rel in EXPECTED_FILES
    )
    assert (bundle / "SHA256SUMS").read_text() == expected


def test_round_trip(bundle: Path) -> None:
    read = read_bundle(bundle)
    assert read.path == bundle
    assert read.manifest == make_manifest()
    assert read.manifest.workload["scaling"]["rule"]["set"] == {"num_layers": 2}
    assert read.metrics == make_metrics()
    assert read.steps.equals(make_steps())
    assert read.telemetry.schema.equals(TELEMETRY_SCHEMA)
    assert read.telemetry.column("t").to_pylist() == [1e9, 1e9 + 0.02, 1e9 + 0.04, 1e9 + 0.06]
    assert read.telemetry.column("power_w").null_count == 4


def test_verify_passes_on_an_untouched_bundle(bundle: Path) -> None:
    assert verify_bundle(bundle) == EXPECTED_FILES


def test_changed_byte_is_a_checksum_mismatch(bundle: Path) -> None:
    data = bytearray((bundle / "metrics.json").read_bytes())
    data[10] ^= 1
    (bundle / "metrics.json").write_bytes(bytes(data))
    refused("checksum mismatch: metrics.json", verify_bundle, bundle)


def test_deleted_log_is_missing(bundle: Path) -> None:
    (bundle / "logs" / "rank0.log").unlink()
    refused("missing file logs/rank0.log", verify_bundle, bundle)


def test_extra_file_is_unlisted(bundle: Path) -> None:
    (bundle / "foo.txt").write_text("hello\n")
    refused("unlisted file: foo.txt", verify_bundle, bundle)


def test_missing_sha256sums_is_refused(bundle: Path) -> None:
    (bundle / "SHA256SUMS").unlink()
    refused("SHA256SUMS is missing", verify_bundle, bundle)


def test_sums_pointing_outside_the_bundle_are_refused(bundle: Path) -> None:
    with (bundle / "SHA256SUMS").open("a") as f:
        f.write(f"{'0' * 64}  ../outside.txt\n")
    refused(r"SHA256SUMS line 7 lists '\.\./outside\.txt'", verify_bundle, bundle)


def test_symlink_in_bundle_is_refused(tmp_path: Path, bundle: Path) -> None:
    (tmp_path / "secret").write_text("x")
    (bundle / "logs" / "link.log").symlink_to(tmp_path / "secret")
    refused("symlink logs/link.log", verify_bundle, bundle)


def test_manifest_failing_its_model_is_caught_by_the_schema_check(bundle: Path) -> None:
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["status"] = "weird"
    rewrite(bundle, "manifest.json", json.dumps(manifest).encode())
    refused(r"manifest\.json fails the schema: status: ", verify_bundle, bundle)
    refused(r"manifest\.json fails the schema: status: ", read_bundle, bundle)


def test_metrics_summary_lacking_a_key_is_refused(bundle: Path) -> None:
    metrics = json.loads((bundle / "metrics.json").read_text())
    del metrics["summary"]["mfu"]
    rewrite(bundle, "metrics.json", json.dumps(metrics).encode())
    refused(r"metrics\.json fails the schema: summary: .*missing \['mfu'\]", verify_bundle, bundle)


def test_parquet_of_another_schema_is_refused(bundle: Path) -> None:
    sink = pa.BufferOutputStream()
    pq.write_table(make_steps().drop_columns(["loss"]), sink)
    rewrite(bundle, "steps.parquet", sink.getvalue().to_pybytes())
    refused(
        r"steps\.parquet does not match schema v1: missing columns \['loss'\]",
        verify_bundle,
        bundle,
    )


def test_telemetry_column_of_another_type_is_refused(bundle: Path) -> None:
    table = pq.read_table(bundle / "telemetry.parquet")
    i = table.schema.get_field_index("throttle")
    table = table.set_column(i, "throttle", table.column(i).cast(pa.int32()))
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    rewrite(bundle, "telemetry.parquet", sink.getvalue().to_pybytes())
    refused(r"telemetry\.parquet .*column throttle is int32, expected int64", verify_bundle, bundle)


def test_newer_schema_version_asks_for_an_upgrade(bundle: Path) -> None:
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["schema_version"] = 2
    manifest["a_field_from_the_future"] = True
    rewrite(bundle, "manifest.json", json.dumps(manifest).encode())
    message = f"bundle {bundle} has schema_version 2; this kit reads up to 1: upgrade charllm-kit"
    refused(re.escape(message), read_bundle, bundle)
    refused(re.escape(message), verify_bundle, bundle)


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"{not json", r"manifest\.json is not valid JSON"),
        (b'{"schema_version": NaN}', r"manifest\.json is not valid JSON \(NaN"),
        (b"[1, 2]", r"manifest\.json is not a JSON object"),
        (b'{"schema_version": "1"}', r"manifest\.json has no integer schema_version"),
    ],
)
def test_unparsable_manifest_is_refused(bundle: Path, content: bytes, match: str) -> None:
    (bundle / "manifest.json").write_bytes(content)
    refused(match, read_bundle, bundle)


def test_missing_bundle_directory_is_refused(tmp_path: Path) -> None:
    refused("no bundle at .*: the directory does not exist", read_bundle, tmp_path / "nope")


def test_missing_manifest_is_refused(bundle: Path) -> None:
    (bundle / "manifest.json").unlink()
    refused(r"manifest\.json is missing", read_bundle, bundle)


def test_unfinished_staging_directory_is_not_a_bundle(tmp_path: Path) -> None:
    staging = stage(tmp_path)
    assert staging.path == tmp_path / f".{BUNDLE_ID}.partial"
    assert not (tmp_path / BUNDLE_ID).exists()
    refused("is an unfinished bundle", read_bundle, staging.path)
    refused("is an unfinished bundle", verify_bundle, staging.path)


def test_tables_load_lazily_and_refuse_corruption_when_used(bundle: Path) -> None:
    (bundle / "steps.parquet").write_bytes(b"not parquet")
    read = read_bundle(bundle)
    refused(r"steps\.parquet is not readable parquet", lambda: read.steps)


def test_finalize_refuses_tables_it_cannot_write_faithfully(tmp_path: Path) -> None:
    staging = stage(tmp_path)
    wrong = make_steps().drop_columns(["stage"])
    with pytest.raises(ValueError, match="steps.parquet: table schema"):
        staging.finalize(make_manifest(), make_metrics(), wrong, TELEMETRY_SCHEMA.empty_table())
    nulls = make_steps().set_column(0, STEPS_SCHEMA.field("step"), pa.nulls(6, pa.int32()))
    with pytest.raises(ValueError, match="column step holds nulls"):
        staging.finalize(make_manifest(), make_metrics(), nulls, TELEMETRY_SCHEMA.empty_table())
    nan = make_metrics().model_copy(update={"per_rank": [{"rank": 0, "mfu": float("nan")}]})
    with pytest.raises(ValueError, match="metrics.json: Out of range float"):
        staging.finalize(make_manifest(), nan, make_steps(), TELEMETRY_SCHEMA.empty_table())
    assert not (tmp_path / BUNDLE_ID).exists()


def test_staging_refuses_an_existing_bundle_id(tmp_path: Path, bundle: Path) -> None:
    with pytest.raises(FileExistsError):
        BundleStaging(tmp_path, BUNDLE_ID)


def test_concat_chunks_of_nothing_is_an_empty_telemetry_table(tmp_path: Path) -> None:
    table = concat_chunks(tmp_path)
    assert table.num_rows == 0
    assert table.schema.equals(TELEMETRY_SCHEMA)


def test_concat_chunks_refuses_a_chunk_of_another_schema(tmp_path: Path) -> None:
    pq.write_table(pa.table({"t": [1.0]}), tmp_path / "node0-000000.parquet")
    refused(
        "telemetry chunk .*node0-000000.parquet does not have the telemetry schema",
        concat_chunks,
        tmp_path,
    )


def test_new_bundle_id_is_sortable_and_unique() -> None:
    first, second = new_bundle_id("gpt3-tiny@cpu", "cpu"), new_bundle_id("gpt3-tiny@cpu", "cpu")
    assert re.fullmatch(r"\d{8}T\d{6}Z-gpt3-tiny@cpu-cpu-[0-9a-f]{6}", first)
    assert first != second
    with pytest.raises(ValueError, match="cannot be part of a bundle id"):
        new_bundle_id("../etc", "cpu")


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"status": "ok", "error": "boom"}, "error must be null when status is ok"),
        ({"created_utc": "2026-11-22T10:15:00+01:00"}, "must be UTC"),
        (
            {
                "telemetry_sources": {
                    "power_mw": {"source": "nvml", "period_ms": 20.0, "reason": None}
                }
            },
            r"unknown telemetry fields",
        ),
        (
            {"telemetry_sources": {"power_w": {"source": None, "period_ms": None, "reason": None}}},
            "needs a reason",
        ),
        ({"workload": {"name": "gpt3-tiny"}}, "must carry 'scaling'"),
        ({"extra": 1}, "Extra inputs are not permitted"),
    ],
)
def test_manifest_model_rejects_inconsistent_records(changes: dict, match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        make_manifest(**changes)


def test_metrics_summary_refuses_nan() -> None:
    summary = make_metrics().summary | {"mfu": float("nan")}
    with pytest.raises(ValidationError, match="finite number"):
        MetricsFile(summary=summary)


def test_show_summarizes_status_layout_and_metrics(bundle: Path) -> None:
    text = format_bundle(read_bundle(bundle))
    assert re.search(r"^status\s+ok$", text, re.M)
    assert not re.search(r"^error", text, re.M)
    assert re.search(
        r"^workload\s+gpt3-tiny@cpu "
        r"\(scaled from gpt3-tiny by the cpu rule: num_layers=2; CI time\)$",
        text,
        re.M,
    )
    assert re.search(r"^platform\s+cpu$", text, re.M)
    assert re.search(r"^layout\s+tp1 pp2 dp1 cp1 ep1$", text, re.M)
    assert re.search(r"^world size\s+2$", text, re.M)
    assert re.search(r"^mfu\s+41\.0 %$", text, re.M)
    assert re.search(r"^tokens_per_s\s+1,024$", text, re.M)
    assert re.search(r"^step_time_s \(median step\)\s+0\.125$", text, re.M)
    assert re.search(r"^energy_j_per_token\s+n/a$", text, re.M)


def test_show_names_the_error_of_a_failed_run(tmp_path: Path) -> None:
    staging = stage(tmp_path)
    manifest = make_manifest(status="oom", error="CUDA out of memory on rank 1")
    path = staging.finalize(manifest, make_metrics(), make_steps(), TELEMETRY_SCHEMA.empty_table())
    text = format_bundle(read_bundle(path))
    assert re.search(r"^status\s+oom$", text, re.M)
    assert re.search(r"^error\s+CUDA out of memory on rank 1$", text, re.M)
