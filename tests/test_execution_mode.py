"""A run's execution mode (graphed or eager): stated before the run, recorded in the bundle,
and read back from bundles that only carry it in their notes (kit.engines.execution)."""

import json
from pathlib import Path

from kit.engines.execution import execution_of
from kit.launch.progress import ProgressWatcher
from tests.conftest import REPO


def test_old_bundles_tell_their_mode_through_their_notes():
    recorded = json.loads((REPO / "tests/data/execution_notes_h200x4.json").read_text())
    modes = {b["bundle"][-6:]: execution_of({}, b["notes"]) for b in recorded["bundles"]}
    assert modes["5583ec"].graphed  # tp2 dp2, no recomputation: graphed
    assert modes["d62158"].eager_because == ("activation recomputation",)
    assert modes["844abc"].eager_because == ("pipeline parallelism", "activation recomputation")
    assert modes["cbcf42"].describe() == "eager (overlapped gradient reduction)"
    # the field wins over the notes; neither: the mode cannot be told
    assert execution_of({"mode": "graphed", "eager_because": []}, recorded["bundles"][0]["notes"]
                        ).graphed
    assert execution_of({}, ["energy from power"]) is None
    assert execution_of({}, ["speed features: fusions, fused_adam"]).eager_because == (
        "cuda_graph not among the speed features",)


def test_a_cpu_bundle_records_its_eager_step(cpu_bundle):
    metrics = json.loads((cpu_bundle / "metrics.json").read_text())
    assert metrics["execution"] == {"mode": "eager",
                                    "eager_because": ["CPU platform: no CUDA graphs"]}


def test_dry_run_names_the_step_execution_before_the_run(cli):
    graphed = cli("run", "gpt3-1.3b", "--platform", "h100", "--recompute", "full", "--dry-run")
    assert graphed.returncode == 0, graphed.stderr
    assert [line.split(None, 2)[2] for line in graphed.stdout.splitlines()
            if line.startswith("step execution")] == ["graphed"]
    piped = cli("run", "gpt3-1.3b", "--platform", "h100", "--pp", "2", "--dry-run", "--json")
    assert piped.returncode == 0, piped.stderr
    assert json.loads(piped.stdout)["execution"] == {
        "mode": "eager", "eager_because": ["pipeline parallelism without graph_pipeline"]}
    # --eager holds a layout that could be graphed in the eager step, its features unchanged
    held = cli("run", "gpt3-1.3b", "--platform", "h100", "--eager", "--dry-run", "--json")
    assert held.returncode == 0, held.stderr
    doc = json.loads(held.stdout)
    assert doc["execution"] == {"mode": "eager", "eager_because": ["--eager"]}
    assert doc["eager"] is True and doc["speed"] is None
    refused = cli("run", "gpt3-1.3b", "--platform", "h100", "--eager", "--engine", "deepspeed",
                  "--dry-run")
    assert refused.returncode == 2 and "--eager" in refused.stderr


def test_static_batches_keep_their_addresses_across_steps():
    import torch

    from kit.engines.megatron.step_graph import StaticBatches

    def step(value: float) -> list:  # two virtual-pipeline chunks; the second reads no data
        return [iter([{"tokens": torch.full((2,), value)} for _ in range(3)]), None]

    held = StaticBatches()
    first = held.load(step(1.0))
    first_batches = list(first[0])
    assert first[1] is None and [b["tokens"].tolist() for b in first_batches] == [[1, 1]] * 3
    second = list(held.load(step(2.0))[0])
    assert all(a["tokens"] is b["tokens"] for a, b in zip(first_batches, second, strict=True))
    assert [b["tokens"].tolist() for b in second] == [[2, 2]] * 3
    single = StaticBatches()
    one = single.load(iter([{"tokens": torch.zeros(1)}]))
    assert not isinstance(one, list) and next(one)["tokens"].tolist() == [0.0]


def test_an_eager_fallback_is_named_on_every_step_line(tmp_path: Path, capsys):
    log = tmp_path / "steps.jsonl"
    log.write_text(json.dumps({"step": 0, "phase": "warmup", "t_start": 0.0, "t_end": 1.5,
                               "loss": 10.9}) + "\n")
    watcher = ProgressWatcher(log, 2, 1, "gpt3-1.3b on h100 x8",
                              eager="eager (pipeline parallelism)")
    watcher.close()
    err = capsys.readouterr().err
    assert "step eager (pipeline parallelism)" in err
    assert "step 1/2 warmup 1.500s/step loss 10.9000 [eager (pipeline parallelism)]" in err
