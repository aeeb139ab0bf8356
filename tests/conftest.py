"""Shared helpers: run the real CLI in a subprocess, the way users and scripts do."""

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from filelock import FileLock

REPO = Path(__file__).resolve().parent.parent

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
"""The suite runs three pytest-xdist workers on a host's cores, so its ranks share cores with the
other workers': OpenMP threads that spin at a barrier while a peer thread waits for a core then
burn the core the other needs. A 30-step 1-rank gpt3-tiny run beside one busy process on a
2-core host took 20-107 s of CPU spinning and 14-19 s passive, six runs of each (2026-12-06,
benchmarks/reliability/results/run-cpu-cost-2026-12-06.txt); on idle cores spinning is faster
(0.16-0.19 s a step against 0.24-0.30), which is why the kit leaves the policy to the user.
Set before any test imports torch (libgomp reads it once); every run a test starts inherits it."""


WORKER = os.environ.get("PYTEST_XDIST_WORKER")
"""This pytest-xdist worker's name (gw0, gw1, ...), or None in a suite run in one process."""


CPU_RECORD = "CHARLLM_TEST_CPU"
"""Where to record each test phase's wall and CPU seconds (a TSV), when set."""
_record: str | None = None


def pytest_configure(config: pytest.Config) -> None:
    """Take the per-test CPU record's path out of the environment, so that a pytest a test
    starts does not write into it, and start the record with its header; an xdist worker gets
    the path from its controller (``pytest_configure_node``)."""
    global _record
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        _record = workerinput.get(CPU_RECORD)
        return
    path = os.environ.pop(CPU_RECORD, None)
    _record = str(Path(path).resolve()) if path else None
    if _record:
        Path(_record).write_text("worker\tnodeid\tphase\twall_s\tcpu_self_s\tcpu_children_s\n")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """pytest-xdist's controller: hand each worker the CPU record's path."""
    node.workerinput[CPU_RECORD] = _record


TIER_OF_FIXTURE = {
    "cpu_run": "training", "cpu_bundle": "training", "gpt3_tiny_reference": "training",
    "tp2_dp2_bundle": "training", "slowed_rank_run": "training",
    "slurm": "slurm", "cpu_image": "image",
}
"""The shared fixtures that start ranks, a Slurm cluster or an image build, and the tier marker
(pyproject.toml's ``markers``) a test that uses one gets, directly or through another fixture;
tests that start such work themselves carry the marker in their module."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with the tiers of the fixtures it uses (``./run.sh test --fast`` leaves
    out ``training``, ``slurm`` and ``image``)."""
    for item in items:
        for tier in {TIER_OF_FIXTURE[f] for f in item.fixturenames if f in TIER_OF_FIXTURE}:
            item.add_marker(tier)


def _cpu_s(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


@contextmanager
def _measured(item: pytest.Item, phase: str) -> Iterator[None]:
    """Append one row for this phase of ``item`` to ``CHARLLM_TEST_CPU`` (when set): its wall
    time and the CPU this process and its reaped children used meanwhile, to tell a test that
    waits (sleeps, grace periods, polling) from one that computes."""
    if not _record:
        yield
        return
    start = (time.monotonic(), _cpu_s(resource.RUSAGE_SELF), _cpu_s(resource.RUSAGE_CHILDREN))
    try:
        yield
    finally:
        wall = time.monotonic() - start[0]
        own = _cpu_s(resource.RUSAGE_SELF) - start[1]
        children = _cpu_s(resource.RUSAGE_CHILDREN) - start[2]
        with open(_record, "a") as f:  # one short append per row: workers share the file
            f.write(f"{WORKER or '-'}\t{item.nodeid}\t{phase}\t{wall:.2f}\t{own:.2f}"
                    f"\t{children:.2f}\n")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    with _measured(item, "setup"):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    with _measured(item, "call"):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item):
    with _measured(item, "teardown"):
        return (yield)


def shared(tmp_path_factory: pytest.TempPathFactory, name: str,
           build: Callable[[Path], Any]) -> Any:
    """What ``build(folder)`` returns (JSON), built once per test session into a new folder.

    A suite spread over pytest-xdist workers builds it once for all of them: the first worker to
    need it builds it in the session's common temporary folder, under a file lock, and the
    others wait for it and read what it wrote. What it builds is shared: copy before changing.
    """
    if WORKER is None:
        return build(tmp_path_factory.mktemp(name))
    root = tmp_path_factory.getbasetemp().parent / "shared"
    root.mkdir(exist_ok=True)
    answer = root / f"{name}.json"
    with FileLock(str(root / f"{name}.lock")):
        if answer.is_file():
            return json.loads(answer.read_text())
        folder = root / name
        if folder.exists():  # a build that failed in another worker: start afresh
            shutil.rmtree(folder)
        folder.mkdir()
        value = build(folder)
        answer.write_text(json.dumps(value))
        return value


