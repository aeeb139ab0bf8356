"""The fsdp2 engine (PyTorch FSDP2 over the kit's plain model) on the CPU over gloo, through the
CLI: sharding and whole-layer recompute change no math, and layouts it cannot run are refused.
"""

import json

import pytest

from kit.bundle.reader import read_bundle
from kit.bundle.verify import verify_bundle
from kit.metrics.labels import layout_label

from .conftest import bundle_path, kit_cli, losses_by_rank, why_failed

pytestmark = pytest.mark.training  # every test here starts ranks (pyproject.toml: tiers)

REL = 1e-5


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, object]:
    """One process, and two ranks with whole-layer recompute; 2 measured steps each."""
    out = {}
    for name, args in {"dp1": ("--dp", "1"),
                       "dp2": ("--dp", "2", "--recompute", "full")}.items():
        r = kit_cli("run", "gpt3-tiny", "--engine", "fsdp2", *args, "--micro-batch", "1",
                    "--global-batch", "4", "--steps", "2", "--warmup", "1",
                    "--out", str(tmp_path_factory.mktemp(name)))
        assert r.returncode == 0, why_failed(r)[-3000:]
        out[name] = bundle_path(r.stdout)
        verify_bundle(out[name])
    return out


def test_two_sharded_ranks_train_the_one_process_model(runs):
    """Each DP2 rank accumulates 2 micro-batches; their mean loss is the one-process run's,
    whose step accumulates all 4 (same samples, same model)."""
    one, two = losses_by_rank(runs["dp1"]), losses_by_rank(runs["dp2"])
    assert two[0] != two[1] and len(one[0]) == 3
    mean = [(a + b) / 2 for a, b in zip(two[0], two[1], strict=True)]
    assert mean == pytest.approx(one[0], rel=REL)


def test_the_bundle_says_fsdp2_sharded_the_run(runs):
    b = read_bundle(runs["dp2"])
    assert b.manifest.status == "ok"
    assert b.manifest.config["engine"] == "fsdp2"
    assert layout_label(b.manifest.config) == "fsdp2 dp2 recompute=full mb1 gb4"
    assert [r.dp_rank for r in b.manifest.ranks] == [0, 1]
    notes = json.loads((runs["dp2"] / "metrics.json").read_text())["notes"]
    assert any("PyTorch FSDP2 (torch.distributed.fsdp.fully_shard) over 2 ranks" in n
               for n in notes), notes


def test_compare_names_the_fsdp2_engine_as_why_stragglers_are_not_measured(runs):
    r = kit_cli("compare", str(runs["dp2"]))
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.strip().startswith(runs["dp2"].name)
                and "not measured" in ln)
    assert "no per-phase step timers (the fsdp2 engine)" in line, line
    assert "deepspeed" not in line


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--tp", "2"], "--tp > 1: the fsdp2 engine is data parallel only"),
        (["--overlap"], "FSDP2 always overlaps"),
        (["--fsdp"], "PyTorch's FSDP2 is --engine fsdp2"),
        (["--zero", "3"], "--zero is a DeepSpeed stage"),
    ],
)
def test_refused_fsdp2_layouts_are_one_line(cli, args, needle):
    r = cli("run", "gpt3-tiny", "--engine", "fsdp2", "--dp", "2", *args, "--dry-run",
            timeout=120)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], r.stderr


def test_mixture_of_experts_is_refused(cli):
    r = cli("run", "mixtral-tiny", "--engine", "fsdp2", "--dry-run", timeout=120)
    assert r.returncode == 2 and "not supported by the fsdp2 engine" in r.stderr, r.stderr
