"""A run survives its own failures: signals to its group, a dead sampler, a dead launcher, a
full disk. Real runs over gloo, real signals; every test has its own timeout, so a hang fails
the test instead of holding CI.
"""

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest

from kit.bundle.verify import verify_bundle
from kit.launch.assemble import run_end
from kit.launch.local import LaunchOutcome, RankExit
from kit.launch.rankfile import RankResult

from .conftest import (
    REPO,
    bundle_path,
    kit_cli,
    losses_by_rank,
    start_long_run,
    wait_for_steps,
    why_failed,
)


def manifest(bundle: Path) -> dict:
    return json.loads((bundle / "manifest.json").read_text())


def metrics(bundle: Path) -> dict:
    return json.loads((bundle / "metrics.json").read_text())


def sampler_pid(launcher_pid: int) -> int:
    """The telemetry sampler: the launcher's multiprocessing child (spawn_main)."""
    for child in psutil.Process(launcher_pid).children():
        if any("spawn_main" in part for part in child.cmdline()):
            return child.pid
    raise AssertionError("no sampler process found")


def gone(pids: list[int]) -> bool:
    """Whether none of ``pids`` runs (a zombie no one reaps has ended too)."""
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            continue
    return True


@pytest.mark.training
@pytest.mark.timeout(240)
def test_sigterm_to_the_whole_group_publishes_an_interrupted_bundle(tmp_path):
    """What `timeout`, scancel and systemd do: SIGTERM to every process of the job's group
    (launcher and sampler), then more signals while it shuts down: the second cuts the ranks'
    grace short, and wherever the launcher is when they land its exit code is 1."""
    proc = start_long_run(tmp_path)
    wait_for_steps(tmp_path, 2)
    os.killpg(proc.pid, signal.SIGTERM)
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)  # and an impatient Ctrl-C
    os.killpg(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=180)  # a hang guard, not a speed bound
    assert proc.returncode == 1, err
    bundle = bundle_path(out)
    verify_bundle(bundle)
    m = manifest(bundle)
    assert m["status"] == "interrupted" and m["error"].startswith("stopped by signal SIGTERM")
    assert {r["status"] for r in m["ranks"]} == {"interrupted"}
    # the impatient Ctrl-C reaches the ranks too and may stop one inside a step its peer has
    # finished (seen on a loaded host: 3 steps and 2): the steps both finished are the same
    losses = losses_by_rank(bundle)
    common = min(len(losses[0]), len(losses[1]))
    assert common >= 2 and losses[0][:common] == losses[1][:common]
    assert pq.read_table(bundle / "telemetry.parquet").num_rows > 0  # the sampler's last chunk


@pytest.mark.training
@pytest.mark.timeout(240)
def test_signals_until_the_launcher_exits_do_not_change_its_exit_code(tmp_path):
    """A job's end can keep signalling while the launcher assembles, publishes and prints: a
    SIGINT or SIGTERM every 20 ms from the first until the process is gone hits every moment
    from staging to exit, publication to exit included, where a default handler would end it
    with -2 or 143. The exit code is the one documented for an interrupted run: 1."""
    proc = start_long_run(tmp_path)
    wait_for_steps(tmp_path, 2)
    os.killpg(proc.pid, signal.SIGTERM)

    def keep_signalling() -> None:
        for n in itertools.count():
            if proc.poll() is not None:
                return
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT if n % 2 else signal.SIGTERM)
            time.sleep(0.02)

    storm = threading.Thread(target=keep_signalling, daemon=True)
    storm.start()
    out, err = proc.communicate(timeout=120)
    storm.join()
    assert proc.returncode == 1, err
    bundle = bundle_path(out)
    verify_bundle(bundle)
    m = manifest(bundle)
    # the first is the group's SIGTERM, unless the storm's first SIGINT came within the 20 ms
    # before the launcher was scheduled: the kernel delivers signals pending together lowest
    # number first, and nothing can tell which was sent first (seen beside the suite's workers)
    assert m["status"] == "interrupted" and m["error"].startswith((
        "stopped by signal SIGTERM", "stopped by signal SIGINT")), m["error"]