def first_on_pythonpath(folder: Path) -> dict[str, str]:
    """The PYTHONPATH that puts ``folder`` (a test's ``sitecustomize`` or stand-in package)
    first, keeping what is there (the GPU machine's carried wheels are on it)."""
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH"))
                                          if p)}


def kit_cli(*args: str, timeout: float = 600, **kw) -> subprocess.CompletedProcess:
    """Run ``python -m kit ARGS`` and capture its output."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run(
        [sys.executable, "-m", "kit", *args], capture_output=True, text=True, timeout=timeout,
        cwd=REPO, env=env, **kw,
    )


@pytest.fixture
def cli():
    """The ``kit_cli`` runner."""
    return kit_cli


def bundle_path(stdout: str) -> Path:
    """The last stdout line of ``run`` is the bundle path."""
    return Path(stdout.strip().splitlines()[-1])


def why_failed(r: subprocess.CompletedProcess) -> str:
    """What a failed ``run`` said: its stderr and, when it published a bundle, the bundle's
    error, each failed rank's error and the tail of every rank log (CI keeps no bundles)."""
    lines = [r.stderr]
    try:
        bundle = bundle_path(r.stdout)
        manifest = json.loads((bundle / "manifest.json").read_text())
    except (IndexError, OSError, ValueError):
        return "\n".join([*lines, f"stdout: {r.stdout[-2000:]}"])
    lines.append(f"bundle {bundle}: {manifest['status']}: {manifest['error']}")
    lines += [f"rank {x['rank']}: {x['status']}: {x['error']}" for x in manifest["ranks"]
              if x["status"] != "ok"]
    for log in sorted((bundle / "logs").glob("*.log")):
        tail = log.read_text(errors="replace").splitlines()[-15:]
        lines += [f"--- {log.name}", *tail]
    return "\n".join(lines)


def recover_once_stopped(staging: Path, timeout_s: float = 60) -> subprocess.CompletedProcess:
    """``bundle recover STAGING``, retried while it refuses because processes of the run still
    stop (orphaned ranks end within their grace); fails the test past ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while (r := kit_cli("bundle", "recover", str(staging), timeout=60)).returncode == 2:
        assert "still run" in r.stderr and time.monotonic() < deadline, r.stderr
        time.sleep(1)
    return r


def losses_by_rank(bundle: Path) -> dict[int, list[float]]:
    """Each rank's loss per step, in step order, from a bundle's steps.parquet."""
    rows = pq.read_table(bundle / "steps.parquet").to_pylist()
    out: dict[int, list[float]] = {}
    for r in sorted(rows, key=lambda r: (r["rank"], r["step"])):
        out.setdefault(r["rank"], []).append(r["loss"])
    return out


@pytest.fixture(scope="session")
def gpt3_tiny_reference(tmp_path_factory) -> Path:
    """One-process gpt3-tiny run (5 steps): the reference equivalent layouts must match."""
    def build(out: Path) -> str:
        r = kit_cli("run", "gpt3-tiny", "--steps", "4", "--warmup", "1", "--out", str(out))
        assert r.returncode == 0, why_failed(r)
        return str(bundle_path(r.stdout))

    return Path(shared(tmp_path_factory, "gpt3-tiny-tp1", build))


@pytest.fixture(scope="session")
def cpu_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """One real 2-rank (TP 2) gpt3-tiny CPU run (4 measured steps), shared: its bundle (copy it
    before changing it) and how the CLI ended (stdout, stderr)."""
    def build(out: Path) -> list:
        r = kit_cli("run", "gpt3-tiny", "--tp", "2", "--steps", "4", "--warmup", "1",
                    "--out", str(out))
        assert r.returncode == 0, why_failed(r)
        return [r.args, r.returncode, r.stdout, r.stderr]

    r = subprocess.CompletedProcess(*shared(tmp_path_factory, "cpu-run", build))
    return bundle_path(r.stdout), r


@pytest.fixture(scope="session")
def cpu_bundle(cpu_run) -> Path:
    """The shared TP 2 CPU run's bundle (``cpu_run``): copy it before changing it."""
    return cpu_run[0]


TP2_DP2 = ("run", "gpt3-tiny", "--tp", "2", "--dp", "2")
"""The README tour's 4-rank run."""


@pytest.fixture(scope="session")
def tp2_dp2_bundle(tmp_path_factory) -> Path:
    """One real TP2 x DP2 gpt3-tiny run (3 steps), the README tour's ``run`` line, shared by the
    tests that check its layout and the tour's ``project`` line: copy it before changing it."""
    def build(out: Path) -> str:
        r = kit_cli(*TP2_DP2, "--steps", "3", "--warmup", "1", "--out", str(out))
        assert r.returncode == 0, why_failed(r)
        return str(bundle_path(r.stdout))

    return Path(shared(tmp_path_factory, "tp2-dp2", build))


