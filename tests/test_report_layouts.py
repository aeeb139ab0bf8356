"""`report` and `compare` across parallel layouts and engines, on real CPU runs (report_bundles),
and the HTML report in a real browser.

The browser check makes two headless Chromium runs on the report as written: ``--dump-dom`` of a
copy with a probe script added (each figure image's natural size, its place on the page, failed
loads), then ``--screenshot`` of the report itself, page-tall; each figure's part of the
screenshot is cut out, written beside it (``screens/<figure id>.png``) and must not be blank.
Chromium is Debian's ``chromium``; ``./run.sh test`` installs it when it is missing and runs as
root. (One module: a session fixture imported into a module is made once per importing module.)
"""

import html
import json
import re
import shutil
import subprocess

import pytest
from PIL import Image

from .conftest import why_failed
from .many_bundles import many_bundles
from .report_bundles import layouts_fixture  # noqa: F401 (the session fixture `layouts`)

ACROSS = {"config-bars", "efficiency", "per-gpu", "gpu-heatmap", "profile-breakdowns",
          "exposed-comm"}
PER_RUN = {"power-timeline": "power-timelines", "chassis-heatmap": "chassis-heatmaps",
           "clock-throttle": "clock-throttle-timelines"}
"""A run's anchor for each figure of several runs, and that figure's id (without ``-k``)."""


def _figures(text: str) -> dict[str, str]:
    return dict(re.findall(r'<figure id="([^"]+)">(.*?)</figure>', text, re.S))


def _panels(text: str) -> dict[str, str]:
    """Each run's pointer at its rows of the figures of several runs, by anchor."""
    return dict(re.findall(r'<p class="panel" id="([^"]+)">(.*?)</p>', text))


def _rows_of(panels: dict[str, str], anchor: str) -> tuple[str, int]:
    """The figure and row a run's pointer links to (fails when it has none)."""
    found = re.search(r'<a href="#([^"]+)">row (\d+) of \d+ in ', panels[anchor])
    assert found, f"{anchor}: {panels[anchor]}"
    return found.group(1), int(found.group(2))


@pytest.mark.training
def test_layouts_are_named_by_engine_and_layout_against_a_baseline(cli, layouts, tmp_path):
    ok = [str(layouts[k]) for k in ("tp2", "pp2", "zero1")]
    out = tmp_path / "r.html"
    r = cli("report", *ok, "-o", str(out), "--baseline", layouts["tp2"].name)
    assert r.returncode == 0, why_failed(r)
    text = out.read_text()
    titles = re.findall(r'<h3 id="bundle-\d">\d\. ([^<]+)</h3>', text)
    assert titles == ["megatron tp2 pp1 dp1", "megatron tp1 pp2 dp1", "deepspeed zero1 dp2"]
    assert "Baseline: megatron tp2 pp1 dp1; ratios for throughput" in text
    assert "all configurations: gpt3-tiny cpu-replay-chassis x2 fp32 mb2 gb8" in text
    ranking = text.split('<h2 id="comparison">')[1].split("</table>")[0]
    # one ranking: a row per configuration, fastest first, the baseline's ratio beside it
    rows = [re.findall(r"<td>([^<]*)</td>", row) for row in re.findall(r"<tr><td>.*?</tr>",
                                                                        ranking)]
    assert [r[0] for r in rows] == ["1", "2", "3"]
    assert {r[1] for r in rows} == {"megatron tp2 pp1 dp1", "megatron tp1 pp2 dp1",
                                    "deepspeed zero1 dp2"}
    speeds = [float(r[3].split()[0].replace(",", "")) for r in rows]
    assert speeds == sorted(speeds, reverse=True)
    assert {r[4] for r in rows} >= {"baseline"} and all(
        r[4] == "baseline" or r[4].startswith("x") for r in rows)
    table = text.split("<summary>All metrics</summary>")[1].split("</table>")[0]
    assert "gpt3-tiny" not in table and "vs baseline" in table
    assert re.search(r"<td>max temperature \(°C\) *</td>(<td[^>]*>[^<]*</td>)*"
                     r"<td[^>]*> *[+-]\d+\.\d °C</td>", table)
    checks = text.split('<h2 id="comparability">')[1].split("</ul>")[0]
    assert re.search(r"\[engine\] different engines: megatron \(2: [^)]+\); deepspeed \(1: ",
                     checks)
    figures = _figures(text)
    assert {k for k, v in figures.items() if "<img" in v} >= ACROSS | {
        "kernel-breakdown-1", "kernel-breakdown-2"}
    assert "no profile in this bundle" in figures["kernel-breakdown-3"]

    result = json.loads(cli("compare", *ok, "--format", "json").stdout)
    assert [(g["engine"], g["short_label"]) for g in result["groups"]] == [
        ("megatron", "megatron tp2 pp1 dp1"), ("megatron", "megatron tp1 pp2 dp1"),
        ("deepspeed", "deepspeed zero1 dp2")]
    assert result["shared"] == ["gpt3-tiny", "cpu-replay-chassis x2", "fp32", "mb2", "gb8"]


