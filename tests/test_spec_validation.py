"""Resolution and every layout rule, through the public resolver and the CLI's exit codes."""

import json

import pytest

from kit.errors import KitInputError
from kit.plan.resolve import RunRequest, resolve

from .conftest import why_failed


def violation(**kw) -> str:
    with pytest.raises(KitInputError) as e:
        resolve(RunRequest(**kw))
    return str(e.value)


def test_dp_is_derived_from_the_platform_world_size():
    cfg = resolve(RunRequest(workload="llama3-70b", platform="h200", nodes=4, tp=8, pp=2))
    assert (cfg.world_size, cfg.parallel.dp) == (32, 2)
    assert cfg.grad_accum_steps == 128 // (1 * 2)
    assert cfg.dtype == "bf16"


def test_cpu_world_is_the_product_of_degrees():
    cfg = resolve(RunRequest(workload="gpt3-tiny", platform="cpu", tp=2, dp=2))
    assert (cfg.world_size, cfg.dtype) == (4, "fp32")


def test_explicit_dp_must_fill_the_devices_of_several_nodes():
    assert "use --dp 8" in violation(workload="gpt3-175b", platform="h100", nodes=2, tp=2, dp=3)


def test_one_node_layout_may_use_part_of_the_node():
    cfg = resolve(RunRequest(workload="gpt3-1.3b", platform="h100", tp=2, dp=1))
    assert (cfg.world_size, cfg.devices_per_node, cfg.parallel.dp) == (2, 2, 1)
    assert "this node has 8 h100 device(s)" in violation(
        workload="gpt3-1.3b", platform="h100", tp=2, dp=5)


def test_model_ranks_must_divide_world():
    assert "must divide the world size 8" in violation(workload="gpt3-175b", platform="h100", tp=3)


@pytest.mark.parametrize(
    "kw, needle",
    [
        (dict(workload="gpt3-tiny", tp=3), "attention heads (4) must be divisible by --tp 3"),
        (dict(workload="mixtral-tiny", tp=8), "query groups (4) must be divisible by --tp 8"),
        (dict(workload="gpt3-175b", platform="h100", pp=8, tp=1, nodes=1, dp=None),
         None),
        (dict(workload="gpt3-13b", platform="h100", pp=8, nodes=1), None),
        (dict(workload="gpt3-2.7b", platform="h100", pp=8, tp=1, vpp=3),
         "layers (32) must be divisible by --pp x --vpp (24)"),
        (dict(workload="gpt3-2.7b", platform="h100", vpp=2), "--vpp needs --pp of at least 2"),
        (dict(workload="gpt3-tiny", sp=True), "--sp (sequence parallel) needs --tp of at least 2"),
        (dict(workload="gpt3-175b", platform="h100", ep=2), "needs a mixture-of-experts"),
        (dict(workload="mixtral-8x7b", platform="h100", ep=3, tp=1),
         "experts (8) must be divisible by --ep 3"),
        (dict(workload="mixtral-8x7b", platform="h100", nodes=1, tp=4, ep=4),
         "--ep 4 must divide dp x cp (2)"),
        (dict(workload="gpt3-tiny", dp=3),
         "global batch (8) must be divisible by micro-batch x dp"),
        (dict(workload="gpt3-175b", platform="h100", cp=3, tp=1, nodes=3),
         "sequence length (2048) must be divisible by 2 x --cp (6)"),
        (dict(workload="gpt3-tiny", zero=2), "--zero is a DeepSpeed stage"),
        (dict(workload="gpt3-175b", platform="h100", fsdp=True, dist_optimizer=True),
         "--fsdp and --dist-optimizer are exclusive"),
    ],
)
def test_layout_rules(kw, needle):
    if needle is None:  # layers divisible by pp: valid
        resolve(RunRequest(**kw))
        return
    assert needle in violation(**kw)


def test_layers_divisible_by_pp():
    assert "layers (40) must be divisible by --pp 16" in violation(
        workload="gpt3-13b", platform="h100", nodes=2, pp=16
    )


def test_all_violations_are_reported_on_one_line():
    msg = violation(workload="gpt3-tiny", tp=3, sp=False, dp=3)
    assert "\n" not in msg and msg.count(";") >= 1


