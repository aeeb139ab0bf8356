"""Multi-node runs without Slurm: two node agents on this host, like torchrun on two nodes.

Each test starts two real ``charllm-kit run --launcher torchrun`` processes (node 0 and node 1,
2 gloo ranks each: gpt3-tiny TP2 x DP2) that meet at a rendezvous endpoint on localhost. Each
agent starts its ranks as torchrun does (kit.launch.elastic).
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest

from kit.launch.local import free_port
from tests.conftest import (
    REPO,
    bundle_path,
    first_on_pythonpath,
    kit_cli,
    rank_pid,
    recover_once_stopped,
    why_failed,
)

pytestmark = pytest.mark.training  # every test here starts ranks (pyproject.toml: tiers)


def start_node(node: int, out: Path, port: int, *extra: str, steps: int = 3,
               env: dict[str, str] | None = None) -> subprocess.Popen:
    """One node agent: ``run ... --launcher torchrun --node-rank NODE`` (``env``: added to
    this process's environment)."""
    return subprocess.Popen(
        [sys.executable, "-m", "kit", "run", "gpt3-tiny", "--nodes", "2", "--tp", "2",
         "--dp", "2", "--launcher", "torchrun", "--node-rank", str(node), "--rdzv-endpoint",
         f"127.0.0.1:{port}", "--steps", str(steps), "--warmup", "1", "--out", str(out), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})), start_new_session=True,
    )


def finish(procs: list[subprocess.Popen], timeout: float = 240) -> list[tuple[int, str, str]]:
    """Each node's exit code, stdout and stderr; a node still running after ``timeout`` fails
    the test with every node's output (the nodes' process groups killed)."""
    out: list[tuple[int, str, str]] = []
    for k, p in enumerate(procs):
        try:
            stdout, stderr = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs[k:]:
                os.killpg(q.pid, signal.SIGKILL)
            out += [(q.wait(), *q.communicate()) for q in procs[k:]]
            said = "\n".join(f"node {j} (exit {rc}):\n{err[-3000:]}"
                             for j, (rc, _, err) in enumerate(out))
            pytest.fail(f"node {k} still ran after {timeout:g} s\n{said}")
        out.append((p.returncode, stdout, stderr))
    return out


def manifest(bundle: Path) -> dict:
    return json.loads((bundle / "manifest.json").read_text())


TORCH_2_11_AGENT = """\
import sys
if "--node-rank" in sys.orig_argv:
    from torch.distributed.elastic.agent.server import local_elastic_agent as lea
    init = lea.LocalElasticAgent.__init__
    def __init__(self, spec, logs_specs, start_method="spawn", exit_barrier_timeout=300,
                 log_line_prefix_template=None):
        init(self, spec, logs_specs, start_method, exit_barrier_timeout, log_line_prefix_template)
    lea.LocalElasticAgent.__init__ = __init__
"""
"""torch 2.11's LocalElasticAgent: its constructor takes no ``shutdown_timeout``."""

BROKEN_AGENT = """\
import sys
if "--node-rank" in sys.orig_argv:
    from torch.distributed.elastic.agent.server import local_elastic_agent as lea
    def run(self, role="default"):
        raise RuntimeError("agent broken on purpose")
    lea.LocalElasticAgent.run = run
"""
"""torch's agent raising as it starts the node's ranks."""