@pytest.mark.training
def test_a_failed_runs_telemetry_is_drawn_with_its_status(cli, layouts, tmp_path):
    out = tmp_path / "r.html"
    r = cli("report", str(layouts["tp2"]), str(layouts["failed"]), "-o", str(out))
    assert r.returncode == 0, why_failed(r)
    text = out.read_text()
    section = text.split('<h3 id="bundle-2">')[1]
    assert section.startswith("2. ") and "[failed]</h3>" in section.split("\n")[0]
    facts = dict(re.findall(r"<dt>([^<]+)</dt><dd>([^<]*)</dd>", section))
    assert facts["steps"] == "0 of 0 warmup and 0 of 2 measured steps ran"
    samples = int(re.match(r"(\d+) samples per GPU over [\d.]+ s \(1 GPU\), samples every ",
                           facts["telemetry"]).group(1))
    assert samples > 10
    figures, panels = _figures(text), _panels(text)
    for anchor, figure in PER_RUN.items():  # its rows, after the ok run's
        assert _rows_of(panels, f"{anchor}-2") == (f"{figure}-1", 2)
        assert "<img" in figures[f"{figure}-1"] and "[failed]" in figures[f"{figure}-1"]
    assert "whole record" in panels["chassis-heatmap-2"]


@pytest.mark.training
def test_markdown_has_the_html_figures(cli, layouts, tmp_path):
    paths = [str(p) for p in layouts.values()]
    r = cli("report", *paths, "-o", str(tmp_path / "r.html"))
    assert r.returncode == 0, why_failed(r)
    html_images = {k for k, v in _figures((tmp_path / "r.html").read_text()).items()
                   if "<img" in v}
    r = cli("report", *paths, "-o", str(tmp_path / "r.md"), "--markdown")
    assert r.returncode == 0, why_failed(r)
    text = (tmp_path / "r.md").read_text()
    linked = set(re.findall(r"!\[[^\]]*\]\(r_figures/([^)]+)\.png\)", text))
    assert linked == html_images == {p.stem for p in (tmp_path / "r_figures").iterdir()}


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
WIDTH = 1400

CATCH = """<script>window.__failed = []; window.addEventListener("error", e => {
  const t = e.target; window.__failed.push(t && (t.src || t.href) ? (t.src || t.href).slice(0, 80)
                                                                     : String(e.message)); }, true);
</script>"""
PROBE = """<script>window.addEventListener("load", () => {
  const figs = [...document.querySelectorAll("figure img")].map(img => {
    const r = img.getBoundingClientRect();
    return {id: img.closest("figure").id, src: img.currentSrc.slice(0, 300),
            complete: img.complete, natural: [img.naturalWidth,
            img.naturalHeight], box: [r.left + scrollX, r.top + scrollY, r.width, r.height]};
  });
  const loaded = performance.getEntriesByType("resource").map(e => e.name.slice(0, 80))
    .filter(name => !name.startsWith("data:"));
  const out = document.createElement("pre");
  out.id = "probe";
  out.textContent = JSON.stringify({figs, loaded, failed: window.__failed,
                                    height: document.documentElement.scrollHeight,
                                    width: document.documentElement.scrollWidth,
                                    viewport: document.documentElement.clientWidth});
  document.body.appendChild(out);
});</script>"""


