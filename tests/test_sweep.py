"""Sweeps: every shipped file plans as expected, a CPU sweep runs end to end, failures are
recorded and the sweep goes on, --resume keeps verified bundles, bad files exit 2."""

import json
from pathlib import Path

import pytest

from kit.bundle.verify import verify_bundle
from kit.errors import KitInputError
from kit.sweep.file import load_sweep
from kit.sweep.plan import plan_sweep

from .conftest import REPO, why_failed

SWEEPS = REPO / "sweeps"
EVIDENCE_SWEEPS = REPO / "benchmarks" / "parallel"

# (points, valid) per shipped file as planned on any host. Skips come from the memory estimate
# (e.g. gpt3-175b TP1 PP32 without recompute on H200), divisibility (llama3-70b's 80 layers over
# PP32 on H100), the batch (mixtral-8x7b DP32 x micro-batch 8 > GBS 128) and, for the FSDP
# points, memory again (llama3-70b TP8 without recompute on H100).
EXPECTED = {
    "cpu-smoke": (4, 4),
    "h200-parallelism": (13, 13),
    "h200-optimization": (52, 44),
    "h200-microbatch": (52, 51),
    "h200-fsdp": (8, 8),
    "h100-parallelism": (15, 14),
    "h100-optimization": (60, 42),
    "h100-microbatch": (60, 55),
    "h100-fsdp": (8, 6),
    # no platform named: planned on this CPU host, every point's ranks exceed its RAM (on four
    # GPUs they run: benchmarks/parallel/README.md)
    "node4-study-layouts": (13, 0),
    "node4-small-shapes": (13, 0),
    "node4-layouts-host": (11, 0),
}
# The multi-GPU evidence sweeps (issue 5), planned for the full node as a dry run resolves it.
EVIDENCE = {"h200x2-matrix": (9, 9), "h200x4-matrix": (4, 4)}

ODD_ROPE = (  # megatron-core rejects it when it builds the model: RoPE needs an even head dim
    "family: llama3\nnum_layers: 2\nhidden_size: 66\nnum_attention_heads: 2\n"
    "ffn_hidden_size: 128\nseq_length: 16\nvocab_size: 256\nactivation: swiglu\n"
    "normalization: rmsnorm\nposition_embedding: rope\nadd_bias_linear: false\n"
    "tie_embeddings: false\nglobal_batch_size: 2\n"
)


def test_every_shipped_sweep_is_covered():
    assert {p.stem for p in SWEEPS.glob("*.yaml")} == set(EXPECTED)
    assert {p.stem for p in EVIDENCE_SWEEPS.glob("*.yaml")} == set(EVIDENCE)


@pytest.mark.parametrize(
    "path,expected",
    [(SWEEPS / f"{n}.yaml", v) for n, v in sorted(EXPECTED.items())]
    + [(EVIDENCE_SWEEPS / f"{n}.yaml", v) for n, v in sorted(EVIDENCE.items())],
    ids=lambda x: x.stem if isinstance(x, Path) else "",
)
def test_shipped_sweep_plans(path, expected):
    plan = plan_sweep(load_sweep(path), require_present=False)
    assert (len(plan), sum(p.valid for p in plan)) == expected
    assert len({p.id for p in plan}) == len(plan)
    for p in plan:
        if p.valid:
            assert p.cfg is not None and p.memory is not None and p.memory.fits is not False
        else:
            assert any(why in p.skip_reason
                       for why in ("predicted not to fit", "divisible"))


def _layouts(name: str) -> set[tuple]:
    spec = load_sweep(SWEEPS / f"{name}.yaml")
    return {(p["workload"], p["tp"], p["pp"], p.get("ep", 1)) for p in spec.axes[0].points}


@pytest.mark.parametrize("platform", ["h200", "h100"])
def test_study_sweeps_share_their_layouts(platform):
    layouts = _layouts(f"{platform}-parallelism")
    assert _layouts(f"{platform}-optimization") == layouts == _layouts(f"{platform}-microbatch")
    assert {w for w, *_ in layouts} == {"gpt3-175b", "llama3-70b", "mixtral-8x7b", "mixtral-8x22b"}


