"""The published JSON Schemas and schema_version handling."""

import json
import shutil
from pathlib import Path

import jsonschema
import pytest

from kit.bundle.json_schema import SCHEMAS_DIR, bundle_json_schemas, render
from kit.bundle.schema import SCHEMA_VERSION, STEPS_SCHEMA, SUMMARY_KEYS, Manifest, MetricsFile
from kit.bundle.telemetry_fields import TELEMETRY_SCHEMA

from .conftest import REPO
from .test_bundle_archive import one_line_error, rehash, write_archive

RECORDED = sorted((REPO / "tests/data/bundles/telemetry").iterdir())


def validator(name: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMAS_DIR / name).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_committed_schemas_equal_what_the_models_generate():
    generated = bundle_json_schemas()
    assert sorted(p.name for p in SCHEMAS_DIR.glob("*.json")) == sorted(generated)
    for name, schema in generated.items():
        assert (SCHEMAS_DIR / name).read_text() == render(schema), (
            f"{name} is stale: run python -m kit.bundle.json_schema"
        )


def test_schemas_accept_recorded_and_fresh_bundles(cpu_bundle):
    assert len(RECORDED) == 2
    for bundle in [*RECORDED, cpu_bundle]:
        for name in ("manifest", "metrics"):
            document = json.loads((bundle / f"{name}.json").read_text())
            validator(f"{name}.schema.json").validate(document)


def test_schemas_reject_what_the_reader_rejects():
    manifest = json.loads((RECORDED[0] / "manifest.json").read_text())
    metrics = json.loads((RECORDED[0] / "metrics.json").read_text())
    bad = [
        ("manifest.schema.json", {**manifest, "status": "mostly fine"}),
        ("manifest.schema.json", {**manifest, "schema_version": SCHEMA_VERSION + 1}),
        ("manifest.schema.json", {k: v for k, v in manifest.items() if k != "schema_version"}),
        ("manifest.schema.json", {**manifest, "telemetry_sources": {"power_mw": {
            "source": "nvml", "period_ms": 20, "reason": None}}}),
        ("metrics.schema.json", {**metrics, "summary": {
            k: v for k, v in metrics["summary"].items() if k != "mfu"}}),
        ("metrics.schema.json", {**metrics, "summary": {**metrics["summary"], "mfu": "high"}}),
    ]
    for name, document in bad:
        assert not validator(name).is_valid(document), document


@pytest.fixture
def newer(cpu_bundle, tmp_path) -> Path:
    bundle = shutil.copytree(cpu_bundle, tmp_path / cpu_bundle.name)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["schema_version"] = SCHEMA_VERSION + 1
    manifest["a_field_from_the_future"] = True
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    rehash(bundle)
    return bundle


@pytest.mark.parametrize("command", ["verify", "show", "pack"])
def test_a_newer_schema_version_is_refused_in_one_line(cli, newer, command):
    line = one_line_error(cli("bundle", command, str(newer)))
    assert f"schema_version {SCHEMA_VERSION + 1}" in line and "upgrade charllm-kit" in line


def test_an_archive_of_a_newer_bundle_is_refused_before_extraction(cli, tmp_path):
    archive = write_archive(tmp_path / "future.tar.gz", [], schema_version=SCHEMA_VERSION + 1)
    line = one_line_error(cli("bundle", "unpack", str(archive), "-o", str(tmp_path / "in")))
    assert "upgrade charllm-kit" in line and not (tmp_path / "in").exists()


def test_the_format_doc_names_every_field_and_column():
    doc = (REPO / "docs/bundle-format.md").read_text()
    names = [*Manifest.model_fields, *MetricsFile.model_fields, *SUMMARY_KEYS,
             *STEPS_SCHEMA.names, *TELEMETRY_SCHEMA.names]
    missing = [n for n in names if f"`{n}`" not in doc]
    assert not missing, f"docs/bundle-format.md does not describe {missing}"