def chromium(*args: str) -> subprocess.CompletedProcess:
    """Headless Chromium as root in a container: no sandbox, no GPU, no scrollbars."""
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--no-first-run", "--disable-extensions", "--mute-audio", *args],
        capture_output=True, text=True, timeout=300)


@pytest.mark.training
@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not found (Debian package "
                    "`chromium`; `./run.sh test` installs it when run as root)")
@pytest.mark.timeout(1800)
def test_every_figure_of_the_html_report_renders_in_chromium(cli, layouts, tmp_path):
    report = tmp_path / "report.html"
    r = cli("report", *(str(p) for p in layouts.values()), "-o", str(report),
            "--baseline", str(layouts["tp2"]), "--single-file")
    assert r.returncode == 0, why_failed(r)
    text = report.read_text()
    expected = re.findall(r'<figure id="([^"]+)"><img ', text)
    assert set(expected) >= ACROSS | {f"{f}-1" for f in PER_RUN.values()} | {
        "kernel-breakdown-1", "kernel-breakdown-2"}

    probe = tmp_path / "probe.html"
    probe.write_text(text.replace("<head>", "<head>" + CATCH, 1)
                     .replace("</body>", PROBE + "</body>", 1))
    r = chromium(f"--window-size={WIDTH},1000", "--dump-dom", probe.as_uri())
    found = re.search(r'<pre id="probe">(.*?)</pre>', r.stdout, re.S)
    assert found, r.stderr[-2000:]
    result = json.loads(html.unescape(found.group(1)))
    assert result["failed"] == [] and result["loaded"] == []  # self-contained: nothing fetched
    figs = {f["id"]: f for f in result["figs"]}
    assert list(figs) == expected and result["width"] <= WIDTH
    for fig_id, f in figs.items():
        assert f["complete"] and min(f["natural"]) > 0 and min(f["box"][2:]) > 0, fig_id

    page = tmp_path / "page.png"
    r = chromium(f"--window-size={WIDTH},{result['height']}", f"--screenshot={page}",
                 report.as_uri())
    assert page.is_file(), r.stderr[-2000:]
    shots = tmp_path / "screens"
    shots.mkdir()
    with Image.open(page) as image:
        assert image.size == (WIDTH, result["height"])
        for fig_id, f in figs.items():
            x, y, w, h = (round(v) for v in f["box"])
            crop = image.crop((x, y, x + w, y + h)).convert("RGB")
            crop.save(shots / f"{fig_id}.png")
            colours = crop.getcolors(maxcolors=w * h) or []
            assert len(colours) > 8, f"{fig_id} rendered blank"  # drawn, not one flat colour
    assert sorted(p.stem for p in shots.iterdir()) == sorted(expected)


NARROW = 400
"""Pixels of a phone's screen: the report must not need sideways scrolling of the page."""


@pytest.fixture(scope="module")
def hundred(tmp_path_factory) -> list:
    """100 verified bundles copied from the recorded GPU bundles (tests/many_bundles.py)."""
    return many_bundles(tmp_path_factory.mktemp("hundred"), 100)


