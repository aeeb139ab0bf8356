"""Start-up: the compile cache (keyed, never stale, reused), the lifecycle a run reports (with
run.sh's set-up as its own phase), and the imports a rank no longer pays for."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from kit.cache import bytecode_precompile, compile_cache
from kit.launch.local import free_port

from .conftest import REPO, bundle_path, kit_cli, why_failed

PROBE = """
import json, sys
from kit.cache import bytecode_precompile, compile_cache
info = compile_cache.prepare()  # before torch, as a rank inherits it from its launcher
import torch
from torch._dynamo.utils import counters
from kit.engines.kernels.cross_entropy import _sum_exp_and_target
from kit.engines.kernels.deferred_compile import deferred_torch_compile
with deferred_torch_compile():  # the way megatron-core's fusions are decorated
    fn = torch.compile(_sum_exp_and_target, dynamic=False, fullgraph=True)
ok = []
for shape, dtype in json.loads(sys.argv[1]):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(*shape, generator=g).to(getattr(torch, dtype))
    row_max = logits.amax(-1).float()
    target = torch.randint(0, shape[-1], shape[:-1], generator=g)
    got = fn(logits, row_max, target, 0, shape[-1])
    want = _sum_exp_and_target(logits, row_max, target, 0, shape[-1])
    ok.append(got.shape == want.shape and torch.allclose(got, want, rtol=1e-3, atol=1e-3))
print(json.dumps({"ok": ok, "hits": counters["inductor"]["fxgraph_cache_hit"],
                  "misses": counters["inductor"]["fxgraph_cache_miss"], **info}))