@pytest.mark.training
@pytest.mark.timeout(240)
def test_a_sigterm_repeated_within_2_s_still_lets_the_ranks_stop_at_a_step_boundary(tmp_path):
    """Slurm's scancel signals the task and srun forwards the same SIGTERM again: one request,
    so the ranks end by themselves at a step boundary instead of being killed. Steps of 8
    micro-batches keep them busy well past the second signal."""
    proc = start_long_run(tmp_path, "--tp", "2", "--global-batch", "64")
    wait_for_steps(tmp_path, 2)
    proc.send_signal(signal.SIGTERM)
    wait_until_delivered(proc.pid, signal.SIGTERM)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    bundle = bundle_path(out)
    verify_bundle(bundle)
    m = manifest(bundle)
    assert m["status"] == "interrupted"
    # Python runs a handler once for signals that arrived while the main thread waited for the
    # CPU (under load, longer than the 0.3 s): the count may then be 1, the stop the same
    assert m["error"].startswith(("stopped by signal SIGTERM (2 signals in all)",
                                  "stopped by signal SIGTERM before")), m["error"]
    assert [(r["status"], r["signal"]) for r in m["ranks"]] == [("interrupted", None)] * 2


def wait_until_delivered(pid: int, sig: signal.Signals, timeout_s: float = 30) -> None:
    """Block until no thread of ``pid`` has ``sig`` pending: the kernel has delivered it (two
    SIGTERMs pending together are one)."""
    bit = 1 << (sig - 1)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        texts = []
        for status in (Path(f"/proc/{pid}/status"), *Path(f"/proc/{pid}/task").glob("*/status")):
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # a thread ended
                texts.append(status.read_text())
        pending = [int(line.split()[1], 16) for text in texts for line in text.splitlines()
                   if line.startswith(("SigPnd:", "ShdPnd:"))]
        if not any(p & bit for p in pending):
            return
        time.sleep(0.01)
    raise AssertionError(f"{sig.name} still pending in {pid} after {timeout_s} s")


@pytest.mark.training
@pytest.mark.timeout(600)
def test_a_killed_sampler_is_a_lost_telemetry_source_not_a_lost_run(tmp_path):
    """SIGKILL of the sampler (what a segfault in a vendor library looks like): the run goes
    on to the end, the bundle says telemetry stopped early, and keeps the rows written.

    30 steps: the sampler's first chunk is written before rank 0's second step ends (the
    ranks take seconds to start, the sampler flushes every 2 s), so the kill comes with 28
    steps to go; 150 would take 17 minutes at the 7 s a step seen on a host at load 22."""
    proc = start_long_run(tmp_path, "--tp", "1", steps=30)
    wait_for_steps(tmp_path, 2)
    chunk = tmp_path.glob(".*.partial/telemetry-chunks/chunk-000000.parquet")
    deadline = time.monotonic() + 60
    while next(chunk, None) is None and time.monotonic() < deadline:  # flushed every 2 s
        time.sleep(0.1)
        chunk = tmp_path.glob(".*.partial/telemetry-chunks/chunk-000000.parquet")
    os.kill(sampler_pid(proc.pid), signal.SIGKILL)
    out, err = proc.communicate(timeout=500)
    assert proc.returncode == 0, err
    bundle = bundle_path(out)
    verify_bundle(bundle)
    assert manifest(bundle)["status"] == "ok"
    assert any("sampler process was killed by SIGKILL" in n for n in metrics(bundle)["notes"])
    host = manifest(bundle)["telemetry_sources"]["cpu_util_pct"]
    assert host["source"] == "host" and "ended early" in host["reason"]
    rows = pq.read_table(bundle / "telemetry.parquet").num_rows
    assert rows > 0
    assert len(losses_by_rank(bundle)[0]) == 31


