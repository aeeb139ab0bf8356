"""Where commands write: never into a bundle, never through a file; one line and exit 2."""

import shutil

import pytest

from kit.bundle.verify import verify_bundle

from .conftest import REPO

RECORDED = REPO / "tests/data/bundles/telemetry/20261122T094842Z-gpt3-1.3b-h200-bceb8a"
"""A real GPU bundle that verifies (the H100 one does not: its PCIe counter wrapped, issue 19)."""


@pytest.fixture
def bundle(tmp_path):
    copy = tmp_path / RECORDED.name
    shutil.copytree(RECORDED, copy)
    return copy


@pytest.mark.parametrize("command", [
    ["report", "{b}", "-o", "{b}/report.html"],
    ["report", "{b}", "-o", "{b}/manifest.json"],
    ["bundle", "export-mllog", "{b}", "-o", "{b}/metrics.json"],
    ["bundle", "system-desc", "{b}", "-o", "{b}/logs/system.json"],
    ["run", "gpt3-tiny", "--out", "{b}"],
])
def test_nothing_is_written_into_a_bundle(cli, bundle, command):
    before = {p: p.read_bytes() for p in bundle.rglob("*") if p.is_file()}
    r = cli(*[a.format(b=bundle) for a in command], timeout=120)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and f"inside the bundle {bundle}" in lines[0]
    assert {p: p.read_bytes() for p in bundle.rglob("*") if p.is_file()} == before
    verify_bundle(bundle)


def test_a_target_under_a_file_is_one_line(cli, bundle, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("kept\n")
    for command in (["report", str(bundle), "-o", f"{blocker}/r.html"],
                    ["bundle", "export-mllog", str(bundle), "-o", f"{blocker}/x.log"],
                    ["report", str(bundle), "--markdown", "-o", f"{tmp_path}/a.md"]):
        if "--markdown" in command:
            (tmp_path / "a_figures").write_text("a file where the figures folder goes\n")
        r = cli(*command, timeout=120)
        assert r.returncode == 2 and "is not a directory" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1
    assert blocker.read_text() == "kept\n"
