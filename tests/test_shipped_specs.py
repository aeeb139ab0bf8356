"""Every shipped workload and platform YAML loads, and carries the published numbers."""

import pytest

from kit.config.loader import load_platform, load_workload, platform_names, workload_names
from kit.config.workload import WorkloadSpec

WORKLOADS = {
    "gpt3-175b", "gpt3-13b", "gpt3-2.7b", "gpt3-1.3b", "gpt3-small", "gpt3-tiny",
    "mixtral-tiny", "llama3-8b", "llama3-70b", "mixtral-8x7b", "mixtral-8x22b",
    "mixtral-8x7b-4l", "llama3-8b-8l", "gpt3-175b-4l", "gpt3-175b-8l", "llama3-70b-8l",
    "mixtral-8x22b-4l",
}
PLATFORMS = {"cpu", "h100", "h200", "mi250"}

# (layers, hidden, heads, kv groups (None = one per head), ffn, seq, vocab, experts, top-k)
PUBLISHED = {
    "gpt3-175b": (96, 12288, 96, None, 49152, 2048, 50257, None, None),
    "gpt3-13b": (40, 5120, 40, None, 20480, 2048, 50257, None, None),
    "gpt3-2.7b": (32, 2560, 32, None, 10240, 2048, 50257, None, None),
    "gpt3-1.3b": (24, 2048, 16, None, 8192, 2048, 50257, None, None),
    "gpt3-small": (12, 768, 12, None, 3072, 2048, 50257, None, None),
    "llama3-8b": (32, 4096, 32, 8, 14336, 8192, 128256, None, None),
    "llama3-70b": (80, 8192, 64, 8, 28672, 8192, 128256, None, None),
    "mixtral-8x7b": (32, 4096, 32, 8, 14336, 4096, 32000, 8, 2),
    "mixtral-8x22b": (56, 6144, 48, 8, 16384, 4096, 32768, 8, 2),
    "gpt3-tiny": (4, 128, 4, None, 512, 128, 1024, None, None),
    "mixtral-tiny": (2, 128, 8, 4, 256, 128, 1024, 4, 2),
    "mixtral-8x7b-4l": (4, 4096, 32, 8, 14336, 4096, 32000, 8, 2),  # mixtral-8x7b, 4 layers
    "llama3-8b-8l": (8, 4096, 32, 8, 14336, 8192, 128256, None, None),  # llama3-8b, 8 layers
    "gpt3-175b-4l": (4, 12288, 96, None, 49152, 2048, 50257, None, None),  # gpt3-175b, 4 layers
    "gpt3-175b-8l": (8, 12288, 96, None, 49152, 2048, 50257, None, None),  # gpt3-175b, 8 layers
    "llama3-70b-8l": (8, 8192, 64, 8, 28672, 8192, 128256, None, None),  # llama3-70b, 8 layers
    "mixtral-8x22b-4l": (4, 6144, 48, 8, 16384, 4096, 32768, 8, 2),  # mixtral-8x22b, 4 layers
}


@pytest.mark.timeout(30)
def test_shipped_names() -> None:
    assert set(workload_names()) == WORKLOADS
    assert set(platform_names()) == PLATFORMS


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_workload_loads_with_published_shape(name: str) -> None:
    w = load_workload(name)
    assert w.name == name
    assert w.description
    layers, hidden, heads, groups, ffn, seq, vocab, experts, top_k = PUBLISHED[name]
    assert (w.num_layers, w.hidden_size, w.num_attention_heads) == (layers, hidden, heads)
    assert (w.num_query_groups, w.ffn_hidden_size, w.seq_length) == (groups, ffn, seq)
    assert (w.vocab_size, w.num_experts) == (vocab, experts)
    if top_k is not None:
        assert w.moe_top_k == top_k


@pytest.mark.parametrize("name", sorted(n for n in WORKLOADS if n.startswith("gpt3")))
def test_gpt3_style(name: str) -> None:
    w = load_workload(name)
    assert (w.family, w.activation, w.normalization) == ("gpt3", "gelu", "layernorm")
    assert w.position_embedding == "learned_absolute"
    assert w.add_bias_linear and w.tie_embeddings


