"""What a new user meets first (issue 59): commands that say what they do and what to do next,
defaults that fit the workload and host, and output that lands outside the checkout."""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO, start_long_run, wait_for_steps, why_failed


def kit_in(folder: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m kit ARGS`` run from ``folder`` (the user's working directory)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "kit", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=folder, env=env)


def test_platforms_gemm_fits_the_workload_says_its_progress_and_writes_under_results(tmp_path):
    shipped = sorted(p.name for p in (REPO / "platforms").iterdir())
    r = kit_in(tmp_path, "platforms", "gemm", "--platform", "cpu", "--workload", "gpt3-tiny",
               "--micro-batch", "1", "--min-time-ms", "1")
    assert r.returncode == 0, why_failed(r)
    table = tmp_path / "results" / "cpu.gemm.json"
    assert r.stdout.strip().splitlines()[-1] == str(table.resolve())
    assert sorted(p.name for p in (REPO / "platforms").iterdir()) == shipped
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith("gemm: timing 33 GEMM shapes of gpt3-tiny at TP [1, 2, 4] x "
                               "micro-batch [1]") and ": about " in lines[0], r.stderr
    assert lines[-1].startswith("gemm: 33/33 shapes timed in "), r.stderr
    # the default TP degrees are those gpt3-tiny's 4 heads divide: 1, 2 and 4, not 8
    points = json.loads(table.read_text())["points"]
    qkv_widths = {p["n"] for p in points if p["name"] == "qkv" and p["pass"] == "forward"}
    assert qkv_widths == {3 * 128 // tp for tp in (1, 2, 4)}


def test_platforms_gemm_on_a_cpu_host_refuses_a_big_models_default_shapes(tmp_path):
    r = kit_in(tmp_path, "platforms", "gemm", "--platform", "cpu", "--workload", "gpt3-175b")
    assert r.returncode == 2
    assert r.stderr.startswith("error: timing ") and len(r.stderr.strip().splitlines()) == 1
    assert "on one CPU thread would take about" in r.stderr and "--workload gpt3-tiny" in r.stderr
    assert not (tmp_path / "results").exists()


@pytest.fixture(scope="module")
def profiled_pipeline(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """The README's ``run gpt3-tiny --pp 2 --profile-steps 2:4`` (4 measured steps), with a
    compile cache of its own: what it printed, and its bundle."""
    folder = tmp_path_factory.mktemp("pp2")
    r = kit_in(folder, "run", "gpt3-tiny", "--pp", "2", "--steps", "4", "--warmup", "1",
               "--profile-steps", "2:4", "--compile-cache", str(folder / "cache"),
               timeout=900)
    assert r.returncode == 0, why_failed(r)
    return r, Path(r.stdout.strip().splitlines()[-1])


@pytest.mark.training
@pytest.mark.timeout(900)
def test_a_cpu_run_says_it_compiled_nothing_rather_than_filling_the_cache(profiled_pipeline):
    r, _ = profiled_pipeline
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("compile cache: "))
    assert line.startswith("compile cache: unused, this run compiled nothing, "), line
    assert "fills" not in r.stdout


@pytest.mark.training
@pytest.mark.timeout(900)
def test_a_pipeline_run_says_where_its_loss_is_and_points_at_its_breakdown(profiled_pipeline):
    r, bundle = profiled_pipeline
    steps = [ln for ln in r.stderr.splitlines() if ": step " in ln]
    assert len(steps) == 5 and all(ln.endswith("loss on the last stage") for ln in steps), steps
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("profile: "))
    assert "on 2 profiled rank(s); pipeline bubble stage 0 " in line and "stage 1 " in line
    assert "(analytical " in line and line.endswith(f"charllm-kit bundle show {bundle}")


@pytest.mark.training
@pytest.mark.timeout(900)
def test_bundle_show_says_median_step_beside_phase_means_and_shows_the_bubble(
        profiled_pipeline):
    _, bundle = profiled_pipeline
    r = kit_in(bundle.parent, "bundle", "show", str(bundle))
    assert r.returncode == 0, r.stderr
    assert any(ln.startswith("step_time_s (median step) ") for ln in r.stdout.splitlines())
    assert ("(mean seconds per measured step over the steps, a slow one counted in full, and "
            "over the stage's ranks; step_time_s above is the median step)") in r.stdout
    breakdown = r.stdout[r.stdout.index("profiled time by category"):].splitlines()
    assert "bubble measured / analytical" in breakdown[1]
    rows = [ln.split() for ln in breakdown[3:5]]
    assert [row[1:3] for row in rows] == [["0", "0"], ["1", "1"]]
    assert all(row[-2] == "/" and row[-1].endswith("%") for row in rows), breakdown


@pytest.mark.parametrize("option", ["--steps", "--warmup"])
def test_a_step_count_past_what_a_bundle_can_number_is_refused_in_one_line(tmp_path, option):
    r = kit_in(tmp_path, "run", "gpt3-tiny", option, "99999999999999999999", "--dry-run")
    assert r.returncode == 2 and "dry run: valid" not in r.stdout
    assert r.stderr.strip().splitlines() == [
        f"error: Invalid value for '{option}': '99999999999999999999' is not an integer from "
        f"{1 if option == '--steps' else 0} to 100000000"]


def test_a_refusal_for_memory_advises_only_what_the_run_does_not_do_yet(tmp_path):
    plain = kit_in(tmp_path, "run", "gpt3-175b", "--platform", "h100", "--dry-run")
    assert ("shard more (--tp, --pp, --dist-optimizer) or use --recompute full, or pass "
            "--force") in plain.stdout  # its micro-batch is 1 already
    done = kit_in(tmp_path, "run", "gpt3-175b", "--platform", "h100", "--recompute", "full",
                  "--dist-optimizer", "--micro-batch", "1", "--dry-run")
    line = next(ln for ln in done.stdout.splitlines() if "predicted not to fit" in ln)
    assert line.endswith("; shard more (--tp, --pp), or pass --force to run anyway"), line


def test_the_help_and_readme_say_what_is_true_now(tmp_path):
    r = kit_in(tmp_path, "study", "--help")
    assert "about 6 minutes on 4 H200s" in " ".join(r.stdout.split())
    plan = kit_in(tmp_path, "study", "--dry-run", "--quick", "--platform", "h200", "--devices",
                  "4")
    assert "estimated 5 min " in plan.stdout.splitlines()[-1]  # what "about 6 minutes" rounds
    listed = kit_in(tmp_path, "workloads", "list").stdout.splitlines()[2:]
    readme = (REPO / "README.md").read_text()
    comment = next(ln for ln in readme.splitlines() if ln.startswith("charllm-kit workloads "
                                                                     "list"))
    assert f"# {len(listed)}: " in comment
    r = subprocess.run([str(REPO / "run.sh"), "--help"], capture_output=True, text=True,
                       cwd=tmp_path, timeout=300)
    assert r.returncode == 0 and "./run.sh test " in r.stdout
    assert "Usage: charllm-kit [OPTIONS] COMMAND" in r.stdout


@pytest.mark.training
@pytest.mark.timeout(900)
def test_a_run_and_its_report_say_what_to_do_next(profiled_pipeline, tmp_path):
    r, bundle = profiled_pipeline
    assert r.stderr.strip().splitlines()[-2:] == [
        f"next: charllm-kit bundle show {bundle}   # the run again, per stage",
        f"      charllm-kit report {bundle} -o report.html   # figures and checks, in a browser"]
    page = tmp_path / "r.html"
    r = kit_in(tmp_path, "report", str(bundle), "-o", str(page), timeout=900)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == str(page.resolve())
    assert r.stderr.strip().splitlines()[-1] == (
        f"open it in a web browser: {page.resolve().as_uri()} (its figures are in r_figures/ "
        "beside it: copy both, or write it with --single-file)")


@pytest.mark.training
@pytest.mark.timeout(900)
def test_run_sh_ends_with_the_next_steps_as_its_user_types_them(tmp_path):
    r = subprocess.run([str(REPO / "run.sh"), "--steps", "1", "--warmup", "0",
                        "--telemetry-interval-ms", "0", "--out", str(tmp_path)],
                       capture_output=True, text=True, cwd=tmp_path, timeout=800)
    assert r.returncode == 0, why_failed(r)
    bundle = r.stdout.strip().splitlines()[-1]
    assert r.stderr.strip().splitlines()[-2:] == [
        f"next: ./run.sh bundle show {bundle}   # the run again, per stage",
        f"      ./run.sh report {bundle} -o report.html   # figures and checks, in a browser"]


@pytest.mark.training
@pytest.mark.timeout(900)
def test_a_run_stopped_by_a_signal_has_the_energy_of_the_steps_it_measured(tmp_path):
    """SIGTERM to the whole job (as Slurm or a terminal sends it) stops the sampler at once,
    while the ranks finish their step: the energy is that of the measured steps it covered."""
    proc = start_long_run(tmp_path, "--platform", "tests/data/platforms/cpu-replay-h100.yaml")
    try:
        wait_for_steps(tmp_path, 6)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=600)
    assert proc.returncode == 1, err[-3000:]
    bundle = Path(out.strip().splitlines()[-1])
    manifest = json.loads((bundle / "manifest.json").read_text())
    metrics = json.loads((bundle / "metrics.json").read_text())
    assert manifest["status"] == "interrupted"
    power, summary = metrics["power"], metrics["summary"]
    assert power["energy_j"] > 0 and power["power_integral_j"] > 0, power
    measured = len({r["step"] for r in metrics_steps(bundle) if r["phase"] == "measured"})
    assert 1 <= power["energy_steps"] <= measured
    tokens = manifest["config"]["global_batch_size"] * 128  # gpt3-tiny's sequence
    assert summary["energy_j_per_token"] == pytest.approx(
        power["energy_j"] / (tokens * power["energy_steps"]))
    if power["energy_steps"] < measured:
        assert any(f"over the {power['energy_steps']} of {measured} measured steps" in n
                   for n in metrics["notes"]), metrics["notes"]


def metrics_steps(bundle: Path) -> list[dict]:
    """``steps.parquet``'s rows."""
    import pyarrow.parquet as pq

    return pq.read_table(bundle / "steps.parquet").to_pylist()


@pytest.fixture(scope="module")
def cpu_study(tmp_path_factory) -> Path:
    """``study --quick --only microbatch-bursts`` on this CPU host: its study folder."""
    out = tmp_path_factory.mktemp("study")
    r = kit_in(out, "study", "--quick", "--only", "microbatch-bursts", "--out", str(out),
               timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return Path(r.stdout.strip().splitlines()[-1])


@pytest.mark.training
@pytest.mark.timeout(900)
def test_a_cpu_study_report_says_first_what_it_measured_and_what_it_could_not(cpu_study):
    page = (cpu_study / "report.html").read_text()
    title = ("Characterizing the Efficiency of Distributed Training: A Power, Performance, and "
             "Thermal Perspective: the findings on cpux2")
    assert f"<title>{title}</title>" in page and f"<h1>{title}</h1>" in page
    opening = page[page.index('<div id="opening">'):page.index("</div>")]
    assert page.index('<div id="opening">') < page.index("<h2>Contents</h2>")
    assert '<a href="https://arxiv.org/abs/2509.10371">Go et al., MICRO 2025' in opening
    assert "3 run(s) of gpt3-tiny on cpu." in opening
    assert "Measured: step time, throughput and peak memory." in opening
    assert ("Not measured: MFU, power, energy per token, GPU temperature, SM clock and "
            "throttling; this is a CPU host, without GPU power") in opening
    assert "Verdicts: 8 not measurable here" in opening
    # the runs' telemetry says who turned the sampler off, not an option the user never gave
    assert "--telemetry-interval-ms" not in page
    assert "the sampler was off (the study samples nothing on a CPU host" in page


@pytest.mark.training
@pytest.mark.timeout(900)
def test_a_report_lists_figures_with_nothing_to_show_in_one_line(cpu_study):
    page = (cpu_study / "report.html").read_text()
    across = page[page.index('<h2 id="across">'):page.index('<h2 id="runs">')]
    assert 'class="note"' not in across  # no placeholder per empty figure
    assert set(re.findall(r'<figure id="([^"]+)"><img ', across)) == {"config-bars", "sweep"}
    left_out = re.search(r'<p class="sub" id="not-drawn">([^<]*)</p>', across).group(1)
    assert left_out.startswith("Nothing to draw, so left out: Energy efficiency: ")
    for title in ("Power, temperature and SM clock per GPU", "Exposed communication",
                  "Link traffic over time", "Throttle reasons over time"):
        assert title in left_out
    contents = page[page.index("<nav>"):page.index("</nav>")]
    assert 'href="#sweep"' in contents and 'href="#efficiency"' not in contents


@pytest.mark.training
@pytest.mark.timeout(900)
def test_the_sweep_figures_legend_stays_clear_of_its_title(cpu_study):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from kit.analysis.compare import compare_bundles
    from kit.analysis.plots_study import sweep_lines

    fig = sweep_lines(compare_bundles([str(cpu_study)]))
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    [legend] = fig.legends
    panels = [ax.get_window_extent(renderer) for ax in fig.axes if ax.get_visible()]
    assert fig.get_suptitle().startswith("Against micro-batch size")
    # the suptitle sits above the panels (and their titles): a legend no higher than the
    # panels' tops is clear of it
    assert legend.get_window_extent(renderer).y1 <= max(p.y1 for p in panels)
