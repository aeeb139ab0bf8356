"""Text and numbers from a hostile sender: what the kit prints stays on its lines, its Markdown
holds no link a reader did not expect, and numbers beyond any machine are refused in one line.

Terminals, tables, CSV and Markdown get every bundle or YAML string through kit.neutralize: a
control character (escape sequences, a window title, a line break, a tab) is written as an
escape, so no string erases a line, forges a line of a table or of the comparability section,
or starts a Markdown heading; remote images and links to anything but an http(s) address are
dropped from Markdown. Sweep grids are counted before they expand; spec numbers are finite and
within physical ranges; a bundle's JSON may not hold a number beyond a float's range.
"""

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kit.neutralize import has_control
from tests.hostile_bundles import copy_bundle, edit_json, kit, one_error, reseal

REPO = Path(__file__).resolve().parent.parent
ESCAPES = "\x1b]0;T\x07\x1b[2K\rok\u202e"
"""A window title, an erased line, a carriage return and a direction override."""
FORGED = "\n  - none: forged\tline\n# heading"
"""A string's own lines: a comparability line, a tab, and a Markdown heading."""
LINKS = " [x](javascript:alert(1)) ![](http://remote.example/p.png) **BOLD** `code`"
"""A script link, a remote image (it tells the sender who read the page), emphasis and code."""