"""


def _probe(cache: Path, cases: list) -> dict:
    env = dict(os.environ, **{compile_cache.CACHE_ENV: str(cache)}, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-c", PROBE, json.dumps(cases)], capture_output=True,
                       text=True, cwd=REPO, env=env, timeout=1500)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_the_cache_folder_changes_with_every_part_of_its_key():
    parts = compile_cache.key_parts()
    assert set(parts) == {"torch", "megatron-core", "deepspeed", "triton", "python", "kit",
                          "git_commit", "engine_sources"}
    keys = {compile_cache.cache_key(parts)}
    for name in parts:
        keys.add(compile_cache.cache_key({**parts, name: parts[name] + "-changed"}))
    assert len(keys) == len(parts) + 1


@pytest.mark.timeout(3000)
def test_a_changed_shape_or_dtype_compiles_anew_and_the_same_one_is_reused(tmp_path):
    """The kit's cross-entropy kernel compiled by inductor (on CPU: C++) in one process, then
    in a fresh one: the second process loads the first one's artifact, and a new shape or dtype
    never takes a stale one (each is a miss, and every result matches eager)."""
    cold = _probe(tmp_path, [[[4, 16], "float32"]])
    assert cold["ok"] == [True] and cold["warm"] is False
    assert cold["misses"] == 1 and cold["hits"] == 0
    inductor = Path(cold["dir"]) / "inductor"
    assert Path(cold["dir"]).parent == tmp_path and any(inductor.rglob("*.so"))
    before = compile_cache.entries(Path(cold["dir"]))

    warm = _probe(tmp_path, [[[4, 16], "float32"], [[8, 32], "float32"], [[4, 16], "float64"]])
    assert warm["ok"] == [True, True, True] and warm["warm"] is True
    assert warm["hits"] == 1, "the same kernel, shape and dtype: loaded from the cache"
    assert warm["misses"] == 2, "another shape and another dtype: compiled anew"
    assert compile_cache.entries(Path(warm["dir"])) > before


@pytest.mark.training
@pytest.mark.timeout(900)
def test_a_run_reports_its_phases_cache_and_run_sh_set_up_apart(tmp_path):
    """A run started the way run.sh starts it (set-up, then exec in the same process): the
    set-up is its own phase, outside launch-to-first-step; ``--json`` carries the lifecycle
    and the compile cache, which the manifest records too."""
    cache = tmp_path / "cache"
    end = time.time()
    start = end - 100.0
    cmd = (f'export CHARLLM_SETUP="$$ {start:.3f} {end:.3f}"; exec {sys.executable} -m kit run '
           f"gpt3-tiny --steps 2 --warmup 1 --out {tmp_path / 'out'} --compile-cache {cache} "
           "--json")
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, cwd=REPO,
                       timeout=800)
    assert r.returncode == 0, why_failed(r)
    answer = json.loads(r.stdout.strip().splitlines()[-1])
    life = answer["lifecycle"]
    assert life["setup_s"] == pytest.approx(100.0, abs=0.002)
    assert set(life["phases_s"]) == {"launcher", "rank_imports", "engine_imports",
                                     "process_groups", "model_build", "first_step", "rank_exit",
                                     "ranks_reaped", "sampler_stop", "bundle_start"}
    assert all(v is not None for v in life["phases_s"].values())
    start_phases = ("launcher", "rank_imports", "engine_imports", "process_groups",
                    "model_build", "first_step")
    assert life["launch_to_first_step_end_s"] == pytest.approx(
        sum(life["phases_s"][p] for p in start_phases), abs=0.01)
    assert life["last_step_to_published_s"] >= life["last_step_to_assembly_s"]
    used = answer["compile_cache"]
    assert Path(used["dir"]).parent == cache and used["warm"] is False
    manifest = json.loads((Path(answer["bundle"]) / "manifest.json").read_text())
    assert manifest["compile_cache"]["dir"] == used["dir"]
    assert manifest["compile_cache"]["key"] == compile_cache.key_parts()
    metrics = json.loads((Path(answer["bundle"]) / "metrics.json").read_text())
    assert metrics["lifecycle"]["setup_s"] == life["setup_s"]


@pytest.mark.training
@pytest.mark.timeout(300)
def test_the_table_says_the_set_up_and_the_cache(tmp_path):
    r = kit_cli("run", "gpt3-tiny", "--steps", "1", "--warmup", "0", "--telemetry-interval-ms",
                "0", "--out", str(tmp_path), "--compile-cache", "off")
    assert r.returncode == 0, why_failed(r)
    assert "time outside the steps: launch to first step done" in r.stdout
    assert "set-up" not in r.stdout and "compile cache" not in r.stdout
    manifest = json.loads((bundle_path(r.stdout) / "manifest.json").read_text())
    assert manifest["compile_cache"] is None


def test_another_process_ignores_run_sh_set_up():
    """A child of run.sh's process (another pid) starts its clock at its own start."""
    code = ("from kit.lifecycle import launcher_marks; m = launcher_marks(); "
            "print('setup_started' in m.times)")
    env = dict(os.environ, CHARLLM_SETUP=f"1 {time.time() - 50:.3f} {time.time():.3f}",
               PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr


def test_cache_show_lists_and_clear_keeps_this_installation(tmp_path, monkeypatch):
    monkeypatch.setenv(compile_cache.CACHE_ENV, str(tmp_path))
    current = tmp_path / compile_cache.cache_key(compile_cache.key_parts())
    stale = tmp_path / "torch0.0-py3.0-0123456789abcdef"
    for folder in (current / "inductor", stale / "triton"):
        folder.mkdir(parents=True)
        (folder / "artifact").write_text("x")
    r = kit_cli("cache", "show")
    assert r.returncode == 0, why_failed(r)
    assert str(tmp_path) in r.stdout and f"{current.name} (current)" in r.stdout
    rows = {line.split()[0]: " ".join(line.split()[1:]) for line in r.stdout.splitlines()}
    assert rows[stale.name] == "1 files, 0.0 MiB"
    r = kit_cli("cache", "clear")
    assert r.returncode == 0 and r.stdout == f"removed {stale}\n", why_failed(r)
    assert current.is_dir() and not stale.exists()
    r = kit_cli("cache", "clear", "--all")
    assert r.returncode == 0 and not current.exists(), why_failed(r)


def fresh_interpreter(code: str) -> list[str]:
    """What ``code`` printed, line by line, in a new Python with the kit on its path."""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=580)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.splitlines()


