"""`run --profile-steps/--profile-ranks/--chakra` on real 2-rank gloo runs: the per-rank
breakdown partitions each profiled step, collectives have the right types and sizes, the
pipeline bubble is measured beside the analytical one, Chakra ETs carry gloo's all-reduce as a
COMM_COLL node, a redacted pack leaves the traces' operators as they are, and a run that fails
mid-profile still publishes a bundle that reads."""

import json
import os
import re
import signal
from pathlib import Path

import pytest

from kit.bundle import redact_scan
from kit.bundle.redact_rules import Redactor
from kit.bundle.verify import verify_bundle

from .conftest import bundle_path, kit_cli, rank_pid, start_long_run, wait_for_steps, why_failed

pytestmark = pytest.mark.training  # every test here starts ranks (pyproject.toml: tiers)

SHORT = ("--steps", "2", "--warmup", "1", "--profile-steps", "1:3")


def breakdown(bundle: Path, rank: int) -> dict:
    return json.loads((bundle / "profile" / f"rank{rank}.breakdown.json").read_text())


def categories(step: dict) -> dict[str, dict]:
    return {c["category"]: c for c in step["categories"]}


@pytest.fixture(scope="module")
def tp2(tmp_path_factory) -> Path:
    """TP2, profiling steps 1..2 (the measured ones) of 0..2, with Chakra ETs of step 1 only."""
    out = tmp_path_factory.mktemp("tp2")
    r = kit_cli("run", "gpt3-tiny", "--tp", "2", "--steps", "2", "--warmup", "1",
                "--profile-steps", "1", "--chakra", "--out", str(out), timeout=300)
    assert r.returncode == 0, why_failed(r)
    return bundle_path(r.stdout)