def test_cpu_refuses_what_megatron_core_cannot_run_there():
    assert "needs --sp" in violation(workload="mixtral-tiny", tp=2)
    assert "no context parallelism" in violation(workload="gpt3-tiny", cp=2, engine="deepspeed")


def test_cpu_accepts_the_megatron_matrix():
    """PP, VPP, SP, EP, the distributed optimizer, overlap and recompute all run on cpu now."""
    cfg = resolve(RunRequest(workload="mixtral-tiny", tp=2, sp=True, dp=2, ep=2,
                             dist_optimizer=True, overlap=True, recompute="full",
                             recompute_method="block"))
    assert cfg.world_size == 4 and cfg.optim.recompute_method == "block"
    assert resolve(RunRequest(workload="gpt3-tiny", pp=2, vpp=2)).parallel.vpp == 2
    assert resolve(RunRequest(workload="mixtral-tiny", cp=2, dp=2)).parallel.cp == 2


def test_megatron_fsdp_layouts():
    """--fsdp runs over DP (with TP inside), on GPUs and on cpu; never with PP."""
    cfg = resolve(RunRequest(workload="gpt3-175b", platform="h100", nodes=8, tp=8, fsdp=True))
    assert (cfg.parallel.dp, cfg.optim.fsdp) == (8, True)
    assert resolve(RunRequest(workload="gpt3-tiny", dp=2, fsdp=True)).optim.fsdp
    assert "no pipeline dimension" in violation(workload="gpt3-2.7b", platform="h100", pp=2,
                                                fsdp=True)


def test_megatron_fsdp_over_one_rank_groups_is_refused_where_it_trains_wrongly():
    """Megatron-FSDP mis-accumulates an unsharded (one-rank) gradient buffer: experts alone in
    their group inside a larger DP on every checked release, and dense dp 1 before 0.19."""
    from kit.engines.megatron import adapter

    assert "expert data-parallel groups of one rank" in violation(
        workload="mixtral-tiny", dp=2, ep=2, fsdp=True)
    dense_dp1 = dict(workload="gpt3-2.7b", platform="h100", tp=8, fsdp=True)
    if adapter.mcore_version() < adapter.MEGATRON_FSDP_ONE_RANK_DOUBLE_COUNT_FIXED:
        assert "data-parallel groups of one rank" in violation(**dense_dp1)
    else:
        assert resolve(RunRequest(**dense_dp1)).parallel.dp == 1


def test_scaled_variant_records_original_and_rule():
    cfg = resolve(RunRequest(workload="gpt3-175b", platform="mi250", tp=8))
    assert cfg.scaling is not None
    assert cfg.scaling.original.num_layers == 96
    assert cfg.workload.num_layers == cfg.scaling.rule.set["num_layers"] < 96
    assert cfg.workload.hidden_size == cfg.scaling.original.hidden_size
    assert cfg.workload.name == "gpt3-175b@mi250"