@pytest.mark.timeout(600)
def test_megatron_core_imports_without_the_compiler_and_still_compiles():
    """megatron-core's fusions are decorated with torch.compile; the engine imports it with
    that deferred, so its import pulls in neither dynamo nor inductor (torch's optimizer still
    imports dynamo at model build), and a deferred function still compiles at its first call."""
    code = (
        "import sys, torch\n"
        "from kit.engines import engine_spec\n"
        "engine_spec('megatron').build()\n"
        "from megatron.core.fusions.fused_bias_gelu import bias_gelu\n"
        "print(sorted(m for m in ('torch._dynamo.convert_frame', 'torch._inductor.compile_fx')"
        " if m in sys.modules))\n"
        "x, b = torch.randn(4, 8), torch.randn(8)\n"
        "print(torch.allclose(bias_gelu(b, x), torch.nn.functional.gelu(x + b, approximate="
        "'tanh'), atol=1e-3), 'torch._dynamo.convert_frame' in sys.modules)\n")
    assert fresh_interpreter(code)[-2:] == ["[]", "True True"]


def test_zeus_imports_without_scikit_learn_which_stays_importable():
    """A rank's Zeus monitor no longer imports scikit-learn (4.5 s of an H200 rank's first
    step): zeus's one use of it, ``auc``, is the trapezoid rule, and the real scikit-learn is
    what a later import gets."""
    code = (
        "import sys\n"
        "from kit.telemetry.zeus import import_zeus_monitor\n"
        "monitor = import_zeus_monitor()\n"
        "import zeus.monitor.power as power\n"
        "print(monitor.__name__, sorted(m for m in ('sklearn', 'scipy.stats') if m in sys.modules),"
        " power.auc([0.0, 1.0, 3.0], [2.0, 4.0, 0.0]))\n"
        "import sklearn.metrics\n"
        "print(hasattr(sklearn.metrics, 'roc_auc_score'), sklearn.metrics.auc([0.0, 1.0, 3.0],"
        " [2.0, 4.0, 0.0]))\n")
    assert fresh_interpreter(code)[-2:] == ["ZeusMonitor [] 7.0", "True 7.0"]