@pytest.fixture(scope="module")
def pp2(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pp2")
    r = kit_cli("run", "gpt3-tiny", "--pp", "2", *SHORT, "--out", str(out), timeout=300)
    assert r.returncode == 0, why_failed(r)
    return bundle_path(r.stdout)


@pytest.mark.timeout(300)
def test_tp2_categories_partition_the_profiled_step_and_collectives_are_all_reduces(tp2):
    verify_bundle(tp2)
    for rank in (0, 1):
        b = breakdown(tp2, rank)
        assert (b["rank"], b["stage"], b["timeline"]) == (rank, 0, "host")
        [step] = b["steps"]
        assert step["step"] == 1 and step["bubble"] is None  # pp 1: no pipeline
        cats = categories(step)
        assert sum(c["time_s"] for c in cats.values()) == pytest.approx(step["window_s"],
                                                                          abs=1e-6)
        assert step["window_s"] == pytest.approx(step["wall_s"], rel=0.05)  # the rank's clock
        assert {"MatMul", "attention", "norm", "idle"} <= set(cats)
        comm = {k: c for k, c in cats.items() if c["kind"] == "communication"}
        assert set(comm) == {"AllReduce"}, comm  # tensor parallelism over gloo: all-reduces
        ar = comm["AllReduce"]
        assert ar["calls"] > 0 and ar["bytes"] > 0
        assert ar["exposed_s"] + ar["overlapped_s"] == pytest.approx(ar["busy_s"], abs=1e-9)
        assert ar["time_s"] == pytest.approx(ar["exposed_s"], abs=1e-9)
        assert b["unprofiled_step_time_s"] > 0  # step 2 ran without the profiler


@pytest.mark.timeout(300)
def test_chakra_ets_carry_gloos_all_reduce_as_a_comm_coll_node(tp2):
    from chakra.schema.protobuf import et_def_pb2 as pb
    from chakra.src.third_party.utils.protolib import decodeMessage, openFileRd

    folder = tp2 / "profile" / "chakra"
    assert sorted(p.name for p in folder.iterdir()) == [
        "rank0.et", "rank0.host_et.json", "rank1.et", "rank1.host_et.json"]
    for rank in (0, 1):
        handle = openFileRd(str(folder / f"rank{rank}.et"))
        decodeMessage(handle, pb.GlobalMetadata())
        nodes = []
        while decodeMessage(handle, node := pb.Node()):
            nodes.append(node)
        handle.close()
        colls = [n for n in nodes if n.type == pb.COMM_COLL_NODE]
        assert colls and {n.name for n in colls} == {"gloo:all_reduce"}
        attrs = [{a.name: a.int64_val for a in n.attr} for n in colls]
        assert all(a["comm_type"] == pb.ALL_REDUCE and a["comm_size"] > 0 for a in attrs)
        assert sum(n.type == pb.COMP_NODE for n in nodes) > 100  # the step's operators


@pytest.mark.timeout(300)
def test_a_redacted_pack_leaves_the_binary_ets_out_and_keeps_their_redacted_sources(
        tp2, tmp_path):
    archive = tmp_path / "r.tar.gz"
    r = kit_cli("bundle", "pack", str(tp2), "--redact", "-o", str(archive))
    assert r.returncode == 0, why_failed(r)
    r = kit_cli("bundle", "unpack", str(archive), "-o", str(tmp_path / "in"))
    assert r.returncode == 0, why_failed(r)
    redacted = Path(r.stdout.strip())
    assert sorted(p.name for p in (redacted / "profile" / "chakra").iterdir()) == [
        "rank0.host_et.json", "rank1.host_et.json"]
    removed = json.loads((redacted / "manifest.json").read_text())["redaction"]["removed"]
    assert removed[-1].startswith("2 Chakra protobuf ET(s) (profile/chakra/*.et, binary) left out")
    assert (tp2 / "profile" / "chakra" / "rank0.et").exists()  # the original is untouched
    # a trace names no host: its operators and types are left as they are (``int[1]`` of a
    # schema is no Slurm node list, ``aten::transpose.int`` no host of the .int domain)
    for rel in ("profile/rank0.json", "profile/chakra/rank0.host_et.json"):
        text = (redacted / rel).read_text()
        assert "<host>" not in text and "<nodelist>" not in text, rel
        assert _operators(text) == _operators((tp2 / rel).read_text()), rel


def _operators(trace: str) -> set[str]:
    """The operator names a Kineto trace or host ET records, with their overloads."""
    return set(re.findall(r'"name": "(aten::[\w.]+)', trace))


def test_redacting_a_large_trace_by_its_hinted_lines_is_redacting_it_whole(tp2, monkeypatch):
    """A large text is searched only from the lines where a rule can match
    (kit.bundle.redact_scan): parts of a real host ET and Kineto trace, with every kind of name
    a bundle may hide written into them (some across lines), come out as a search of the whole
    text makes them."""
    seeds = ("export HF_TOKEN=hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123",
             "api_key:\n\n   0f9e8d7c6b5a4f3e2d1c", "--hf-token\n  zz-token-value-77",
             "Authorization: Bearer\n abcdefgh12345678", "#SBATCH -A\nproj-x", "-p gpu-q",
             "SLURM_JOB_PARTITION=gpu-q", "#SBATCH --nodelist=gpu-node-[17-20]",
             "peer gpu-node-19 gpu-node-42 login07.hpc.example.edu fd00::1234 10.20.30.40",
             "10.1.2.3", "mail carol.jones@uni-example.de", "cache /work/dave7x/cache",
             "GPU-618c5ede-81ec-b472-43ee-23bfe3919b57 Serial Number :\n 1652422012345",
             "SLURMD_NODENAME=n07 nodes n[01-04,9] USER=bob",
             "frontier07:2841:2841 [0] NCCL INFO on nid[001240] from ip-10-0-0-5 via gw.lab.ch",
             "ssh gwen@dtn03 ~harry uid=1001(gina) /pscratch/sd/e/erin 10.9.8.7.",
             "postgres://app:PW@db01 X-Session: eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2ln",
             "ether 0c:42:a1:12:34:56 node_guid 248a:0703:00a1:b2c3 board_serial: PKG1234567")
    lines = (tp2 / "profile" / "chakra" / "rank0.host_et.json").read_text().split("\n")[:6000]
    lines += (tp2 / "profile" / "rank0.json").read_text().split("\n")[:12000]  # some 1.5 MB
    step = len(lines) // len(seeds)
    for i, seed in reversed(list(enumerate(seeds))):
        lines.insert(i * step, seed)
    text = "\n".join(lines)

    def redact() -> tuple[str, dict]:
        redactor = Redactor([text], ["gpu-node-17.cluster.example.org"], [], partitions=True)
        return redactor.text(text), dict(redactor.counts)

    hinted = redact()
    monkeypatch.setattr(redact_scan, "LARGE", len(text) + 1)  # every text searched whole
    assert hinted == redact()
    assert all(hinted[1].get(rule) for rule in (
        "secrets", "accounts", "partitions", "user names", "e-mail addresses", "host names",
        "ip addresses", "device uuids", "hardware addresses", "device serials")), hinted[1]


@pytest.mark.timeout(300)
def test_pp2_bubble_is_measured_beside_the_analytical_one(pp2):
    m = 4  # gpt3-tiny: global batch 8 / micro-batch 2, dp 1
    for rank in (0, 1):
        b = breakdown(pp2, rank)
        assert b["stage"] == rank and [s["step"] for s in b["steps"]] == [1, 2]
        for step in b["steps"]:
            cats = categories(step)
            assert sum(c["time_s"] for c in cats.values()) == pytest.approx(step["window_s"],
                                                                              abs=1e-6)
            p2p = cats["SendRecv"]  # one send and one receive of activations or gradients
            assert p2p["calls"] == 2 * m
            assert p2p["bytes"] == 2 * m * 2 * 128 * 128 * 4  # micro-batch x seq x hidden fp32
            bubble = step["bubble"]
            assert bubble["analytical_frac"] == pytest.approx(1 / (m + 1))
            assert 0 < bubble["idle_s"] < bubble["window_s"] <= step["window_s"]
    r = kit_cli("compare", str(pp2))
    assert r.returncode == 0, why_failed(r)
    assert "profiled time by category" in r.stdout and "/ 20.0%" in r.stdout


@pytest.mark.timeout(300)
def test_a_run_that_fails_mid_profile_publishes_a_bundle_that_reads(tmp_path):
    proc = start_long_run(tmp_path, "--tp", "2", "--profile-steps", "1:400", steps=400)
    wait_for_steps(tmp_path, 3)
    pid = rank_pid(proc.pid, 1)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    bundle = bundle_path(out)
    verify_bundle(bundle)
    assert json.loads((bundle / "manifest.json").read_text())["status"] == "failed"
    files = sorted(p.name for p in (bundle / "profile").iterdir())
    assert files == ["rank0.breakdown.json", "rank0.json"]  # rank 1 died with its profiler
    steps = [s["step"] for s in breakdown(bundle, 0)["steps"]]
    assert steps[:2] == [1, 2]  # the steps that completed; not the one that broke
    report = tmp_path / "report.html"
    r = kit_cli("report", str(bundle), "-o", str(report))
    assert r.returncode == 0, why_failed(r)
    assert 'id="profile-breakdowns"' in report.read_text()


@pytest.mark.parametrize("args, needle", [
    (["--profile-steps", "3:2"], "--profile-steps 3:2: need A < B <= 3"),
    (["--profile-steps", "1:9"], "--profile-steps 1:9: need A < B <= 3"),
    (["--profile-steps", "a:b"], "'--profile-steps': 'a:b' is not of the form A:B or A"),
    (["--profile-ranks", "0,2"], "--profile-ranks: rank 2 is not in a world of 2"),
])
def test_bad_profile_options_are_one_line_and_exit_2(args, needle):
    r = kit_cli("run", "gpt3-tiny", "--tp", "2", "--steps", "2", "--warmup", "1", *args,
                "--dry-run")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and needle in r.stderr


@pytest.mark.timeout(600)
def test_a_kernel_category_has_one_colour_in_every_figure_and_small_shares_keep_decimals(tp2):
    """MatMul is one colour in "Where the profiled time goes" and "Kernel time by category";
    the communication axis of a run with ~1% overlapped says 0.2%, 0.4%, ..., not 0%, 0%, 1%."""
    from kit.analysis import plots_cross, plots_run
    from kit.analysis.compare import compare_bundles
    from kit.analysis.plots_common import png_bytes
    from kit.analysis.run_view import run_view
    from kit.metrics.kernels import kernel_times

    c = compare_bundles([tp2])
    bundle = c.bundles[0]

    def colours(fig) -> dict[str, tuple]:
        """Each legend entry's colour (a bar series' first bar)."""
        out = {}
        for ax in fig.axes:
            for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
                out[label] = handle.patches[0].get_facecolor()
        return out

    stages = colours(plots_cross.stage_breakdown(c))
    kernels = colours(plots_run.kernel_breakdown(kernel_times(bundle), run_view(bundle)))
    shared = set(stages) & set(kernels)
    assert "MatMul" in shared, (stages, kernels)
    assert all(stages[k] == kernels[k] for k in shared)
    fig = plots_cross.exposed_communication(c)
    png_bytes(fig)  # ticks are laid out when drawn
    for ax in fig.axes:
        ticks = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
        assert len(ticks) == len(set(ticks)), ticks