def agent_hook(tmp_path: Path, code: str) -> dict[str, str]:
    """The environment for node agents whose torch agent is changed by ``code`` (a
    ``sitecustomize`` that acts only in the node agents' process)."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(code)
    return first_on_pythonpath(hook)


def both_nodes(out: Path, env: dict[str, str],
               timeout: float = 240) -> list[tuple[int, str, str]]:
    """Run node 0 and node 1 of one run, each with ``env`` added, to their end."""
    port = free_port()
    return finish([start_node(0, out, port, env=env), start_node(1, out, port, env=env)],
                  timeout=timeout)


def left_running(tmp_path: Path) -> list[psutil.Process]:
    """Processes whose command line names ``tmp_path`` (the run's nodes, ranks, sampler)."""
    return [p for p in psutil.process_iter(["cmdline"])
            if str(tmp_path) in " ".join(p.info["cmdline"] or [])]


@pytest.mark.timeout(300)
def test_two_nodes_make_one_bundle_with_both_nodes_telemetry_and_inventory(tmp_path, cli):
    port = free_port()
    (rc0, out0, err0), (rc1, out1, err1) = finish(
        [start_node(0, tmp_path, port), start_node(1, tmp_path, port)])
    assert rc0 == 0 and rc1 == 0, err0 + err1
    bundle = bundle_path(out0)
    assert bundle_path(out1) == bundle  # node 1 names the bundle node 0 published
    assert cli("bundle", "verify", str(bundle)).returncode == 0
    m = manifest(bundle)
    assert m["status"] == "ok" and m["config"]["nodes"] == 2
    assert [(r["rank"], r["node"], r["local_rank"]) for r in m["ranks"]] == [
        (0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
    assert len(m["inventory"]) == 2
    for node in m["inventory"]:
        assert node["network"] and node["cpu_count"] > 0
        assert node["clock"]["uncertainty_start_s"] is not None
    assert m["inventory"][0]["clock"]["applied_s"] == 0.0
    assert abs(m["inventory"][1]["clock"]["offset_start_s"]) < 0.5  # one host, one clock
    nodes = set(pq.read_table(bundle / "telemetry.parquet").column("node").to_pylist())
    assert nodes == {0, 1}
    steps = pq.read_table(bundle / "steps.parquet").to_pylist()
    assert {r["rank"] for r in steps} == {0, 1, 2, 3}
    logs = sorted(p.name for p in (bundle / "logs").iterdir())
    assert logs == ["node0.log", "node1.log", "rank0.log", "rank1.log", "rank2.log",
                    "rank3.log"]


@pytest.mark.timeout(300)
def test_a_killed_node_agent_fails_the_run_naming_the_node(tmp_path, cli):
    port = free_port()
    node0 = start_node(0, tmp_path, port, steps=400)
    node1 = start_node(1, tmp_path, port, steps=400)
    deadline = time.monotonic() + 200
    while time.monotonic() < deadline:
        log = next(tmp_path.glob(".*.partial/ranks/rank2.steps.jsonl"), None)
        if log is not None and log.read_text().count("\n") >= 2:
            break
        time.sleep(0.2)
    else:
        node0.kill(), node1.kill()
        pytest.fail("node 1's ranks did not train")
    os.kill(node1.pid, signal.SIGKILL)
    (rc0, out0, err0), _ = finish([node0, node1], timeout=200)
    assert rc0 == 1, err0
    bundle = bundle_path(out0)
    assert cli("bundle", "verify", str(bundle)).returncode == 0
    m = manifest(bundle)
    assert m["status"] == "failed"
    assert m["error"].startswith("node 1 ") and "SIGKILL" in m["error"], m["error"]
    assert "its ranks 2, 3" in m["error"]
    nodes = set(pq.read_table(bundle / "telemetry.parquet").column("node").to_pylist())
    assert nodes == {0, 1}  # node 1's samples up to its death are kept


def wait_for_rank_steps(out: Path, rank: int, steps: int, procs: list[subprocess.Popen]) -> None:
    """Block until ``rank`` of the run staged under ``out`` has streamed ``steps`` steps."""
    deadline = time.monotonic() + 200
    while time.monotonic() < deadline:
        log = next(out.glob(f".*.partial/ranks/rank{rank}.steps.jsonl"), None)
        if log is not None and log.read_text().count("\n") >= steps:
            return
        time.sleep(0.2)
    for p in procs:
        p.kill()
    pytest.fail(f"rank {rank} did not train")


@pytest.mark.timeout(300)
def test_a_rank_killed_on_node_1_fails_the_run_naming_node_rank_and_signal(tmp_path, cli):
    port = free_port()
    node0 = start_node(0, tmp_path, port, steps=400)
    node1 = start_node(1, tmp_path, port, steps=400)
    wait_for_rank_steps(tmp_path, 3, 2, [node0, node1])
    victim = rank_pid(node1.pid, 3)  # node 1's agent starts its ranks 2 and 3
    assert victim is not None, "rank 3 is not a child of node 1's agent"
    assert "kit.launch.worker" in psutil.Process(victim).cmdline(), "not a rank"
    os.kill(victim, signal.SIGKILL)
    (rc0, out0, err0), (rc1, out1, _) = finish([node0, node1], timeout=200)
    assert rc0 == 1 and rc1 == 1, err0
    bundle = bundle_path(out0)
    assert bundle_path(out1) == bundle  # node 1 lived on and heard how the run ended
    assert cli("bundle", "verify", str(bundle)).returncode == 0
    m = manifest(bundle)
    assert m["status"] == "failed"
    assert m["error"].startswith("rank 3: killed by SIGKILL on node 1 "), m["error"]
    assert m["ranks"][3]["signal"] == "SIGKILL" and m["ranks"][3]["node"] == 1
    steps = pq.read_table(bundle / "steps.parquet").to_pylist()
    assert {r["rank"] for r in steps} == {0, 1, 2, 3}  # the killed rank's streamed steps too
    assert min(sum(r["rank"] == k for r in steps) for k in range(4)) >= 2
    nodes = set(pq.read_table(bundle / "telemetry.parquet").column("node").to_pylist())
    assert nodes == {0, 1}


@pytest.mark.timeout(300)
def test_a_killed_node_0_agent_leaves_a_staging_folder_that_bundle_recover_publishes(
        tmp_path, cli):
    """Node 0's agent publishes the bundle: SIGKILLed, it leaves every node's part staged;
    node 1 ends by itself and `bundle recover` merges both nodes' parts once nothing runs."""
    port = free_port()
    node0 = start_node(0, tmp_path, port, steps=400)
    node1 = start_node(1, tmp_path, port, steps=400)
    wait_for_rank_steps(tmp_path, 2, 2, [node0, node1])
    staging = next(tmp_path.glob(".*.partial"))
    os.kill(node0.pid, signal.SIGKILL)
    early = cli("bundle", "recover", str(staging), timeout=60)
    assert early.returncode == 2 and "still run" in early.stderr, early.stderr
    assert len(early.stderr.strip().splitlines()) == 1
    (_, _, _), (rc1, _, err1) = finish([node0, node1], timeout=120)  # node 1 ends by itself
    assert rc1 == 1, err1
    r = recover_once_stopped(staging)  # node 0's orphaned ranks stop within their grace
    assert r.returncode == 0, why_failed(r)
    bundle = bundle_path(r.stdout)
    assert cli("bundle", "verify", str(bundle)).returncode == 0
    m = manifest(bundle)
    assert m["status"] == "failed"
    assert m["error"].startswith("node 0 (") and f"its agent (pid {node0.pid}" in m["error"]
    assert len(m["inventory"]) == 2 and m["inventory"][1]["clock"]["offset_start_s"] is not None
    assert [r["node"] for r in m["ranks"]] == [0, 0, 1, 1]
    steps = pq.read_table(bundle / "steps.parquet").to_pylist()
    assert min(sum(r["rank"] == k for r in steps) for k in range(4)) >= 2
    nodes = set(pq.read_table(bundle / "telemetry.parquet").column("node").to_pylist())
    assert nodes == {0, 1}
    logs = sorted(p.name for p in (bundle / "logs").iterdir())
    assert logs == ["node0.log", "node1.log", "rank0.log", "rank1.log", "rank2.log",
                    "rank3.log"]
    assert not staging.exists()


@pytest.mark.timeout(120)
def test_an_output_folder_not_shared_is_one_line_before_training(tmp_path):
    port = free_port()
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    (rc0, _, err0), (rc1, _, err1) = finish(
        [start_node(0, tmp_path / "a", port), start_node(1, tmp_path / "b", port)])
    for rc, err in ((rc0, err0), (rc1, err1)):
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert rc == 2 and len(lines) == 1 and "is not shared between nodes" in lines[0], err
    assert not list((tmp_path / "a").iterdir())  # node 0 removed its staging folder


@pytest.mark.timeout(300)
def test_a_node_that_never_joins_is_an_error_within_the_timeout(tmp_path):
    """--rdzv-timeout 3 is the one waited for: the line says so, and the default (300 s) could
    not have ended within the 240 s given (no bound tighter than that: a busy host starts
    Python slowly)."""
    r = kit_cli("run", "gpt3-tiny", "--nodes", "2", "--tp", "2", "--dp", "2", "--launcher",
                "torchrun", "--node-rank", "0", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
                "--rdzv-timeout", "3", "--out", str(tmp_path), timeout=240)
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "not every node joined the rendezvous" in lines[0], r.stderr
    assert " within 3 s (" in lines[0], lines[0]


@pytest.mark.timeout(300)
def test_a_node_whose_node_0_never_comes_is_an_error_within_the_timeout(tmp_path):
    """Node 1 alone: one line naming the endpoint, exit code 2, once --rdzv-timeout 3 and
    the grace after it are up (torch's store alone retried once more after a random back-off
    that can be longer than the timeout)."""
    r = kit_cli("run", "gpt3-tiny", "--nodes", "2", "--tp", "2", "--dp", "2", "--launcher",
                "torchrun", "--node-rank", "1", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
                "--rdzv-timeout", "3", "--out", str(tmp_path), timeout=240)
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]  # none of torch's C++ log
    assert len(lines) == 1 and "could not reach node 0's rendezvous" in lines[0], r.stderr
    assert " within 3 s (" in lines[0], lines[0]


@pytest.mark.timeout(300)
def test_an_endpoint_another_program_listens_on_is_one_line_on_each_node(tmp_path):
    """The endpoint's port held by a listener that never answers (another program, as when
    a port handed out as free is taken before node 0 binds it): node 0 says the port is taken,
    node 1, connected to that listener, ends once the rendezvous timeout is up (torch's store
    alone would wait for its answer forever); both exit 2 without writing anything."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", free_port()))
        held.listen()
        port = held.getsockname()[1]
        (rc0, _, err0), (rc1, _, err1) = finish(
            [start_node(n, tmp_path / "out", port, "--rdzv-timeout", "3") for n in (0, 1)],
            timeout=200)
    said = {0: f"port {port} on 127.0.0.1 is taken by another program",
            1: f"127.0.0.1:{port} accepts connections but did not answer"}
    for node, rc, err in ((0, rc0, err0), (1, rc1, err1)):
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert rc == 2 and len(lines) == 1 and said[node] in lines[0], err
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


@pytest.mark.timeout(300)
def test_an_engine_that_fails_to_import_fails_every_node_with_its_error(tmp_path, cli):
    """megatron-core's import raising in every rank: the run fails naming a rank that ended as
    the import did (exit code 1, the traceback in its log); each other rank ended the same way
    or was stopped by its agent once a peer had failed (which comes first depends on how fast
    each imports), and no process of the run is left."""
    hook = tmp_path / "hook"
    (hook / "megatron").mkdir(parents=True)
    (hook / "megatron" / "__init__.py").write_text('raise ImportError("broken on purpose")\n')
    (rc0, out0, err0), (rc1, out1, _) = both_nodes(tmp_path / "out", first_on_pythonpath(hook),
                                                   timeout=200)
    assert rc0 == 1 and rc1 == 1, err0
    bundle = bundle_path(out0)
    assert bundle_path(out1) == bundle
    assert cli("bundle", "verify", str(bundle)).returncode == 0
    m = manifest(bundle)
    assert m["status"] == "failed"
    assert "exit code 1 on node " in m["error"] and "broken on purpose" in m["error"], m["error"]
    assert all(r["exit_code"] == 1 or r["signal"] == "SIGTERM" for r in m["ranks"]), m["ranks"]
    failed = [r["rank"] for r in m["ranks"] if r["exit_code"] == 1]
    assert failed, m["ranks"]
    for rank in failed:
        assert "broken on purpose" in (bundle / "logs" / f"rank{rank}.log").read_text()
    assert not left_running(tmp_path)


@pytest.mark.timeout(300)
def test_two_nodes_run_under_a_torch_agent_without_shutdown_timeout(tmp_path, cli):
    """torch 2.11 (the GPU machines' torch) has no ``shutdown_timeout``: the run trains as
    under the torch that has it (the argument was passed unconditionally once, and every
    multi-node run there failed at the agent's construction)."""
    (rc0, out0, err0), (rc1, _, err1) = both_nodes(tmp_path / "out",
                                                   agent_hook(tmp_path, TORCH_2_11_AGENT))
    assert rc0 == 0 and rc1 == 0, err0 + err1
    m = manifest(bundle_path(out0))
    assert m["status"] == "ok", m["error"]
    steps = pq.read_table(bundle_path(out0) / "steps.parquet").to_pylist()
    assert {r["rank"] for r in steps} == {0, 1, 2, 3}


@pytest.mark.timeout(300)
def test_a_node_agent_that_raises_is_the_runs_headline(tmp_path, cli):
    """torch's agent raising on every node before any rank starts: the run fails with that
    error as its headline (not a rank that never ran), both nodes exit 1 with the bundle."""
    (rc0, out0, err0), (rc1, out1, _) = both_nodes(tmp_path / "out",
                                                   agent_hook(tmp_path, BROKEN_AGENT), timeout=200)
    assert rc0 == 1 and rc1 == 1, err0
    bundle = bundle_path(out0)
    assert bundle_path(out1) == bundle
    assert cli("bundle", "verify", str(bundle)).returncode == 0
    m = manifest(bundle)
    assert m["status"] == "failed"
    assert m["error"] == "node 0: launcher: RuntimeError: agent broken on purpose", m["error"]
    notes = json.loads((bundle / "metrics.json").read_text())["notes"]
    assert "node 1: launcher: RuntimeError: agent broken on purpose" in notes, notes
    assert not left_running(tmp_path)
