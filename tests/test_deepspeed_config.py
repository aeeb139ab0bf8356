"""The DeepSpeed config the engine builds from resolved runs, for GPU platforms CI cannot run."""

from kit.engines.deepspeed.config import deepspeed_config
from kit.plan.resolve import RunRequest, resolve


def config_for(**opts) -> dict:
    return deepspeed_config(resolve(RunRequest(workload="gpt3-1.3b", engine="deepspeed", **opts)))


def test_gpu_zero3_offload_uses_bf16_and_deepspeed_cpu_adam():
    c = config_for(platform="h200", zero=3, offload=True, global_batch_size=64, micro_batch_size=2)
    assert c["bf16"]["enabled"] and not c["fp16"]["enabled"]
    assert c["zero_optimization"]["stage"] == 3
    assert c["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert "torch_adam" not in c["optimizer"]["params"]  # DeepSpeed's CPU Adam does the step
    assert c["zero_force_ds_cpu_optimizer"] is True
    # 8 H200s: DP 8, so 64 = 2 per micro-batch x 4 accumulation steps x 8 ranks
    assert (c["train_batch_size"], c["train_micro_batch_size_per_gpu"],
            c["gradient_accumulation_steps"]) == (64, 2, 4)


def test_gpu_without_offload_uses_fused_torch_adamw_and_overlap():
    c = config_for(platform="h100", zero=2, overlap=True)
    p = c["optimizer"]["params"]
    assert c["optimizer"]["type"] == "AdamW" and p["torch_adam"] and p["fused"]
    assert p["betas"] == [0.9, 0.95] and p["weight_decay"] == 0.1
    assert c["zero_optimization"] == {"stage": 2, "overlap_comm": True}
    assert c["gradient_clipping"] == 1.0


def test_cpu_offload_steps_with_torch_adamw_in_fp32():
    c = config_for(platform="cpu", zero=1, offload=True, dp=2)
    assert not c["bf16"]["enabled"] and not c["fp16"]["enabled"]
    assert c["optimizer"]["params"]["torch_adam"] and "fused" not in c["optimizer"]["params"]
    assert c["zero_force_ds_cpu_optimizer"] is False
    assert c["zero_optimization"]["offload_optimizer"]["pin_memory"] is False


def test_gpu_zero3_keeps_a_small_models_gathered_weights_for_the_step():
    from kit.config.loader import load_workload
    from kit.metrics.flops import params_count

    z = config_for(platform="h100", zero=3)["zero_optimization"]
    n = params_count(load_workload("gpt3-1.3b"))
    assert z["stage3_max_live_parameters"] == z["stage3_max_reuse_distance"] == n
    big = deepspeed_config(resolve(RunRequest(workload="gpt3-175b", engine="deepspeed", zero=3,
                                              platform="h100", nodes=4)))["zero_optimization"]
    assert "stage3_max_live_parameters" not in big  # DeepSpeed's default: release after use
    cpu = config_for(platform="cpu", zero=3)["zero_optimization"]
    assert "stage3_max_live_parameters" not in cpu and "stage3_max_reuse_distance" not in cpu


def test_zero3_sizes_follow_the_layer_and_overlap_stays_on():
    """Persistence 10 x hidden (norms and biases whole), prefetch two layers, reduce one."""
    h = 2048
    # gpt3-1.3b layer: QKV and output projection (4 h^2 + 4 h), MLP (8 h^2 + 5 h), 2 norms (4 h)
    layer = 12 * h * h + 13 * h
    for platform in ("h100", "cpu"):
        z = config_for(platform=platform, zero=3)["zero_optimization"]
        assert z["overlap_comm"] and z["contiguous_gradients"]
        assert z["stage3_param_persistence_threshold"] == 10 * h
        assert z["reduce_bucket_size"] == layer
        assert z["stage3_prefetch_bucket_size"] == 2 * layer
    assert config_for(platform="h100", zero=1)["zero_optimization"] == {
        "stage": 1, "overlap_comm": False}
