"""Part of a host: the visible-device variables decide which GPUs the kit counts, samples and
records (driver indices through the fake pynvml of tests/fakes/nvml)."""

import re
from pathlib import Path

import pytest

from kit.config.visible_devices import visible_indices
from kit.errors import KitInputError
from kit.plan import detect
from kit.telemetry import devices

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("env, expected", [
    ({}, [0, 1, 2, 3]),
    ({"CUDA_VISIBLE_DEVICES": "2,0"}, [2, 0]),
    ({"CUDA_VISIBLE_DEVICES": ""}, []),
])
def test_cuda_visible_devices_name_driver_indices(env, expected):
    assert visible_indices("nvidia", 4, env) == expected


def test_rocr_then_hip_narrow_as_the_rocm_runtime_does():
    env = {"ROCR_VISIBLE_DEVICES": "4,5,6,7", "HIP_VISIBLE_DEVICES": "1,3"}
    assert visible_indices("amd", 8, env) == [5, 7]
    assert visible_indices("nvidia", 8, env) == list(range(8))  # not NVIDIA's variables


@pytest.mark.parametrize("value, needle", [
    ("GPU-1234", "name them as indices"),
    ("5", "device 5 is not on this node (4 device(s))"),
    ("1,1", "device 1 is named twice"),
])
def test_unusable_values_are_one_line_errors(value, needle):
    with pytest.raises(KitInputError, match=re.escape(needle)):
        visible_indices("nvidia", 4, {"CUDA_VISIBLE_DEVICES": value})


def _node(count: int) -> dict:
    return {"devices": [{"name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-fake-{i}",
                         "arch": "NVML_DEVICE_ARCH_HOPPER", "power_limit_mw": 700_000,
                         "max_sm_mhz": 1980, "memory_total": 85_520_809_984,
                         "calls": {}, "fields": {}} for i in range(count)]}


@pytest.fixture
def four_h100s(monkeypatch, tmp_path):
    from tests.fakes import fake_library

    devices.node_accelerators.cache_clear()
    with fake_library(monkeypatch, "pynvml", _node(4), tmp_path):
        yield
    devices.node_accelerators.cache_clear()


def test_a_layout_smaller_than_the_host_runs_on_the_first_visible_devices(four_h100s,
                                                                           monkeypatch):
    from kit.launch.inventory import node_inventory
    from kit.plan.resolve import RunRequest, resolve
    from kit.telemetry.nvidia.nvml import NvmlSource

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    assert detect.detect_platform().name == "h100"
    assert len(devices.local_accelerator_names()) == 2
    cfg = resolve(RunRequest(workload="gpt3-1.3b", dp=1), require_present=True)
    assert (cfg.world_size, cfg.devices_per_node) == (1, 1)
    # The sampler reads the device the one rank runs on, by NVML's index.
    assert NvmlSource.plan(cfg, node=0)["devices"] == [1]
    inventory = node_inventory(used=cfg.devices_per_node)
    assert [g["device"] for g in inventory.gpus] == [1]
    assert inventory.visible_devices == {"CUDA_VISIBLE_DEVICES": "1,3"}


def test_without_the_variables_a_full_layout_fills_the_node(four_h100s, monkeypatch):
    from kit.plan.resolve import RunRequest, resolve

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    cfg = resolve(RunRequest(workload="gpt3-1.3b", tp=2), require_present=True)
    assert (cfg.world_size, cfg.parallel.dp) == (4, 2)
    with pytest.raises(KitInputError, match="need as many devices; this node has 4"):
        resolve(RunRequest(workload="gpt3-1.3b", tp=2, dp=4), require_present=True)


def test_reports_name_a_rank_by_the_gpu_it_ran_on_not_by_its_local_rank():
    """Telemetry rows name a GPU by its driver index; under CUDA_VISIBLE_DEVICES=3 local rank 0
    ran on device 3, and figures and the straggler summary must say so (a recorded H100
    bundle, its inventory renumbered as that run's would be)."""
    from kit.bundle.reader import read_bundle
    from kit.metrics.labels import device_roles, rank_device

    m = read_bundle(REPO / "tests/data/bundles/telemetry/20261125T122448Z-gpt3-1.3b-h100-f4a12c"
                    ).manifest
    assert rank_device(m, 0, 0) == 0
    node = m.inventory[0]
    moved = node.model_copy(update={"gpus": [{**node.gpus[0], "device": 3}],
                                    "visible_devices": {"CUDA_VISIBLE_DEVICES": "3"}})
    m = m.model_copy(update={"inventory": [moved]})
    assert rank_device(m, 0, 0) == 3
    on_3, on_0 = device_roles(m, [(0, 3), (0, 0)])[::-1]
    assert (on_3.device, on_3.rank, on_3.role) == (3, 0, "r0")
    assert (on_0.device, on_0.rank, on_0.role) == (0, None, "no rank")