def default_sigint() -> None:
    """``preexec_fn`` for a child a test interrupts with SIGINT as a terminal's Ctrl-C would:
    SIGINT at its default, as in a shell's foreground job. A suite started in the background
    of a shell without job control inherits SIGINT ignored, and a Python child that inherits it
    ignored never raises KeyboardInterrupt (the kit's own runs install their own handler)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_long_run(out: Path, *args: str, steps: int = 500) -> subprocess.Popen:
    """A run (default: 2 ranks, TP 2) far longer than any test waits for.

    It starts in a process group and session of its own (its pid is the group id), as a job
    started by Slurm, systemd or ``timeout`` is, so a test can signal the whole group.
    """
    return subprocess.Popen(
        [sys.executable, "-m", "kit", "run", "gpt3-tiny", *(args or ("--tp", "2")),
         "--steps", str(steps), "--warmup", "1", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        start_new_session=True,
    )


def wait_for_steps(out: Path, steps: int, timeout_s: float = 300, rank: int = 0) -> None:
    """Block until ``rank`` of the run staged under ``out`` has streamed ``steps`` steps."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        progress = next(out.glob(f".*.partial/ranks/rank{rank}.steps.jsonl"), None)
        if progress is not None and progress.read_text().count("\n") >= steps:
            return
        time.sleep(0.2)
    raise AssertionError(f"the run did not reach {steps} steps in {timeout_s} s")


def recorded_rank_pids(staging: Path) -> dict[int, int]:
    """Pids of a run's ranks by global rank, as its launcher or node agents recorded them
    (those of ranks not started yet are missing)."""
    from kit.launch.rankfile import NODES_DIR, read_launcher_record, read_node_record

    pids = dict(enumerate(read_launcher_record(staging).rank_pids))
    for path in (staging / NODES_DIR).glob("node*.json"):
        record = read_node_record(staging, int(path.stem.removeprefix("node")))
        if record is not None:
            pids.update(zip(record.ranks, record.rank_pids, strict=False))
    return pids


def rank_pid(launcher_pid: int, rank: int) -> int | None:
    """PID of the rank ``rank`` the launcher (or node agent) ``launcher_pid`` started: a child
    running the worker with RANK=rank in its environment, or, for ranks forked on a CPU
    platform (whose ``/proc`` environment is their zygote's), the pid its launcher or node
    agent recorded."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            ppid = int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("PPid")))
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        except (OSError, StopIteration):
            continue
        if ppid != launcher_pid or "kit.launch.worker" not in argv:
            continue
        if f"RANK={rank}".encode() in env:
            return int(pid)
        if not any(v.startswith(b"RANK=") for v in env):  # forked: the launcher's record
            folder = argv[argv.index("kit.launch.worker") + 1]
            staging = Path(f"/proc/{pid}/cwd").resolve() / folder
            try:
                pids = recorded_rank_pids(staging)
            except (OSError, ValueError):  # not written yet
                continue
            if rank in pids:
                return pids[rank]
    return None


def signal_if_alive(pid: int | None, sig: signal.Signals) -> None:
    """Send ``sig`` to ``pid`` unless it is gone (or was never found): a test's cleanup."""
    if pid is None:
        return
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def duty_cycle(pid: int, stop_s: float, run_s: float, until: Callable[[], bool]) -> None:
    """Slow process ``pid`` down without stopping it for good: SIGSTOP for ``stop_s``, SIGCONT
    for ``run_s``, over and over until ``until()`` or the process is gone; it ends continued."""
    try:
        while not until():
            os.kill(pid, signal.SIGSTOP)
            time.sleep(stop_s)
            os.kill(pid, signal.SIGCONT)
            time.sleep(run_s)
    except ProcessLookupError:
        return
    finally:
        signal_if_alive(pid, signal.SIGCONT)


@pytest.fixture(scope="session")
def slowed_rank_run(tmp_path_factory) -> subprocess.CompletedProcess:
    """A DP 2 gpt3-tiny run (16 measured steps, --stall-timeout-s 20) whose rank 1 is slowed
    from its third step on: stopped 0.7 s of every second. Its sampler replays the recorded
    one-GPU H100 trace (device 0 only: rank 0's device). How its launcher ended."""
    def build(out: Path) -> list:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kit", "run", "gpt3-tiny", "--dp", "2", "--steps", "16",
             "--warmup", "1", "--stall-timeout-s", "20", "--out", str(out),
             "--platform", str(REPO / "tests/data/platforms/cpu-replay-h100.yaml")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
        try:
            wait_for_steps(out, 2)
            pid = rank_pid(proc.pid, 1)
            assert pid is not None, "rank 1 not found"
            duty_cycle(pid, 0.7, 0.3, lambda: proc.poll() is not None)
            stdout, stderr = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
        return [proc.args, proc.returncode, stdout, stderr]

    return subprocess.CompletedProcess(*shared(tmp_path_factory, "slowed-rank", build))