def _kit_process(*args: str, cwd: Path, path: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    if path:
        env["PATH"] = f"{path}:{env['PATH']}"
    return subprocess.run([sys.executable, "-m", "kit", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd, env=env)


def assert_neutral(text: str) -> None:
    """No control character but the layout's line breaks, and no line the strings forged."""
    lines = text.split("\n")
    assert not any(has_control(line) for line in lines), [ln for ln in lines if has_control(ln)]
    assert not any(line.startswith(("  - none: forged", "# heading", "ok")) for line in lines)


def assert_inert_markdown(text: str) -> None:
    """Rendered as CommonMark (with tables), the strings make no link, image, emphasis, code
    or heading of their own; the kit's own figures and anchors stay."""
    from markdown_it import MarkdownIt

    html = MarkdownIt("commonmark").enable("table").render(text)
    for made in ('href="javascript', "<img src=\"http", "<strong>BOLD", "<code>code",
                 "<h1>heading", "\x1b"):
        assert made not in html, made


def _hostile_workload(folder: Path, name: str) -> Path:
    bundle = copy_bundle(folder)
    return edit_json(bundle, "manifest.json", lambda m: m["workload"].update(name=name))


@pytest.mark.parametrize("fmt", ["table", "markdown", "csv"])
def test_compare_keeps_a_hostile_workload_name_on_its_line(monkeypatch, capsys, tmp_path, fmt):
    bundle = _hostile_workload(tmp_path, "gpt" + ESCAPES + FORGED + LINKS)
    code, out, err = kit(monkeypatch, capsys, "compare", str(bundle), "--format", fmt)
    assert code == 0, err
    assert_neutral(out)
    assert_neutral(err)
    assert "forged" in out  # shown, escaped: \x0a  - none: forged\x09line
    if fmt == "csv":
        rows = list(csv.reader(io.StringIO(out)))
        assert {len(row) for row in rows} == {14}
    if fmt == "markdown":
        assert_inert_markdown(out)


@pytest.mark.timeout(300)
def test_report_markdown_drops_remote_images_and_script_links(monkeypatch, capsys, tmp_path):
    bundle = _hostile_workload(tmp_path, "gpt" + ESCAPES + FORGED + LINKS)
    report = tmp_path / "r.md"
    code, _, err = kit(monkeypatch, capsys, "report", str(bundle), "--markdown", "-o",
                       str(report))
    assert code == 0, err
    text = report.read_text()
    assert_neutral(text)
    assert_inert_markdown(text)
    assert "](r_figures/" in text  # the report's own images stay


def test_markdown_link_rules_keep_only_the_kits_own_and_web_links():
    from kit.neutralize import markdown_safe

    kept = "[a](#runs) ![f](r_figures/x.png) [w](https://example.org/a)"
    assert markdown_safe(kept) == kept
    for hostile, shown in [("[x](javascript:alert(1))", "x)"), ("![](http://r/p.png)", ""),
                           ("![](//r/p.png)", ""), ("[e](javascript\\:a)", "e"),
                           ("[d](data:text/html,x)", "d"), ("[i]: javascript:x", ""),
                           ("<img src=x onerror=alert(1)>", "&lt;img src=x onerror=alert(1)&gt;")]:
        assert markdown_safe(hostile) == shown, hostile


def test_bundle_show_of_a_sweep_folder_escapes_its_name(monkeypatch, capsys, tmp_path):
    folder = tmp_path / "sweep"
    folder.mkdir()
    (folder / "sweep.json").write_text(json.dumps({
        "schema_version": 1, "name": "s" + ESCAPES + FORGED, "sweep_file": "s.yaml",
        "updated_utc": "2026-12-07T00:00:00Z",
        "points": [{"id": "001", "values": {}, "status": "skipped",
                    "reason": "r" + ESCAPES + FORGED}]}))
    code, out, err = kit(monkeypatch, capsys, "bundle", "show", str(folder))
    assert code == 0, err
    assert_neutral(out)
    assert "forged" in out


def _hostile_sweep(folder: Path, run_one: bool) -> Path:
    points = [{"tp": 2, "speed": "compile" + ESCAPES + FORGED}, {"tp": 1}]
    path = folder / "hs.yaml"
    path.write_text(yaml.safe_dump({
        "name": "hs", "base": {"workload": "gpt3-tiny", "platform": "cpu", "steps": 1,
                               "warmup": 0, "telemetry_interval_ms": 0},
        "axes": [{"points": points}],
        "skip_if": [{"when": {"tp": 2 if run_one else 1}, "reason": "r" + ESCAPES + FORGED}]}))
    return path


def test_sweep_dry_run_escapes_skip_reasons_and_speed(monkeypatch, capsys, tmp_path):
    sweep = _hostile_sweep(tmp_path, run_one=False)
    code, out, err = kit(monkeypatch, capsys, "sweep", str(sweep), "--dry-run", "--out",
                         str(tmp_path / "out"))
    assert code == 0, err
    assert_neutral(out)
    assert "unknown feature(s) compile\\x1b]0;T\\x07" in out and "constraint: r\\x1b" in out


@pytest.mark.timeout(600)
def test_sweep_summary_escapes_skip_reasons(tmp_path):
    sweep = _hostile_sweep(tmp_path, run_one=True)  # one gpt3-tiny step runs; one is skipped
    r = _kit_process("sweep", str(sweep), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert_neutral(r.stdout)
    assert_neutral(r.stderr)
    assert "constraint: r\\x1b]0;T\\x07" in r.stdout


def _site_platform(folder: Path) -> Path:
    platform = yaml.safe_load((REPO / "platforms/h100.yaml").read_text())
    platform.update(name="hp", device_name="H" + ESCAPES + FORGED,
                    container_image="img" + ESCAPES + FORGED,
                    scaling={"gpt3-tiny": {"reason": "why" + ESCAPES + FORGED,
                                           "set": {"num_layers": 1}}})
    path = folder / "hp.yaml"
    path.write_text(yaml.safe_dump(platform))
    return path


def test_run_dry_run_escapes_the_platforms_words(monkeypatch, capsys, tmp_path):
    platform = _site_platform(tmp_path)
    code, out, err = kit(monkeypatch, capsys, "run", "gpt3-tiny", "--platform", str(platform),
                         "--global-batch", "16", "--dry-run")
    assert code == 0, err
    assert_neutral(out)
    assert "hp (H\\x1b]0;T\\x07" in out and "why\\x1b]0;T" in out


def test_workloads_show_escapes_the_description(monkeypatch, capsys, tmp_path):
    workload = yaml.safe_load((REPO / "workloads/gpt3-tiny.yaml").read_text())
    workload.update(name="hw", description="d" + ESCAPES + FORGED)
    path = tmp_path / "hw.yaml"
    path.write_text(yaml.safe_dump(workload))
    code, out, err = kit(monkeypatch, capsys, "workloads", "show", str(path))
    assert code == 0, err
    assert_neutral(out)
    assert "d\\x1b]0;T\\x07" in out


@pytest.mark.timeout(120)
def test_submits_no_pyxis_warning_escapes_the_image(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/sh\necho "Usage: srun [OPTIONS...] executable"\n')
    (bin_dir / "srun").chmod(0o755)
    r = _kit_process("submit", "gpt3-tiny", "--global-batch", "16", "--platform",
                     str(_site_platform(tmp_path)), "--dry-run", "--out", "o", cwd=tmp_path,
                     path=str(bin_dir))
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith("warning: this host's srun has no pyxis")
    assert_neutral(r.stderr)
    assert "image img\\x1b]0;T\\x07" in r.stderr


def test_a_sweep_grid_over_the_cap_is_refused_with_its_count(monkeypatch, capsys, tmp_path):
    fields = ["tp", "pp", "cp", "ep", "steps", "warmup", "seed", "rdzv_timeout"]
    path = tmp_path / "big.yaml"
    path.write_text("base: {workload: gpt3-tiny}\naxes:\n" + "".join(
        f"- product: {{{f}: [1,2,3,4,5,6,7,8,9,10]}}\n" for f in fields))
    assert path.stat().st_size < 500  # 8 axes of 10 values: 10**8 points
    line = one_error(*kit(monkeypatch, capsys, "sweep", str(path), "--dry-run", "--out",
                          str(tmp_path / "out"))[::2])
    assert "the axes make 100,000,000 points, more than the 10,000 a sweep may have" in line
    assert not (tmp_path / "out").exists()


BIG = str(10**400)


@pytest.mark.parametrize(("spec", "edit", "options", "needle"), [
    # an int option takes its field's bound (click's range): refused before the model sees it
    (None, {}, ["--global-batch", BIG], "is not an integer from 1 to 1073741824"),
    ("workloads/gpt3-tiny.yaml", {"global_batch_size": 10**400}, [],
     "global_batch_size: Input should be less than or equal"),
    ("platforms/h100.yaml", {"memory_per_device_gib": float("inf")}, [],
     "memory_per_device_gib: Input should be a finite number"),
    ("platforms/h100.yaml", {"rank_overhead_gib": float("inf")}, [],
     "rank_overhead_gib: Input should be a finite number"),
    ("platforms/h100.yaml", {"multi_rank_margin_gib": 1e308}, [],
     "multi_rank_margin_gib: Input should be less than or equal to 1048576"),
    ("platforms/h100.yaml", {"peak_tflops": {"bf16": float("nan")}}, [],
     "Input should be a finite number"),
    (None, {}, ["--min-measured-s", "inf"], "min_measured_s: Input should be a finite number"),
])
@pytest.mark.parametrize("command", ["run", "submit"])
def test_numbers_beyond_physical_ranges_are_refused_at_validation(
        monkeypatch, capsys, tmp_path, spec, edit, options, needle, command):
    args = ["gpt3-tiny", "--global-batch", "16"]
    if spec is not None:
        data = yaml.safe_load((REPO / spec).read_text())
        data.update(edit)
        path = tmp_path / Path(spec).name
        path.write_text(yaml.safe_dump(data))
        args = ([str(path), "--platform", "h100"] if spec.startswith("workloads")
                else [*args, "--platform", str(path)])
    if "--global-batch" in options:
        args = args[:1]
    line = one_error(*kit(monkeypatch, capsys, command, *args, *options, "--dry-run",
                          "--out", str(tmp_path / "out"))[::2])
    assert needle in line, line


def test_a_number_beyond_a_floats_range_is_refused_by_the_reader(monkeypatch, capsys, tmp_path):
    bundle = copy_bundle(tmp_path)
    metrics = json.loads((bundle / "metrics.json").read_text())
    metrics["summary"]["extra"] = 1.0
    (bundle / "metrics.json").write_text(json.dumps(metrics).replace('"extra": 1.0',
                                                                     '"extra": 1e400'))
    reseal(bundle)
    for command in (["bundle", "verify"], ["bundle", "show"], ["compare", "--format", "json"]):
        line = one_error(*kit(monkeypatch, capsys, *command, str(bundle))[::2])
        assert "metrics.json is not valid JSON (1e400 is beyond the range of a float)" in line


def test_compare_json_stays_strict_json_for_extreme_ratios(monkeypatch, capsys, tmp_path):
    base = edit_json(copy_bundle(tmp_path / "a"), "metrics.json",
                     lambda m: m["summary"].update(tokens_per_s=1e-300))
    other = copy_bundle(tmp_path / "b")
    edit_json(other, "manifest.json", lambda m: m["workload"].update(name="other"))
    edit_json(other, "metrics.json", lambda m: m["summary"].update(tokens_per_s=1e300))
    code, out, err = kit(monkeypatch, capsys, "compare", str(base), str(other), "--baseline",
                         str(base), "--format", "json")
    assert code == 0, err

    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in compare's JSON")

    data = json.loads(out, parse_constant=refuse)
    assert data["groups"][1]["metrics"]["tokens_per_s"]["ratio_to_baseline"] is None
