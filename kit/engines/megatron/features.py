"""Which speed features a megatron run gets, and whether its step is one CUDA graph.

Known from the run's config alone (no torch import), so the engine's spec can state the
execution mode before any rank starts (``run --dry-run``, the progress line), the engine
builds exactly that, and a projection of another layout knows how its target would run.
"""

from kit.config.run import RunConfig
from kit.engines.execution import EAGER, GRAPHED, Execution
from kit.engines.kernels.features import chosen_features

SPEED_FEATURES = ("fusions", "wgrad_fusion", "cross_entropy", "cuda_graph", "fused_adam",
                  "foreach_optim", "compile", "grouped_gemm", "sync_free_permute",
                  "graph_pipeline")
"""GPU speed features (kit.engines.megatron.speed); all but ``compile``, ``sync_free_permute``
and ``graph_pipeline`` are on by default on NVIDIA GPUs (each measured to pay; ``grouped_gemm``
acts on bias-free MoE layers only). ``sync_free_permute`` (MoE token permutation without a
device-to-host wait, :mod:`kit.engines.megatron.moe_permute`) waits for its GPU measurement
(``benchmarks/moe/breakdown_1gpu.sh``); ``graph_pipeline`` (with ``cuda_graph``: a pipeline's
step captured too, its 1F1B schedule's sends and receives inside the graph) for its two-GPU
one (issue 61: ``--speed`` with both, against the same layout eager and against DP)."""

DEFAULT = frozenset(SPEED_FEATURES) - {"compile", "sync_free_permute", "graph_pipeline"}

DEFAULT_AMD = DEFAULT - {"wgrad_fusion", "cuda_graph", "grouped_gemm"}
"""On ROCm: ``wgrad_fusion`` needs ``torch.addmm(..., out_dtype=float32)``, ``cuda_graph``
HIP graph capture of megatron-core's step and ``grouped_gemm`` torch's ``_grouped_mm`` kernel
(CUTLASS on CUDA); all were checked on CUDA only (no AMD GPU was reachable), so they stay off
until a ROCm run shows they work."""

NOT_WITH_FSDP = frozenset({"wgrad_fusion"})
"""Off under ``--fsdp``: megatron-core 0.19's Megatron-FSDP refuses
``gradient_accumulation_fusion`` unless Transformer Engine >= 2.10 provides it."""


def enabled(cfg: RunConfig) -> frozenset[str]:
    """The speed features for ``cfg``.

    :data:`DEFAULT` on NVIDIA, :data:`DEFAULT_AMD` on AMD, none on CPU, less
    :data:`NOT_WITH_FSDP` under ``--fsdp``. The run's ``--speed`` (a subset of
    :data:`SPEED_FEATURES`, checked by the spec, or ``none``) overrides the default, for
    measuring what each feature buys.
    """
    chosen = chosen_features(cfg, DEFAULT, DEFAULT_AMD)
    return chosen - NOT_WITH_FSDP if cfg.optim.fsdp else chosen