def test_bytecode_is_kept_in_the_cache_only_where_nothing_else_keeps_it(tmp_path, monkeypatch):
    """PYTHONDONTWRITEBYTECODE over a package without .pyc files: the ranks get a prefix in the
    keyed folder, Python writes there and not beside the sources; the compiled-artifact count
    leaves it out. A package with bytecode, or an environment that writes it, is left alone."""
    pkg = tmp_path / "pkgs" / "nopyc"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(pkg.parent))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    keyed = tmp_path / "cache" / "key"
    env = compile_cache.bytecode_environment(keyed, probe="nopyc")
    assert env == {"PYTHONPYCACHEPREFIX": str(keyed / compile_cache.BYTECODE)}
    child = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    r = subprocess.run([sys.executable, "-c", "import nopyc; print(nopyc.VALUE)"],
                       env={**child, **env, "PYTHONPATH": str(pkg.parent)},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "42", r.stderr
    assert list((keyed / compile_cache.BYTECODE).rglob("__init__*.pyc"))
    assert not (pkg / "__pycache__").exists()
    assert compile_cache.entries(keyed) == 0  # bytecode is not a compiled kernel
    (keyed / "inductor").mkdir()
    (keyed / "inductor" / "artifact").write_text("x")
    assert compile_cache.entries(keyed) == 1
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE")
    assert compile_cache.bytecode_environment(keyed, probe="nopyc") == {}
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    import py_compile

    py_compile.compile(str(pkg / "__init__.py"), doraise=True)  # beside the source
    assert compile_cache.bytecode_environment(keyed, probe="nopyc") == {}


def test_a_fresh_bytecode_folder_is_filled_once_in_the_background(tmp_path, monkeypatch):
    """Where the ranks' bytecode lives in the cache, the launcher byte-compiles their packages
    into it on spare cores (a fresh machine's ranks then read most modules compiled), marks it
    filled even where a file does not compile, and later runs start nothing; the interpreter
    then imports from that folder."""
    pkg = tmp_path / "pkgs" / "nopyc"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from nopyc.sub import mod\nVALUE = mod.X\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "mod.py").write_text("X = 7\n")
    (pkg / "sub" / "broken.py").write_text("def (:\n")  # left to whatever imports it
    monkeypatch.syspath_prepend(str(pkg.parent))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    prefix = tmp_path / "cache" / compile_cache.BYTECODE
    roots = bytecode_precompile.package_roots(("nopyc", "not_a_package_here"))
    assert roots == [str(pkg)]
    proc = bytecode_precompile.start(prefix, roots, workers=2)
    assert proc is not None and proc.wait(timeout=300) == 0
    compiled = sorted(str(p.relative_to(prefix).with_suffix("").with_suffix(""))
                      for p in prefix.rglob("*.pyc") if "nopyc" in p.parts)
    base = str(pkg.relative_to(pkg.anchor))
    assert compiled == [f"{base}/__init__", f"{base}/sub/__init__", f"{base}/sub/mod"]
    assert (prefix / bytecode_precompile.DONE).exists()
    assert not list(pkg.rglob("__pycache__"))  # nothing beside the sources
    assert bytecode_precompile.start(prefix, roots) is None  # complete: nothing to start
    before = {p: p.stat().st_mtime_ns for p in prefix.rglob("*.pyc") if "nopyc" in p.parts}
    r = subprocess.run([sys.executable, "-c", "import nopyc; print(nopyc.VALUE)"],
                       env=dict(os.environ, PYTHONPATH=str(pkg.parent),
                                PYTHONPYCACHEPREFIX=str(prefix)),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "7", r.stderr
    assert {p: p.stat().st_mtime_ns for p in before} == before  # read, not written again


def test_a_precompile_under_way_is_not_started_twice_and_a_killed_one_is_taken_up(tmp_path):
    """A sweep's next point finds the first point's precompile still running (here: stopped)
    and starts none beside it; once that process is gone unfinished (SIGKILL; not yet reaped,
    as in a sweep's own process), the next run starts the fill again and completes it."""
    pkg = tmp_path / "pkgs" / "slowpkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("X = 1\n")
    prefix = tmp_path / "cache" / compile_cache.BYTECODE
    first = bytecode_precompile.start(prefix, [str(pkg)], workers=1)
    assert first is not None
    first.send_signal(signal.SIGSTOP)
    try:
        if not (prefix / bytecode_precompile.DONE).exists():  # it may have finished already
            assert bytecode_precompile.start(prefix, [str(pkg)], workers=1) is None
        first.kill()
        deadline = time.monotonic() + 60
        while psutil.Process(first.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the killed precompile did not end"
            time.sleep(0.05)
        (prefix / bytecode_precompile.DONE).unlink(missing_ok=True)  # as if killed before its end
        second = bytecode_precompile.start(prefix, [str(pkg)], workers=1)
    finally:
        first.kill()
        first.wait(timeout=60)
    assert second is not None and second.wait(timeout=300) == 0
    assert (prefix / bytecode_precompile.DONE).exists()
    assert bytecode_precompile.start(prefix, [str(pkg)], workers=1) is None


EARLY_GROUP = """
import sys
import torch
import torch.distributed as dist
from kit.launch.early_groups import EarlyProcessGroup
from kit.plan.resolve import RunRequest, resolve
rank, world = int(sys.argv[1]), int(sys.argv[2])
cfg = resolve(RunRequest(workload="gpt3-tiny", platform="cpu"))
group = EarlyProcessGroup(cfg, rank, world)
try:
    group.wait()
except Exception as e:
    print("raised", type(e).__name__, e)
    sys.exit(0)
t = torch.tensor([rank + 1])
dist.all_reduce(t)
print("group", dist.get_world_size(), int(t))
dist.destroy_process_group()  # as the engines end (at exit, gloo's threads could abort it)
"""


@pytest.mark.timeout(600)
def test_the_early_process_group_joins_the_peers_or_raises_in_the_rank(tmp_path):
    """The default group a rank creates on a thread while it imports its engine: two real
    processes over gloo meet and reduce; a rendezvous that cannot start raises in the rank's
    main thread (the worker then reports the rank failed), not silently on the thread."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    procs = [subprocess.Popen([sys.executable, "-c", EARLY_GROUP, str(r), "2"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    outs = [p.communicate(timeout=580) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
        assert out.strip().splitlines()[-1] == "group 2 3"
    env.pop("MASTER_ADDR")
    r = subprocess.run([sys.executable, "-c", EARLY_GROUP, "0", "2"], env=env,
                       capture_output=True, text=True, timeout=580)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1].startswith("raised ValueError"), r.stdout
