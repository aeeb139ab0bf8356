"""Multi-node runs through a real Slurm cluster of two "nodes" on this host (tests/slurm_cluster).

Each node is a ``slurmd -N nX`` on this host; ``--launcher slurm`` starts one node agent per
node with srun, as on a real cluster (2 gloo ranks per node: gpt3-tiny TP2 x DP2).
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests import slurm_cluster
from tests.conftest import (
    REPO,
    bundle_path,
    default_sigint,
    kit_cli,
    recover_once_stopped,
    why_failed,
)

RUN = [sys.executable, "-m", "kit", "run", "gpt3-tiny", "--nodes", "2", "--tp", "2", "--dp", "2",
       "--launcher", "slurm", "--warmup", "1"]


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A private 2-node Slurm cluster for the session; SLURM_CONF points at it meanwhile."""
    why = slurm_cluster.install()
    if why:
        pytest.skip(why)
    # KillWait 30 s, Slurm's default: the agents publish the bundle between SIGTERM and SIGKILL
    cluster = slurm_cluster.start(tmp_path_factory.mktemp("slurm"), nodes=2, kill_wait_s=30)
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    yield cluster
    slurm_cluster.stop(cluster)
    if old is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = old


def manifest(bundle: Path) -> dict:
    return json.loads((bundle / "manifest.json").read_text())


def salloc_bundle(argv: list[str]) -> tuple[Path, dict]:
    """Run ``argv`` inside a 2-node salloc; its verified bundle, ended ok, and its manifest."""
    r = subprocess.run(["salloc", "-N2", "--ntasks-per-node=1", *argv],
                       capture_output=True, text=True, cwd=REPO, timeout=280)
    assert r.returncode == 0, why_failed(r)
    bundle = bundle_path(r.stdout)
    assert kit_cli("bundle", "verify", str(bundle)).returncode == 0
    m = manifest(bundle)
    assert m["status"] == "ok" and m["slurm_job_id"] is not None
    assert [n["slurm_node"] for n in m["inventory"]] == ["n1", "n2"]
    return bundle, m


@pytest.mark.timeout(300)
def test_launcher_slurm_inside_salloc_runs_one_agent_per_node(slurm, tmp_path):
    bundle, m = salloc_bundle([*RUN, "--steps", "3", "--out", str(tmp_path)])
    assert [r["node"] for r in m["ranks"]] == [0, 0, 1, 1]
    assert set(pq.read_table(bundle / "telemetry.parquet").column("node").to_pylist()) == {0, 1}


@pytest.mark.timeout(300)
def test_fabric_inside_salloc_runs_through_the_same_agents(slurm, tmp_path):
    bundle, _ = salloc_bundle([
        sys.executable, "-m", "kit", "fabric", "--nodes", "2", "--nproc", "2", "--launcher",
        "slurm", "--ops", "all_reduce", "--sizes", "64K", "--iters", "3", "--out", str(tmp_path)])
    assert json.loads((bundle / "fabric.json").read_text())["ranks"] == 4


def training_job(out: Path) -> str:
    """An sbatch job of a long 2-node run, once node 1's ranks have trained 2 steps."""
    cmd = " ".join([*RUN, "--steps", "400", "--out", str(out)])
    job = subprocess.run(["sbatch", "--parsable", "-N2", "--ntasks-per-node=1",
                          f"--output={out}/job-%j.out", f"--wrap={cmd}"],
                         capture_output=True, text=True, cwd=REPO, check=True).stdout.strip()
    deadline = time.monotonic() + 200
    while time.monotonic() < deadline:
        log = next(out.glob(".*.partial/ranks/rank2.steps.jsonl"), None)
        if log is not None and log.read_text().count("\n") >= 2:
            return job
        time.sleep(0.3)
    subprocess.run(["scancel", job])
    pytest.fail("the job's ranks did not train: " + "".join(
        p.read_text() for p in out.glob("job-*.out")))


