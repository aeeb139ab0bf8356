"""Commands that turn bundles into claims verify them first: `compare`, `report`,
`bundle export-mllog` and `bundle system-desc` refuse a tampered bundle (exit 2, one line naming
it) and, with --allow-unverified, use it and mark it in what they write."""

import csv
import io
import json
import re
import shutil
from pathlib import Path

import pytest

from .conftest import why_failed
from .test_interop_mlperf import parse_mllog

pytestmark = pytest.mark.training  # every test here starts ranks (pyproject.toml: tiers)

# The session's cpu_bundle run (about a minute on 2 cores) when this module runs alone.
SETUP_TIMEOUT = 420

COMMANDS = {
    "compare": lambda b, out: ["compare", str(b)],
    "report": lambda b, out: ["report", str(b), "-o", str(out / "report.html")],
    "export-mllog": lambda b, out: ["bundle", "export-mllog", str(b)],
    "system-desc": lambda b, out: ["bundle", "system-desc", str(b)],
}


@pytest.fixture(scope="module")
def tampered(cpu_bundle, tmp_path_factory) -> tuple[Path, float]:
    """A copy of the CPU run with one digit of tokens_per_s in metrics.json changed, and the
    edited figure."""
    dest = shutil.copytree(cpu_bundle, tmp_path_factory.mktemp("tampered") / cpu_bundle.name)
    text = (dest / "metrics.json").read_text()
    match = re.search(r'"tokens_per_s": (\d)', text)
    digit = "1" if match.group(1) != "1" else "2"
    (dest / "metrics.json").write_text(text[:match.start(1)] + digit + text[match.end(1):])
    return dest, json.loads((dest / "metrics.json").read_text())["summary"]["tokens_per_s"]


def one_line_error(r) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and r.stdout == "" and len(lines) == 1, r.stderr
    return lines[0]


@pytest.mark.timeout(SETUP_TIMEOUT)
@pytest.mark.parametrize("command", COMMANDS)
def test_tampered_bundle_is_refused_naming_it(cli, tampered, tmp_path, command):
    bundle, _ = tampered
    r = cli("bundle", "verify", str(bundle))
    assert r.returncode == 2
    line = one_line_error(cli(*COMMANDS[command](bundle, tmp_path)))
    assert f"bundle {bundle}: checksum mismatch: metrics.json" in line
    assert "--allow-unverified" in line
    assert list(tmp_path.iterdir()) == []  # the report was not written


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_tampered_baseline_is_refused(cli, cpu_bundle, tampered):
    bundle, _ = tampered
    line = one_line_error(cli("compare", str(cpu_bundle), "--baseline", str(bundle)))
    assert f"bundle {bundle}: checksum mismatch" in line


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_compare_uses_an_allowed_unverified_bundle_apart_and_marked(cli, cpu_bundle, tampered):
    bundle, edited = tampered
    args = ["compare", str(cpu_bundle), str(bundle), "--allow-unverified"]
    r = cli(*args, "--format", "json")
    assert r.returncode == 0, why_failed(r)
    result = json.loads(r.stdout)
    good, bad = result["groups"]  # same configuration, but never one group
    assert good["verified"] is True and good["bundles"] == [str(cpu_bundle)]
    assert bad["verified"] is False and bad["label"].endswith("[unverified]")
    assert bad["metrics"]["tokens_per_s"]["median"] == edited != good["metrics"][
        "tokens_per_s"]["median"]
    check = result["checks"][0]
    assert check["kind"] == "unverified" and bundle.name in check["message"]
    assert "checksum mismatch: metrics.json" in check["message"]

    r = cli(*args)
    assert r.returncode == 0, why_failed(r)
    assert "UNVERIFIED (1 run)" in r.stdout and "[unverified] " + bundle.name in r.stdout

    r = cli(*args, "--format", "csv")
    assert r.returncode == 0, why_failed(r)
    verified = {(row["group"], row["verified"]) for row in csv.DictReader(io.StringIO(r.stdout))}
    assert verified == {(good["label"], "true"), (bad["label"], "false")}
    assert "comparability: [unverified]" in r.stderr


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_report_of_an_allowed_unverified_bundle_warns(cli, tampered, tmp_path):
    bundle, _ = tampered
    out = tmp_path / "report.html"
    r = cli("report", str(bundle), "-o", str(out), "--allow-unverified")
    assert r.returncode == 0, why_failed(r)
    text = out.read_text()
    warning = re.search(r'<p class="note" id="unverified">([^<]*)</p>', text).group(1)
    assert "failed verification" in warning and bundle.name in warning
    assert "<dt>verified</dt><dd>NO: bundle " in text and "checksum mismatch" in text
    assert "UNVERIFIED (1 run)" in text


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_exports_of_an_allowed_unverified_bundle_say_so(cli, cpu_bundle, tampered):
    bundle, _ = tampered
    r = cli("bundle", "export-mllog", str(bundle), "--allow-unverified")
    assert r.returncode == 0, why_failed(r)
    events = parse_mllog(r.stdout)
    assert [e["key"] for e in events[:2]] == ["init_start", "kit_bundle_unverified"]
    assert "checksum mismatch: metrics.json" in events[1]["value"]
    r = cli("bundle", "export-mllog", str(cpu_bundle))
    assert r.returncode == 0 and "kit_bundle_unverified" not in r.stdout

    r = cli("bundle", "system-desc", str(bundle), "--allow-unverified")
    assert r.returncode == 0, why_failed(r)
    notes = json.loads(r.stdout)["sw_notes"]
    assert "UNVERIFIED bundle" in notes and "checksum mismatch: metrics.json" in notes