@pytest.mark.timeout(1800)  # about a minute on a quiet 2-core host; CI hosts are not quiet
def test_a_report_of_100_bundles_links_figures_drawn_once(cli, hundred, tmp_path):
    twin = shutil.copytree(hundred[0], tmp_path / "twin" / hundred[0].name)
    report = tmp_path / "report.html"
    r = cli("report", *(str(p) for p in hundred), str(twin), "-o", str(report), timeout=1500)
    assert r.returncode == 0, why_failed(r)
    text = report.read_text()
    assert report.stat().st_size < 5e6 and "base64" not in text
    linked = re.findall(r'<figure id="([^"]+)"><img src="report_figures/([^"]+)"', text)
    assert all(f == f"{i}.png" for i, f in linked)
    # the runs' timelines and heatmaps: 8 runs a figure, every run's rows linked from its
    # section (a run missing from its figure fails here)
    runs = re.findall(r'<h3 id="bundle-(\d+)">', text)
    assert len(runs) >= 100
    shared = {f"{f}-{k}" for f in PER_RUN.values() for k in range(1, -(-len(runs) // 8) + 1)}
    assert shared <= {i for i, _ in linked} and len(linked) < len(shared) + 12
    panels = _panels(text)
    for anchor, figure in PER_RUN.items():
        rows = [_rows_of(panels, f"{anchor}-{n}") for n in runs]
        assert rows == [(f"{figure}-{i // 8 + 1}", i % 8 + 1) for i in range(len(runs))]
    assert {f for _, f in linked} == {p.name for p in (tmp_path / "report_figures").iterdir()}
    assert '<meta name="viewport"' in text and text.count('<div class="scroll">') >= 2
    # the twin is one run: counted once, said once
    assert f"[duplicate] {hundred[0].name} is given 2 times" in html.unescape(text)
    ranking = text.split('<table class="ranking">')[1].split("</table>")[0]
    assert re.findall(r'<tr class="workload"><th colspan="\d+">([^<]+)</th>', ranking) == [
        "mixtral-8x7b-4l", "gpt3-1.3b"]  # in the order first given
    for part in ranking.split('<tr class="workload">')[1:]:
        places = re.findall(r"<tr><td>([^<]+)</td>", part)
        ok = [p for p in places if p != "-"]
        assert ok == [str(n) for n in range(1, len(ok) + 1)] and places[len(ok):] == [
            "-"] * (len(places) - len(ok))  # failed runs last, unranked
    groups = len(re.findall(r"<tr><td>", ranking))
    assert 40 <= groups < 100  # repeats of one configuration share a row
    assert re.search(r"\d \[\d[\d,.]*\.\.\d[\d,.]*\]", ranking)  # with their spread
    checks = text.split('<h2 id="comparability">')[1].split("</ul>")[0]
    lines = re.findall(r"<li>(.*?)</li>", checks)
    assert len(lines) == len(set(lines)) and len(lines) < 12
    assert sum("ended failed" in line for line in lines) == 1  # 4 failed runs, one line
    figures = _figures(text)
    for fig in ("sweep", "link-traffic", "position-timelines", "throttle-timelines"):
        assert "<img" in figures[fig], fig

    if CHROMIUM is None:
        pytest.skip("headless Chromium not found: the figures were not rendered in a browser")
    probe = tmp_path / "probe.html"
    probe.write_text(text.replace("<head>", "<head>" + CATCH, 1)
                     .replace("</body>", PROBE + "</body>", 1))
    r = chromium(f"--window-size={NARROW},900", "--dump-dom", probe.as_uri())
    found = re.search(r'<pre id="probe">(.*?)</pre>', r.stdout, re.S)
    assert found, r.stderr[-2000:]
    result = json.loads(html.unescape(found.group(1)))
    # Chromium keeps a window at least 500 px wide: nothing may overflow the narrowest it gives
    assert result["failed"] == [] and result["viewport"] <= 500
    assert result["width"] <= result["viewport"]
    # every linked figure is an image of the folder beside the report, decoded (file URLs
    # leave no resource-timing entries, so the images themselves are asked)
    folder = (tmp_path / "report_figures").as_uri()
    assert len(result["figs"]) == len(linked)
    assert all(f["src"].startswith(folder) for f in result["figs"])
    for f in result["figs"]:
        assert f["complete"] and min(f["natural"]) > 0, f["id"]
        assert 0 < f["box"][2] <= result["viewport"], f["id"]