def test_point_ids_keep_the_workload_name(cli):
    r = cli("sweep", str(EVIDENCE_SWEEPS / "h200x4-matrix.yaml"), "--dry-run")
    assert r.returncode == 0, why_failed(r)
    assert "001-gpt3-1.3b-tp2-pp2-sp-recompute-none" in r.stdout
    assert "004-mixtral-8x7b-4l-ep4-mb1-recompute-full" in r.stdout


def test_dry_run_lists_points_with_reasons(cli):
    r = cli("sweep", str(SWEEPS / "h200-optimization.yaml"), "--dry-run")
    assert r.returncode == 0, why_failed(r)
    lines = r.stdout.splitlines()
    assert any(ln.startswith("013-gpt3-175b-tp1-pp32") and "skipped" in ln
               and "predicted not to fit" in ln for ln in lines)
    assert any(ln.startswith("015-gpt3-175b-tp1-pp32") and "valid" in ln for ln in lines)
    assert "52 points: 44 valid, 8 skipped" in r.stdout and "nothing launched" in r.stdout


def test_constraints_skip_points(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(
        "base: {workload: gpt3-tiny, platform: cpu}\n"
        "axes:\n  - product: {tp: [1, 2, 3], micro_batch_size: [1, 2]}\n"
        "skip_if:\n"
        "  - {if: 'tp * micro_batch_size >= 4', reason: too big}\n"
        "  - {when: {tp: 1, micro_batch_size: [2]}, reason: not needed}\n"
    )
    plan = plan_sweep(load_sweep(f), require_present=False)
    reasons = {p.id: p.skip_reason for p in plan}
    assert reasons["001-tp1-mb1"] is None and reasons["003-tp2-mb1"] is None
    assert reasons["002-tp1-mb2"] == "constraint: not needed"
    assert reasons["004-tp2-mb2"] == reasons["006-tp3-mb2"] == "constraint: too big"
    assert "divisible" in reasons["005-tp3-mb1"]  # 4 heads over TP3: the layout check


@pytest.mark.parametrize("body, message", [
    ("base: {workload: gpt3-tiny}\naxes: [{product: {tp: [1}]", "invalid YAML"),
    ("base: {workload: gpt3-tiny, tpp: 2}\n", "unknown run field(s) ['tpp']"),
    ("base: {workload: gpt3-tiny}\naxes: [{zip: {tp: [1, 2], pp: [1]}}]\n", "same length"),
    ("base: {workload: gpt3-tiny}\naxes: [{zip: {tp: [1]}, product: {pp: [1]}}]\n",
     "exactly one of"),
    ("base: {workload: gpt3-tiny}\nskip_if: [{if: \"__import__('os')\", reason: x}]\n",
     "Call is not allowed"),
    ("base: {workload: gpt3-tiny}\nskip_if: [{if: 'tp.real > 1', reason: x}]\n",
     "Attribute is not allowed"),
    ("base: {workload: gpt3-tiny}\naxes: [{product: {tp: [1, 3, two]}}]\n",
     "product: tp: 'two' is not a valid tp"),
    ("base: {workload: gpt3-tiny}\naxes: [{zip: {tp: [1, 2], pp: [1, 0]}}]\n",
     "zip: pp: 0 is not a valid pp"),
    ("base: {workload: gpt3-tiny}\naxes: [{points: [{tp: 2}, {launcher: ssh}]}]\n",
     "points: launcher: 'ssh' is not a valid launcher"),
])
def test_bad_sweep_files_are_refused(tmp_path, body, message):
    f = tmp_path / "bad.yaml"
    f.write_text(body)
    with pytest.raises(KitInputError, match="bad.yaml") as e:
        load_sweep(f)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("body, needle", [
    ("base: {workload: gpt3-tiny}\nrepeat: 3\n", "repeat"),
    ("base: {workload: gpt3-tiny}\naxes: [{product: {tp: [1, 3, \"two\"]}}]\n", "'two'"),
])
def test_bad_sweep_file_exits_2_with_one_line(cli, tmp_path, body, needle):
    """Whether or not --dry-run: refused when loaded, not a point skipped with exit 0."""
    f = tmp_path / "bad.yaml"
    f.write_text(body)
    for flag in (["--dry-run"], []):
        r = cli("sweep", str(f), *flag, "--out", str(tmp_path / "out"))
        assert r.returncode == 2 and r.stdout == ""
        assert r.stderr.count("\n") == 1 and needle in r.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("base, needle", [
    ("{workload: gpt3-tyni, platform: cpu}", "base: unknown workload 'gpt3-tyni'; known: "),
    ("{workload: gpt3-tiny, platform: cpux}", "base: unknown platform 'cpux'; known: "),
    ("{workload: gpt3-tiny, platform: cpu, tp: 0}", "base: invalid run fields: tp: "),
    ("{platform: cpu}", "base: invalid run fields: missing field: workload"),
])
def test_a_wrong_fixed_field_refuses_the_sweep_with_or_without_dry_run(cli, tmp_path, base,
                                                                     needle):
    """It would skip every point: the same one line and exit 2 whether or not --dry-run."""
    f = tmp_path / "typo.yaml"
    f.write_text(f"base: {base}\naxes: [{{product: {{micro_batch_size: [1, 2]}}}}]\n")
    out = tmp_path / "out"
    dry, real = (cli("sweep", str(f), *flag, "--out", str(out), timeout=120)
                 for flag in (["--dry-run"], []))
    assert (dry.returncode, real.returncode) == (2, 2) and dry.stdout == real.stdout == ""
    assert dry.stderr == real.stderr and dry.stderr.count("\n") == 1
    assert dry.stderr.startswith(f"error: sweep typo: {needle}")
    assert not (out / "typo").exists()


@pytest.mark.timeout(120)
def test_a_wrong_axis_value_skips_only_its_point(cli, tmp_path):
    f = tmp_path / "axis.yaml"
    f.write_text("base: {platform: cpu}\naxes: [{product: {workload: [gpt3-tiny, gpt3-tyni]}}]\n")
    r = cli("sweep", str(f), "--dry-run", "--out", str(tmp_path / "out"), timeout=120)
    assert r.returncode == 0, why_failed(r)
    assert "2 points: 1 valid, 1 skipped" in r.stdout
    assert "unknown workload 'gpt3-tyni'" in r.stdout


def _bundles(point_dir: Path) -> list[Path]:
    return [p for p in point_dir.iterdir() if p.is_dir() and not p.name.startswith(".")
            and p.name != "superseded"]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    from .conftest import kit_cli

    r = kit_cli("sweep", str(SWEEPS / "cpu-smoke.yaml"), "--out", str(out))
    return out / "cpu-smoke", r


@pytest.mark.training
def test_cpu_sweep_runs_every_point(smoke):
    folder, r = smoke
    assert r.returncode == 0, why_failed(r)
    assert Path(r.stdout.strip().splitlines()[-1]) == folder.resolve()
    assert "point 4/4 004-tp2-mb2: running" in r.stderr
    assert "tokens/s" in r.stdout and "energy/token" in r.stdout
    index = json.loads((folder / "sweep.json").read_text())
    assert [p["status"] for p in index["points"]] == ["ok"] * 4
    for p in index["points"]:
        (bundle,) = _bundles(folder / p["id"])
        assert p["bundle"] == f"{p['id']}/{bundle.name}" and p["summary"]["tokens_per_s"] > 0
        verify_bundle(bundle)
        cfg = json.loads((bundle / "manifest.json").read_text())["config"]
        assert cfg["parallel"]["tp"] == p["values"]["tp"]
        assert cfg["micro_batch_size"] == p["values"]["micro_batch_size"]
        assert p["id"] in r.stdout


@pytest.mark.training
def test_rerun_without_resume_is_refused(smoke, cli):
    folder, _ = smoke
    r = cli("sweep", str(SWEEPS / "cpu-smoke.yaml"), "--out", str(folder.parent))
    assert r.returncode == 2 and "--resume" in r.stderr and r.stderr.count("\n") == 1


@pytest.mark.training
def test_resume_keeps_verified_bundles_and_reruns_a_broken_one(smoke, cli):
    folder, first = smoke
    assert first.returncode == 0, first.stderr
    before = {d.name: (_bundles(d)[0], (_bundles(d)[0] / "manifest.json").stat().st_mtime_ns)
              for d in folder.iterdir() if d.is_dir()}
    broken = before["003-tp2-mb1"][0]
    with (broken / "metrics.json").open("a") as f:
        f.write(" ")  # the checksum no longer matches
    unknown = sorted(before)[0]  # its recorded settings are unreadable: it must run again
    (folder / unknown / "request.json").write_text("{not json")
    dry = cli("sweep", str(SWEEPS / "cpu-smoke.yaml"), "--out", str(folder.parent), "--resume",
              "--dry-run", "--json")
    assert dry.returncode == 0, why_failed(dry)
    resume = {p["id"]: p["resume"] for p in json.loads(dry.stdout)["points"]}
    assert resume == {name: "to run" if name in ("003-tp2-mb1", unknown) else "done (ok, kept)"
                      for name in before}
    dry = cli("sweep", str(SWEEPS / "cpu-smoke.yaml"), "--out", str(folder.parent), "--resume",
              "--dry-run")
    assert "4 valid (2 done, kept by --resume)" in dry.stdout
    assert dry.stdout.count("valid: done (ok, kept)") == 2, dry.stdout
    r = cli("sweep", str(SWEEPS / "cpu-smoke.yaml"), "--out", str(folder.parent), "--resume")
    assert r.returncode == 0, why_failed(r)
    assert r.stderr.count("kept (ok, bundle verifies)") == 2
    assert "point 3/4 003-tp2-mb1: running" in r.stderr
    assert f"point 1/4 {unknown}: running" in r.stderr
    for name, (bundle, mtime) in before.items():
        (now,) = _bundles(folder / name)
        if name in ("003-tp2-mb1", unknown):
            assert now != bundle and (folder / name / "superseded" / bundle.name).is_dir()
            verify_bundle(now)
        else:
            assert now == bundle and (now / "manifest.json").stat().st_mtime_ns == mtime
    index = json.loads((folder / "sweep.json").read_text())
    assert [p["resumed"] for p in index["points"]] == [False, True, False, True]


@pytest.mark.training
def test_resume_of_a_sweep_not_started_yet_starts_it(cli, tmp_path):
    """A job script that always passes --resume works the first time too."""
    f = tmp_path / "one.yaml"
    f.write_text("name: one\nbase: {workload: gpt3-tiny, platform: cpu, steps: 1, warmup: 0, "
                 "telemetry_interval_ms: 0}\naxes:\n  - product: {seed: [7]}\n")
    r = cli("sweep", str(f), "--out", str(tmp_path / "new"), "--resume")
    assert r.returncode == 0, why_failed(r)
    folder = tmp_path / "new" / "one"
    assert r.stderr.startswith(f"sweep one: nothing to resume in {folder} (no sweep.json): "
                               "starting it\n")
    [point] = json.loads((folder / "sweep.json").read_text())["points"]
    assert point["status"] == "ok" and not point["resumed"]


@pytest.mark.training
def test_a_failing_point_is_recorded_and_the_sweep_goes_on(cli, tmp_path):
    (tmp_path / "odd-rope.yaml").write_text(ODD_ROPE)
    f = tmp_path / "mixed.yaml"
    f.write_text(
        "name: mixed\nbase: {platform: cpu, steps: 2, warmup: 0, telemetry_interval_ms: 0}\n"
        "axes:\n  - points:\n"
        f"      - {{workload: {tmp_path / 'odd-rope.yaml'}}}\n"
        "      - {workload: gpt3-tiny, tp: 3}\n"
        "      - {workload: gpt3-tiny, micro_batch_size: 4}\n"
        "      - {workload: gpt3-tiny, micro_batch_size: 1}\n"
        "skip_if:\n  - {when: {micro_batch_size: 4}, reason: covered elsewhere}\n"
    )
    r = cli("sweep", str(f), "--out", str(tmp_path / "out"))
    assert r.returncode == 1, r.stderr
    assert "point 1/2 001-odd-rope: failed" in r.stderr and "point 2/2" in r.stderr
    folder = tmp_path / "out" / "mixed"
    index = json.loads((folder / "sweep.json").read_text())
    status = {p["id"]: (p["status"], p["reason"]) for p in index["points"]}
    assert status["001-odd-rope"][0] == "failed" and status["001-odd-rope"][1].startswith("rank 0")
    assert status["002-gpt3-tiny-tp3"][0] == "skipped" and "divisible" in status[
        "002-gpt3-tiny-tp3"][1]
    assert status["003-gpt3-tiny-mb4"] == ("skipped", "constraint: covered elsewhere")
    assert status["004-gpt3-tiny-mb1"] == ("ok", None)
    for p in index["points"]:
        if p["bundle"]:
            verify_bundle(folder / p["bundle"])
    assert "failed" in r.stdout and "covered elsewhere" in r.stdout


TWO_NODE_SWEEP = """name: two-jobs
base: {workload: gpt3-tiny, platform: cpu, nodes: 2, tp: 2, steps: 2, warmup: 1,
       telemetry_interval_ms: 0}
axes:
  - product: {seed: [1, 2], tp: [2, 3]}
"""


@pytest.mark.timeout(120)
def test_dry_run_with_launcher_slurm_shows_each_valid_points_job(cli, tmp_path):
    """No cluster needed: the plan names the job each valid point would be submitted as, and
    --json carries the very script `submit --dry-run` prints for that point's run."""
    f = tmp_path / "two.yaml"
    f.write_text(TWO_NODE_SWEEP)
    out = tmp_path / "out"
    slurm = ["--launcher", "slurm", "--container-runtime", "none", "--partition", "ci"]
    r = cli("sweep", str(f), "--dry-run", *slurm, "--out", str(out), timeout=120)
    assert r.returncode == 0, why_failed(r)
    point_dir = out.absolute() / "two-jobs" / "001-seed1-tp2"
    row = next(ln for ln in r.stdout.splitlines() if ln.startswith("001-seed1-tp2"))
    assert f"sbatch charllm-001-seed1-tp2, 2 node(s) -> {point_dir}/" in row
    skipped = next(ln for ln in r.stdout.splitlines() if ln.startswith("002-seed1-tp3"))
    assert "skipped" in skipped and "sbatch" not in skipped
    assert "nothing submitted" in r.stdout

    j = cli("sweep", str(f), "--dry-run", *slurm, "--out", str(out), "--json", timeout=120)
    assert j.returncode == 0, j.stderr
    plan = json.loads(j.stdout)
    assert plan["launcher"] == "slurm" and (plan["valid"], plan["skipped"]) == (2, 2)
    jobs = {p["id"]: p["submit"] for p in plan["points"]}
    assert jobs["002-seed1-tp3"] is None and jobs["004-seed2-tp3"] is None
    job = jobs["001-seed1-tp2"]
    assert (job["job_name"], job["nodes"], job["out"]) == (
        "charllm-001-seed1-tp2", 2, str(point_dir))
    sub = cli("submit", "gpt3-tiny", "--platform", "cpu", "--nodes", "2", "--tp", "2",
              "--steps", "2", "--warmup", "1", "--telemetry-interval-ms", "0", "--seed", "1",
              "--container-runtime", "none", "--partition", "ci", "--out", str(point_dir),
              "--dry-run", timeout=120)
    assert sub.returncode == 0, sub.stderr
    assert job["script"] == sub.stdout.replace("--job-name=charllm-gpt3-tiny",
                                               "--job-name=charllm-001-seed1-tp2")
    assert not out.exists()  # a dry run writes nothing

    local = cli("sweep", str(f), "--dry-run", "--out", str(out), "--json", timeout=120)
    assert local.returncode == 0, local.stderr
    assert {p["submit"] for p in json.loads(local.stdout)["points"]} == {None}