@pytest.mark.training
@pytest.mark.timeout(300)
def test_a_killed_launcher_takes_its_ranks_along_and_its_staging_is_recovered(tmp_path):
    """The OOM killer takes the launcher: its ranks stop within seconds instead of training on
    as orphans, and `bundle recover` publishes what the run streamed, status failed."""
    proc = start_long_run(tmp_path, steps=100000)
    for rank in (0, 1):  # both ranks' records: on a busy host one lags the other
        wait_for_steps(tmp_path, 3, rank=rank)
    staging = next(tmp_path.glob(".*.partial"))
    live = kit_cli("bundle", "recover", str(staging), timeout=120)
    assert live.returncode == 2 and "still running" in live.stderr  # it publishes itself

    ranks = [c.pid for c in psutil.Process(proc.pid).children()
             if "kit.launch.worker" in " ".join(c.cmdline())]
    assert len(ranks) == 2
    proc.kill()
    proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while not gone(ranks) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert gone(ranks), "ranks outlived their launcher by 30 s"
    time.sleep(1)  # the sampler sees its parent gone and writes its last chunk

    # recovered from "another host" (a UTS namespace of its own): the bundle says whose
    # inventory it then holds
    r = subprocess.run(["unshare", "-ru", "sh", "-c", f"hostname elsewhere && exec "
                        f"{sys.executable} -m kit bundle recover {staging}"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, why_failed(r)
    bundle = Path(r.stdout.strip().splitlines()[-1])
    verify_bundle(bundle)
    m = manifest(bundle)
    assert m["status"] == "failed" and m["error"].startswith("launcher was killed")
    notes = json.loads((bundle / "metrics.json").read_text())["notes"]
    assert any(n.startswith("recovered on elsewhere, not on ") for n in notes), notes
    assert m["inventory"][0]["host"] == "elsewhere"
    assert m["command"][-4:] == ["--warmup", "1", "--out", str(tmp_path)]
    assert [r["tp_rank"] for r in m["ranks"]] == [0, 1]
    losses = losses_by_rank(bundle)
    assert len(losses[0]) >= 3 and len(losses[1]) >= 3
    assert pq.read_table(bundle / "telemetry.parquet").num_rows > 0
    assert not staging.exists()

    again = kit_cli("bundle", "recover", str(staging), timeout=120)
    assert again.returncode == 2 and "not a staging folder" in again.stderr
    not_staging = kit_cli("bundle", "recover", str(bundle), timeout=120)
    assert not_staging.returncode == 2 and "not a staging folder" in not_staging.stderr
    fake = tmp_path / ".20260101T000000Z-x-cpu-000000.partial"
    fake.mkdir()
    empty = kit_cli("bundle", "recover", str(fake), timeout=120)
    assert empty.returncode == 2 and "no launcher.json" in empty.stderr
    assert len(empty.stderr.strip().splitlines()) == 1


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 4 MiB tmpfs of our own to fill (needs root and mount rights; skipped without)."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip() or r.returncode}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(path: Path) -> None:
    """Write zeros to ``path`` until the filesystem is full."""
    block = b"\0" * 65536
    with path.open("wb", buffering=0) as f:
        try:
            while True:
                f.write(block)
        except OSError:
            pass
        try:
            while True:
                f.write(b"\0" * 512)
        except OSError:
            pass


@pytest.mark.training
@pytest.mark.timeout(300)
def test_a_full_disk_names_the_path_and_the_run_stays_recoverable(small_tmpfs):
    out = small_tmpfs / "results"
    proc = start_long_run(out, "--tp", "1", steps=100000)
    wait_for_steps(out, 3)
    filler = small_tmpfs / "filler"
    fill(filler)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stderr
    staging = next(out.glob(".*.partial"))
    *progress, last = stderr.strip().splitlines()
    assert last.startswith(f"error: {staging}/") and "no space left on device" in last
    assert f"charllm-kit bundle recover {staging}" in last
    # one line says it: no tracebacks of the sampler (or anything else) before it
    assert all(line.startswith("gpt3-tiny on cpu x1: ") for line in progress), stderr

    filler.unlink()
    r = kit_cli("bundle", "recover", str(staging), timeout=120)
    assert r.returncode == 0, why_failed(r)
    bundle = Path(r.stdout.strip().splitlines()[-1])
    verify_bundle(bundle)
    m = manifest(bundle)
    assert m["status"] == "failed" and m["error"].endswith(
        "could not write the bundle: no space left on device"), m["error"]
    assert "No space left on device" in " ".join(m["ranks"][0]["log_tail"])
    assert len(losses_by_rank(bundle)[0]) >= 3  # the steps streamed before the disk filled


def test_a_missing_staging_folder_is_one_line_and_exit_2(tmp_path):
    r = subprocess.run([sys.executable, "-m", "kit", "bundle", "recover", str(tmp_path / "x")],
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_a_rank_that_aborts_after_writing_its_ok_result_leaves_the_run_ok(tmp_path):
    """DeepSpeed's ZeRO-3 teardown has aborted at exit (SIGABRT) after every step and the
    result were written: the measurements are whole, so a note, not a failed run. A rank that
    ends badly without an ok result still fails it."""
    ok = [RankResult(rank=r, local_rank=r, node=0, status="ok") for r in (0, 1)]
    exits = {0: RankExit(0, None, 10.0), 1: RankExit(None, "SIGABRT", 10.5)}
    end = run_end(LaunchOutcome(exits=exits, started=True), ok, tmp_path, None)
    assert (end.status, end.error) == ("ok", None)
    assert end.notes == ["rank 1: killed by SIGABRT after writing its ok result (at exit, e.g. "
                         "in the framework's teardown); its steps are complete"]
    end = run_end(LaunchOutcome(exits=exits, started=True), [ok[0], None], tmp_path, None)
    assert end.status == "failed" and end.error.startswith("rank 1: killed by SIGABRT")