@pytest.mark.timeout(300)
def test_scancel_gives_interrupted_naming_it(slurm, tmp_path):
    job = training_job(tmp_path)
    subprocess.run(["scancel", job], check=True)
    while subprocess.run(["squeue", "-h", "-j", job, "-o", "%i"], capture_output=True,
                         text=True).stdout.strip():
        time.sleep(0.3)
    bundles = [p for p in tmp_path.iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert len(bundles) == 1, list(tmp_path.iterdir())
    assert kit_cli("bundle", "verify", str(bundles[0])).returncode == 0
    m = manifest(bundles[0])
    assert m["status"] == "interrupted" and "scancel" in m["error"], m["error"]


def job_agent(job: str, node: int) -> int | None:
    """Pid of the node agent (srun task) of ``node`` in Slurm job ``job``, from its environment."""
    want = {f"SLURM_JOB_ID={job}".encode(), f"SLURM_NODEID={node}".encode(),
            b"CHARLLM_SLURM_AGENT=1"}
    for pid in os.listdir("/proc"):
        try:
            env = set(Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"))
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if want <= env and b"kit" in argv and b"run" in argv:
            return int(pid)
    return None


def wait_job_gone(job: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while subprocess.run(["squeue", "-h", "-j", job, "-o", "%i"], capture_output=True,
                         text=True).stdout.strip():
        assert time.monotonic() < deadline, f"job {job} did not end in {timeout_s} s"
        time.sleep(0.3)


@pytest.mark.timeout(300)
def test_a_sigkilled_node_agent_under_slurm_fails_the_run_naming_the_node(slurm, tmp_path):
    job = training_job(tmp_path)
    agent = job_agent(job, 1)
    assert agent is not None, "node 1's agent not found"
    os.kill(agent, signal.SIGKILL)
    wait_job_gone(job)
    bundles = [p for p in tmp_path.iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert len(bundles) == 1, list(tmp_path.iterdir())
    assert kit_cli("bundle", "verify", str(bundles[0])).returncode == 0
    m = manifest(bundles[0])
    assert m["status"] == "failed" and m["slurm_job_id"] == job
    assert m["error"].startswith("node 1 (n2): its agent (pid "), m["error"]
    assert f"pid {agent} " in m["error"] and "SIGKILL" in m["error"], m["error"]
    assert set(pq.read_table(bundles[0] / "telemetry.parquet").column("node").to_pylist()) == {
        0, 1}  # node 1's samples up to its agent's death are kept


@pytest.mark.timeout(300)
def test_recovering_a_job_whose_node_0_agent_was_killed_keeps_the_job_id(slurm, tmp_path):
    job = training_job(tmp_path)
    agent = job_agent(job, 0)
    assert agent is not None, "node 0's agent not found"
    staging = next(tmp_path.glob(".*.partial"))
    os.kill(agent, signal.SIGKILL)
    wait_job_gone(job)
    r = recover_once_stopped(staging)  # node 0's orphaned ranks stop within their grace
    assert r.returncode == 0, why_failed(r)
    bundle = Path(r.stdout.strip().splitlines()[-1])
    assert kit_cli("bundle", "verify", str(bundle)).returncode == 0
    m = manifest(bundle)
    assert m["status"] == "failed" and m["slurm_job_id"] == job
    assert m["error"].startswith("node 0 (n1): its agent (pid "), m["error"]


SUBMIT = ["submit", "gpt3-tiny", "--nodes", "2", "--tp", "2", "--dp", "2", "--warmup", "1",
          "--container-runtime", "none"]


@pytest.mark.timeout(60)
def test_submit_dry_run_prints_the_script(tmp_path):
    r = kit_cli("submit", "llama3-8b", "--platform", "h100", "--nodes", "4", "--tp", "8",
                "--pp", "2", "--partition", "gpu", "--account", "proj", "--time", "02:00:00",
                "--container-runtime", "pyxis", "--out", str(tmp_path), "--dry-run")
    assert r.returncode == 0, why_failed(r)
    lines = r.stdout.splitlines()
    for key in ("#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                "#SBATCH --exclusive", "#SBATCH --time=02:00:00", "#SBATCH --partition=gpu",
                "#SBATCH --account=proj", f"#SBATCH --output={tmp_path}/slurm-%j.out",
                "export NCCL_DEBUG=WARN", "export CHARLLM_SLURM_AGENT=1"):
        assert key in lines, (key, r.stdout)
    command = ("srun " + r.stdout.split("\nsrun ")[1]).replace("\\\n", " ").split()
    assert command[:6] == [
        "srun", "--nodes=4", "--ntasks-per-node=1", "--ntasks=4", "--kill-on-bad-exit=0",
        "--container-image=charllm-kit:cuda"]
    run = command[command.index("charllm-kit"):]
    assert " ".join(run) == ("charllm-kit run llama3-8b --platform h100 --launcher slurm "
                             f"--nodes 4 --tp 8 --pp 2 --out {tmp_path}")
    assert not list(tmp_path.iterdir())  # nothing submitted, nothing written


TWO_NODES = ["submit", "gpt3-tiny", "--nodes", "2", "--tp", "2", "--dp", "2", "--steps", "2",
             "--partition", "ci", "--time", "5"]


@pytest.mark.timeout(120)
def test_submit_where_srun_has_no_pyxis_runs_this_python_and_says_so(slurm, tmp_path):
    """The cpu platform names an image; this cluster's srun has no pyxis to start it."""
    r = kit_cli(*TWO_NODES, "--out", str(tmp_path), "--dry-run")
    assert r.returncode == 0, why_failed(r)
    assert r.stderr == (
        "warning: this host's srun has no pyxis (no --container-image option): the job runs "
        "this Python on the nodes, not the cpu platform's image charllm-kit:cpu "
        "(--container-runtime apptainer runs that)\n")
    assert "--container-image" not in r.stdout
    assert f"--kill-on-bad-exit=0 {sys.executable} -m kit run gpt3-tiny" in " ".join(
        r.stdout.replace("\\\n", " ").split())
    asked = kit_cli(*TWO_NODES, "--container-runtime", "pyxis", "--out", str(tmp_path))
    assert asked.returncode == 2 and asked.stderr == (
        "error: --container-runtime pyxis: this host's srun has no pyxis (no --container-image "
        "option): a job using it fails at once; use --container-runtime apptainer or none\n")
    assert not list(tmp_path.iterdir())  # nothing submitted


@pytest.mark.timeout(120)
def test_submit_reports_a_job_that_failed_as_it_started(slurm, tmp_path):
    """Without --wait, submit still watches the job for a few seconds: one whose agents cannot
    start (an image no node has) is reported with Slurm's state and its output's last line."""
    r = kit_cli(*TWO_NODES, "--container-runtime", "apptainer", "--image",
                str(tmp_path / "no-such.sif"), "--out", str(tmp_path))
    assert r.returncode == 1, why_failed(r)
    job = r.stdout.split("submitted Slurm job ")[1].split(";")[0]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"error: job {job} FAILED (exit code "), r.stderr
    assert "within seconds, without a bundle: " in lines[0]
    assert lines[0].endswith(f"; see {tmp_path}/slurm-{job}.out")


@pytest.mark.timeout(60)
def test_submit_refused_by_sbatch_is_one_line(slurm, tmp_path):
    r = kit_cli(*SUBMIT, "--partition", "nosuchpartition", "--out", str(tmp_path))
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: sbatch refused the job: ")
    assert "partition" in r.stderr.lower(), r.stderr


@pytest.mark.timeout(300)
def test_submit_wait_writes_a_bundle_with_the_script_and_job_id(slurm, tmp_path):
    r = kit_cli(*SUBMIT, "--steps", "3", "--partition", "ci", "--time", "10",
                "--out", str(tmp_path), "--wait", timeout=280)
    assert r.returncode == 0, why_failed(r)
    job = r.stdout.split("submitted Slurm job ")[1].split(";")[0]
    assert f"job {job} RUNNING" in r.stderr
    bundle = bundle_path(r.stdout)
    assert kit_cli("bundle", "verify", str(bundle)).returncode == 0
    m = manifest(bundle)
    assert m["status"] == "ok" and m["slurm_job_id"] == job
    assert [n["slurm_node"] for n in m["inventory"]] == ["n1", "n2"]
    script = (bundle / "job" / "sbatch.sh").read_text()
    assert "#SBATCH --nodes=2" in script.splitlines() and "--launcher slurm" in script


@pytest.mark.timeout(420)
def test_sweep_launcher_slurm_one_job_per_point_and_resume_follows_them(slurm, tmp_path):
    sweep_file = tmp_path / "two.yaml"
    sweep_file.write_text("""name: two-jobs
base: {workload: gpt3-tiny, platform: cpu, nodes: 2, tp: 2, steps: 2, warmup: 1,
       telemetry_interval_ms: 0}
axes:
  - product: {seed: [1, 2]}
""")
    out = tmp_path / "out"
    args = [sys.executable, "-m", "kit", "sweep", str(sweep_file), "--launcher", "slurm",
            "--container-runtime", "none", "--partition", "ci", "--time", "10", "--out", str(out)]
    index = out / "two-jobs" / "sweep.json"
    first = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, preexec_fn=default_sigint)
    deadline = time.monotonic() + 120
    jobs = []
    while time.monotonic() < deadline and first.poll() is None:
        if index.is_file():
            jobs = [p["job"] for p in json.loads(index.read_text())["points"]]
            if all(jobs):
                break
        time.sleep(0.3)
    assert len(jobs) == 2 and all(jobs), first.communicate()
    first.send_signal(2)  # the sweep stops following; its jobs run on
    assert first.wait(60) == 130, first.communicate()

    r = subprocess.run([*args, "--resume"], cwd=REPO, capture_output=True, text=True,
                       timeout=360)
    assert r.returncode == 0, why_failed(r)
    points = json.loads(index.read_text())["points"]
    assert [p["job"] for p in points] == jobs  # followed or kept, not submitted again
    assert [p["status"] for p in points] == ["ok", "ok"]
    for p in points:
        bundle = out / "two-jobs" / p["bundle"]
        assert kit_cli("bundle", "verify", str(bundle)).returncode == 0
        assert manifest(bundle)["slurm_job_id"] == p["job"]


@pytest.mark.timeout(60)
def test_submit_dry_run_json_is_the_script_as_data(tmp_path):
    r = kit_cli(*SUBMIT, "--out", str(tmp_path), "--dry-run", "--json")
    assert r.returncode == 0, why_failed(r)
    answer = json.loads(r.stdout)
    assert answer["out"] == str(tmp_path)
    plain = kit_cli(*SUBMIT, "--out", str(tmp_path), "--dry-run")
    assert answer["script"] == plain.stdout
    assert not list(tmp_path.iterdir())


@pytest.mark.timeout(300)
def test_submit_json_answers_one_object_and_errors_as_json(slurm, tmp_path):
    refused = kit_cli(*SUBMIT, "--partition", "nosuchpartition", "--out", str(tmp_path),
                      "--json")
    assert refused.returncode == 2 and refused.stderr == ""
    assert json.loads(refused.stdout)["error"].startswith("sbatch refused the job: ")

    r = kit_cli(*SUBMIT, "--steps", "3", "--partition", "ci", "--time", "10",
                "--out", str(tmp_path), "--wait", "--json", timeout=280)
    assert r.returncode == 0, why_failed(r)
    assert r.stdout.count("\n") == 1  # one object; the progress lines went to stderr
    answer = json.loads(r.stdout)
    job = answer["job"]
    assert f"job {job} " in r.stderr
    assert answer["out"] == str(tmp_path) and answer["output"] == f"{tmp_path}/slurm-{job}.out"
    assert answer["status"] == "ok" and answer["error"] is None
    bundle = Path(answer["bundle"])
    assert bundle.parent == tmp_path and manifest(bundle)["slurm_job_id"] == job
    assert kit_cli("bundle", "verify", str(bundle)).returncode == 0
    kept = Path(answer["script"]).read_text()  # the script submitted, as Slurm kept it
    assert kept == (bundle / "job" / "sbatch.sh").read_text()
    assert "#SBATCH --nodes=2" in kept.splitlines()

    r = kit_cli(*SUBMIT, "--steps", "2", "--partition", "ci", "--out", str(tmp_path), "--json")
    assert r.returncode == 0, why_failed(r)
    answer = json.loads(r.stdout)
    assert set(answer) == {"job", "out", "output", "script"} and answer["job"] != job
    subprocess.run(["scancel", answer["job"]], check=True)
    deadline = time.monotonic() + 60  # let its agents publish before the folder goes
    while subprocess.run(["squeue", "-h", "-j", answer["job"], "-o", "%i"], capture_output=True,
                         text=True).stdout.strip() and time.monotonic() < deadline:
        time.sleep(0.3)