def test_workload_from_a_yaml_path(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(
        "family: gpt3\nnum_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\n"
        "ffn_hidden_size: 256\nseq_length: 32\nvocab_size: 512\nactivation: gelu\n"
        "normalization: layernorm\nposition_embedding: learned_absolute\nglobal_batch_size: 4\n"
    )
    cfg = resolve(RunRequest(workload=str(path)))
    assert cfg.workload.name == "mine"


@pytest.mark.parametrize(
    "args, needle",
    [
        (["run", "no-such-model", "--dry-run"], "unknown workload 'no-such-model'"),
        (["run", "gpt3-tiny", "--platform", "no-such", "--dry-run"], "unknown platform"),
        (["run", "gpt3-tiny", "--tp", "3", "--dry-run"], "must be divisible by --tp 3"),
        (["run", "gpt3-tiny", "--platform", "h100"], "is not present on this host"),
        (["run", "gpt3-tiny", "--engine", "deepspeed", "--tp", "2", "--dry-run"],
         "the deepspeed engine has no tensor parallelism"),
        (["run", "gpt3-tiny", "--tp", "zero"],
         "'--tp': 'zero' is not an integer from 1 to 1048576"),
        (["run", "gpt3-tiny", "--tp", "0", "--dry-run"],
         "'--tp': '0' is not an integer from 1 to 1048576"),
        (["run", "gpt3-tiny", "--zero", "4", "--dry-run"],
         "'--zero': '4' is not an integer from 0 to 3"),
        (["run", "gpt3-tiny", "--profile-steps", "abc", "--dry-run"],
         "'--profile-steps': 'abc' is not of the form A:B or A (step numbers, e.g. 2:4)"),
        (["run", "gpt3-tiny", "--profile-ranks", "0;1", "--dry-run"],
         "'--profile-ranks': '0;1' is not of the form R or R,R,... (ranks, e.g. 0,3)"),
        (["run", "gpt3-tiny", "--steps", "-1", "--dry-run"], "'--steps'"),
        (["run", "gpt3-tiny", "--warmup", "-1", "--dry-run"], "'--warmup'"),
        (["run", "gpt3-tiny", "--recompute-method", "block", "--dry-run"],
         "use it with --recompute full"),
        (["run", "gpt3-tiny", "--nodes", "2"], "--nodes 2 needs --launcher torchrun"),
        (["run", "gpt3-tiny", "--nodes", "2", "--tp", "2", "--launcher", "torchrun"],
         "--launcher torchrun needs --node-rank K"),
        (["run", "gpt3-tiny", "--nodes", "2", "--tp", "2", "--launcher", "torchrun",
          "--node-rank", "0", "--rdzv-endpoint", "nohost"], "is not HOST:PORT"),
        (["run", "gpt3-tiny", "--nodes", "2", "--launcher", "torchrun"],
         "ranks cannot be split evenly over --nodes 2"),
        (["run", "gpt3-tiny", "--out", "/etc/hostname/sub"], "/etc/hostname is not a directory"),
        (["run", "gpt3-tiny", "--out", "/proc/nope"],
         "cannot write /proc/nope: no file or folder can be created in /proc (the kernel's "
         "proc file system)"),
        (["compre", "a", "b"], "'compre' is neither a command nor a workload; did you mean "
                               "'compare'?"),
        (["zzz"], "'zzz' is neither a command nor a workload; commands: bundle, cache, compare, "),
        (["workloads", "show", "nope"], "unknown workload"),
        (["bundle", "verify", "/nonexistent/bundle"], "/nonexistent/bundle"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(cli, args, needle):
    r = cli(*args, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_a_yaml_that_is_not_text_is_one_line(cli, tmp_path):
    binary = tmp_path / "blob.yaml"
    binary.write_bytes(bytes(range(256)))
    r = cli("run", str(binary), "--dry-run", timeout=120)
    assert r.returncode == 2 and "not a YAML text file" in r.stderr
    assert "Traceback" not in r.stderr


def test_invalid_yaml_is_one_line(cli, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("family: gpt3\nnum_layers: [1, 2\n")
    r = cli("run", str(bad), "--dry-run", timeout=120)
    assert r.returncode == 2 and "invalid YAML at line" in r.stderr
    partial = tmp_path / "partial.yaml"
    partial.write_text("family: gpt3\nnum_layers: 2\nhidden_size: 64\n")
    r = cli("run", str(partial), "--dry-run", timeout=120)
    assert r.returncode == 2 and r.stderr == (
        f"error: {partial}: missing fields: num_attention_heads, ffn_hidden_size, seq_length, "
        "vocab_size, activation, normalization, position_embedding, global_batch_size\n")
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("family: gpt3\nnum_layers: -1\n")
    r = cli("run", str(wrong), "--dry-run", timeout=120)
    assert r.returncode == 2 and "num_layers" in r.stderr


def test_dry_run_json_prints_resolved_config_or_error(cli):
    r = cli("run", "mixtral-8x7b", "--platform", "h200", "--nodes", "4", "--tp", "2", "--ep", "4",
            "--sp", "--dry-run", "--json", timeout=120)
    assert r.returncode == 0, why_failed(r)
    cfg = json.loads(r.stdout)
    assert cfg["parallel"] == {"tp": 2, "pp": 1, "dp": 16, "cp": 1, "ep": 4, "vpp": None,
                               "sp": True, "moe_dispatcher": "alltoall"}
    r = cli("run", "gpt3-tiny", "--tp", "3", "--dry-run", "--json", timeout=120)
    assert r.returncode == 2 and "divisible" in json.loads(r.stdout)["error"]
