"""The run's options have one source; a new engine or telemetry backend is one class plus one
registry line.

The run command's options are generated from RunRequest (kit.cli.options); these tests check
the generated command against the model, and register a toy engine to show what the kit then
does with it without any other change: resolve, refuse layouts and another engine's options,
estimate memory, place ranks, and describe it in the dry-run table.
"""

import click
import pytest
from click.testing import CliRunner

from kit.bundle.telemetry_fields import make_row
from kit.bundle.writer import concat_chunks
from kit.cli.commands import cli
from kit.config.loader import load_platform
from kit.config.run import ParallelConfig, RunConfig
from kit.engines import ENGINES, register_engine
from kit.engines.registry import BytesPerParameter, EngineSpec, Sharding
from kit.errors import KitInputError
from kit.launch.session import telemetry_plan
from kit.plan import plan_run
from kit.plan.resolve import RunRequest
from kit.telemetry import register_source
from kit.telemetry.base import FieldInfo, TelemetrySource
from kit.telemetry.sampler import TelemetrySampler

from .conftest import REPO

RUN_ONLY = {"out", "dry_run", "force", "as_json", "compile_cache"}  # of the command, not the run


def run_options() -> dict[str, click.Option]:
    return {p.name: p for p in cli.commands["run"].params if isinstance(p, click.Option)}


def test_every_run_request_field_is_one_documented_run_option():
    options = run_options()
    fields = RunRequest.model_fields
    assert set(options) - RUN_ONLY == set(fields) - {"workload"}
    for name, info in fields.items():
        assert info.description, f"RunRequest.{name} has no description"
        if name == "workload":
            continue
        opt = options[name]
        assert opt.help == info.description
        assert (opt.default or None) == (info.default or None), name
    assert run_options()["micro_batch_size"].opts == ["--micro-batch"]
    assert run_options()["zero"].type.min == 0 and run_options()["zero"].type.max == 3


def test_the_sweep_doc_names_every_run_field():
    doc = (REPO / "docs" / "sweeps.md").read_text()
    fields = doc[doc.index("**Run fields.**"):doc.index("**Constraints.**")]
    assert [f for f in RunRequest.model_fields if f"`{f}`" not in fields] == []


class ToySpec(EngineSpec):
    """A made-up engine: data parallelism only, fp32 states, nothing sharded."""

    name = "toy"

    def violations(self, cfg: RunConfig) -> list[str]:
        return ["the toy engine has no tensor parallelism"] if cfg.parallel.tp > 1 else []

    def bytes_per_parameter(self, cfg: RunConfig) -> BytesPerParameter:
        return BytesPerParameter(weights=4, grads=4, optimizer=8)

    def sharding(self, cfg: RunConfig, zero_stage: int | None = None) -> Sharding:
        return Sharding()

    def placement(self, parallel: ParallelConfig, rank: int) -> dict[str, int]:
        return {"tp_rank": 0, "cp_rank": 0, "dp_rank": rank, "pp_rank": 0, "ep_rank": 0}

    def build(self):  # type: ignore[no-untyped-def]
        raise NotImplementedError("a toy engine does not train")

    def options_summary(self, cfg: RunConfig) -> str:
        return "toy-options"


@pytest.fixture
def toy_engine():
    register_engine(ToySpec())
    yield ENGINES["toy"]
    del ENGINES["toy"]


def test_a_registered_engine_is_resolved_checked_estimated_and_shown(toy_engine):
    plan = plan_run(RunRequest(workload="gpt3-tiny", platform="cpu", engine="toy", dp=2),
                    require_present=False)
    assert plan.cfg.engine == "toy" and plan.memory.required_bytes > 0
    with pytest.raises(KitInputError, match="the toy engine has no tensor parallelism"):
        plan_run(RunRequest(workload="gpt3-tiny", platform="cpu", engine="toy", tp=2), False)
    with pytest.raises(KitInputError, match="--zero is a DeepSpeed stage"):
        plan_run(RunRequest(workload="gpt3-tiny", platform="cpu", engine="toy", zero=1), False)
    assert toy_engine.placement(plan.cfg.parallel, 1)["dp_rank"] == 1
    r = CliRunner().invoke(cli, ["run", "gpt3-tiny", "--platform", "cpu", "--engine", "toy",
                                 "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "toy" in r.output and "toy-options" in r.output


def test_an_unregistered_engine_is_one_line_naming_the_registered_ones():
    r = CliRunner().invoke(cli, ["run", "gpt3-tiny", "--platform", "cpu", "--engine", "tytan",
                                 "--dry-run"])
    assert isinstance(r.exception, KitInputError)
    assert str(r.exception) == "unknown engine 'tytan'; known: deepspeed, fsdp2, megatron"


class ToyCounterSource(TelemetrySource):
    """A made-up device backend: one gpu row per device, power 100 W (module level, so the
    sampler's own process can import it)."""

    name = "toy-counter"
    reads_devices = True

    def __init__(self, node: int, devices: list[int]) -> None:
        self._node, self._devices = node, devices or [0]

    def fields(self) -> dict[str, FieldInfo]:
        return {"power_w": FieldInfo(True)}

    def sample(self, t: float) -> list[dict]:
        return [make_row(t, self._node, d, "gpu", power_w=100.0) for d in self._devices]

    def close(self) -> None:
        pass


def test_a_registered_telemetry_source_is_listed_planned_and_sampled(tmp_path):
    register_source("toy-counter", ToyCounterSource)
    platform = tmp_path / "toy.yaml"
    platform.write_text((REPO / "platforms" / "cpu.yaml").read_text().replace(
        "telemetry: [host]", "telemetry: [host, toy-counter]"))
    cfg = plan_run(RunRequest(workload="gpt3-tiny", platform=str(platform)), False).cfg
    specs, why = telemetry_plan(cfg)
    assert specs == [("host", {"node": 0}), ("toy-counter", {"node": 0, "devices": []})]
    assert why == "no backend of ['toy-counter'] could read it"
    sampler = TelemetrySampler(specs, interval_ms=20, chunks_dir=tmp_path / "chunks")
    sampler.start()
    report = sampler.stop()
    assert report.complete and report.sources["toy-counter"]["power_w"].readable
    rows = concat_chunks(tmp_path / "chunks").to_pylist()
    assert {r["power_w"] for r in rows if r["source"] == "gpu"} == {100.0}


def test_a_platform_naming_an_unregistered_telemetry_source_is_one_line(tmp_path):
    platform = tmp_path / "typo.yaml"
    platform.write_text((REPO / "platforms" / "cpu.yaml").read_text().replace(
        "telemetry: [host]", "telemetry: [host, nvml-typo]"))
    with pytest.raises(KitInputError, match=r"unknown telemetry backend\(s\) \['nvml-typo'\]; "
                                            r"known: \['amdsmi', 'host', 'nvml', 'replay'"):
        load_platform(str(platform))