def graph_blockers(cfg: RunConfig) -> list[str]:
    """Why one CUDA graph cannot hold this layout's step (empty when it can).

    Capture replays GPU work only: Python that runs between kernels on every step (MoE token
    counts read on the host, say) would be frozen at its first run, so such layouts keep the
    eager step.

    A pipeline's step is captured only with the ``graph_pipeline`` feature (off by default
    until a multi-GPU run measures it): megatron-core's pipeline schedules are a fixed order of
    forward and backward micro-batches for a given stage count and micro-batch count, their
    sends and receives NCCL point-to-point operations (capturable, like the collectives below)
    of fixed shapes (``variable_seq_lengths`` is off), so on replay each stage sends and
    receives what it did while capturing; every stage captures after the same warm-up steps
    and a barrier (:mod:`~kit.engines.megatron.step_graph`), as megatron-core's own
    full-iteration graph does.

    Megatron-FSDP keeps the eager step: it gathers each layer's parameters asynchronously from
    hooks and prefetches the next step's gathers after the optimizer step, outside the schedule;
    replayed, the forward would wait for gathers that no longer run where they were captured
    (the distributed optimizer's overlapped all-gather below has the same flaw, and is moved
    out of the graph instead; FSDP's cannot be, being where its weights come from).

    Activation recomputation is captured. megatron-core's ``CheckpointFunction`` saves and
    restores the RNG states around the recomputed forward; with the graph-safe tracker the
    engine seeds under a graph (``use_cudagraphable_rng``) those are ``graphsafe_get_state``
    and ``graphsafe_set_state`` of generator states registered with the graph, never a
    device-to-host copy, so the forward, its recomputation in the backward and the backward
    itself are all recorded and replayed in order. The kit trains with dropout 0, so the
    recomputed forward draws no random numbers and computes what the first forward computed
    (the restored states are the live ones, not copies: with dropout the masks would differ).
    megatron-core's own full-iteration graph (``full_cuda_graph``) instead skips
    recomputation while it captures (``tensor_parallel.checkpoint`` returns the plain forward
    under its ``is_graph_capturing``), which would keep every activation and measure a
    different layout; the kit's :mod:`~kit.engines.megatron.step_graph` does not set that flag.

    A mixture of experts is captured when every expert's input is padded to its capacity
    (``moe_pad_to_capacity``, the reference study's setting) and tokens go through
    megatron-core's all-to-all dispatcher: its drop-and-pad path sizes every buffer from the
    capacity, gives the experts' token counts as host constants and splits the all-to-all
    evenly, so nothing is read back from the device; the kit's grouped GEMMs keep their
    device copy of those counts (:mod:`~kit.engines.megatron.grouped_mlp`) and the routing
    counts accumulate on the device (:mod:`~kit.engines.megatron.expert_load`). Dropless
    routing sizes the experts' inputs from this step's routing, read on the host, and the
    all-gather dispatcher reads its counts on the host too: both stay eager.

    Overlapped gradient reduction (``--overlap``) is captured: its backward hooks launch each
    bucket's asynchronous reduce-scatter or all-reduce in the same order every step, and the
    schedule's ``finish_grad_sync`` joins them back into the captured stream. Its companion,
    the distributed optimizer's overlapped parameter all-gather, is not: the forward hooks that
    wait for it would wait, on replay, for nothing (the gather runs eagerly after the optimizer
    step), so under a graph the all-gather stays in the optimizer step (the engine's notes say
    so); eager, --overlap kept the step at 0.46-0.49 s against 0.29 s for DP2 on two H200s.
    NCCL collectives are capturable (PyTorch's ProcessGroupNCCL skips its
    watchdog bookkeeping while a stream captures): the graph holds the tensor-parallel
    all-reduces and sequence-parallel gathers and scatters of the forward and backward, and
    megatron-core's gradient reduction over data parallelism (``finalize_model_grads``, run at
    the end of the schedule), so TP, SP, DP and the distributed optimizer's reduce-scatter are
    replayed; the optimizer step (and the distributed optimizer's parameter all-gather) stays
    eager. Context parallelism is captured too: its attention's key/value all-gathers and
    their reduce-scatters are NCCL collectives, the CP loss average an all-reduce, and its
    chunk indices are cached device tensors (:mod:`kit.engines.megatron.context_parallel`);
    left eager, gpt3-1.3b CP2 x TP2 + SP ran 1.946 s a step with the GPU 89% idle.

    ``--eager`` blocks the graph on purpose: a comparison of a layout that can be graphed with
    one that cannot (a pipeline) would otherwise also compare the graph with the eager step
    (``charllm-kit study`` holds each finding's runs in one mode this way).
    """
    p, o, w = cfg.parallel, cfg.optim, cfg.workload
    return [reason for blocked, reason in (
        (p.pp > 1 and "graph_pipeline" not in enabled(cfg),
         "pipeline parallelism without graph_pipeline"),
        (w.is_moe and not w.moe_padded, "mixture of experts with dropless routing"),
        (w.moe_padded and p.moe_dispatcher != "alltoall",
         "mixture of experts with the allgather dispatcher"),
        (o.fsdp, "FSDP"),
        (cfg.eager, "--eager"),
    ) if blocked]


def use_grouped_gemm(cfg: RunConfig, features: frozenset[str]) -> bool:
    """Whether this run's MoE layers use grouped expert GEMMs (feature on, MoE, no biases)."""
    w = cfg.workload
    return "grouped_gemm" in features and w.is_moe and not w.add_bias_linear


def use_cuda_graph(cfg: RunConfig, features: frozenset[str]) -> bool:
    """Whether this run captures its step in a CUDA graph (feature on and layout capturable)."""
    return "cuda_graph" in features and not graph_blockers(cfg)


def execution(cfg: RunConfig) -> Execution:
    """How ``cfg``'s step will execute, and what keeps it eager."""
    features = enabled(cfg)
    if use_cuda_graph(cfg, features):
        return Execution(GRAPHED)
    if cfg.platform.is_cpu:
        return Execution(EAGER, ("CPU platform: no CUDA graphs",))
    if "cuda_graph" not in features:
        return Execution(EAGER, ("cuda_graph not among the speed features",))
    return Execution(EAGER, tuple(graph_blockers(cfg)))