@pytest.mark.parametrize(
    "name,theta",
    [("llama3-8b", 500000.0), ("llama3-8b-8l", 500000.0), ("llama3-70b", 500000.0),
     ("mixtral-8x7b", 1e6), ("mixtral-8x22b", 1e6), ("mixtral-tiny", 1e6),
     ("mixtral-8x7b-4l", 1e6)],
)
def test_llama_mixtral_style(name: str, theta: float) -> None:
    w = load_workload(name)
    assert (w.activation, w.normalization, w.position_embedding) == ("swiglu", "rmsnorm", "rope")
    assert w.rope_theta == theta
    assert not w.add_bias_linear and not w.tie_embeddings


def test_default_batches() -> None:
    for name in WORKLOADS - {"gpt3-tiny", "mixtral-tiny"}:
        w = load_workload(name)
        assert (w.global_batch_size, w.micro_batch_size) == (128, 1), name
    for name in ("gpt3-tiny", "mixtral-tiny"):
        w = load_workload(name)
        assert (w.global_batch_size, w.micro_batch_size) == (8, 2), name


def test_cpu_platform_has_no_peak() -> None:
    p = load_platform("cpu")
    assert p.is_cpu and p.vendor == "cpu" and p.device_name == "host CPU"
    assert p.devices_per_node is None and p.memory_per_device_gib is None
    assert p.peak_tflops == {}
    assert (p.dtype, p.comm_backend, p.telemetry) == ("fp32", "gloo", ["host"])


@pytest.mark.parametrize("name,memory", [("h100", 80), ("h200", 141)])
def test_nvidia_platforms(name: str, memory: int) -> None:
    p = load_platform(name)
    assert p.vendor == "nvidia" and p.devices_per_node == 8
    assert p.memory_per_device_gib == memory
    assert p.detect_names == [name.upper()]
    assert p.peak_tflops == {"bf16": 989, "fp16": 989, "fp32": 67}
    assert (p.dtype, p.comm_backend) == ("bf16", "nccl")
    assert p.telemetry == ["nvml", "zeus", "host"]
    assert p.container_image == "charllm-kit:cuda"
    links = {i.scope: i.bandwidth_gbps for i in p.interconnects}
    assert links == {"intra_node": 450, "inter_node": 50, "host": 64}
    assert [c.slot for c in sorted(p.chassis, key=lambda c: c.device)] == [
        f"SXM{i}" for i in range(1, 9)
    ]


def test_mi250_platform() -> None:
    p = load_platform("mi250")
    assert p.vendor == "amd" and p.devices_per_node == 8 and p.memory_per_device_gib == 64
    # AMD MI250 datasheet per package (362.1 bf16/fp16, 90.5 fp32 matrix) halved per GCD.
    assert p.peak_tflops == {"bf16": 362.1 / 2, "fp16": 362.1 / 2, "fp32": 90.5 / 2}
    assert (p.comm_backend, p.telemetry) == ("rccl", ["amdsmi", "host"])
    assert p.container_image == "charllm-kit:rocm"
    assert {c.slot for c in p.chassis} == {f"OAM{o}/GCD{g}" for o in range(1, 5) for g in (0, 1)}


def test_mi250_scaling_rules_reference_workloads_and_validate() -> None:
    p = load_platform("mi250")
    assert set(p.scaling) >= {"gpt3-175b", "llama3-70b", "mixtral-8x22b"}
    study_pp = {"gpt3-175b": 32, "llama3-70b": 16, "mixtral-8x7b": 4, "mixtral-8x22b": 8}
    for name, rule in p.scaling.items():
        assert name in WORKLOADS, name
        assert rule.reason
        original = load_workload(name)
        assert set(rule.set) == {"num_layers"}, name
        scaled = WorkloadSpec.model_validate({**original.model_dump(), **rule.set})
        assert scaled.num_layers < original.num_layers
        # Every pipeline degree the study used for the model still divides the layers.
        assert scaled.num_layers % study_pp[name] == 0, name
        # Width, heads, groups, FFN, experts and sequence are kept.
        keep = ("hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size",
                "seq_length", "vocab_size", "num_experts", "moe_top_k")
        assert all(getattr(scaled, k) == getattr(original, k) for k in keep), name
