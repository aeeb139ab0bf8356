"""MoE experts as two grouped GEMMs on PyTorch's ``torch._grouped_mm``, no Transformer Engine.

megatron-core's local spec runs the experts as a ``SequentialMLP``: a Python loop over the
experts, each an MLP of its own, with per-expert slicing and a concatenation. Its grouped
paths need an extra package: 0.16's ``GroupedMLP`` the ``grouped_gemm`` CUTLASS extension, and
0.19 keeps only ``TEGroupedMLP`` (Transformer Engine's ``GroupedLinear``); neither is
importable here. :class:`GroupedMLP` takes the same place in the layer spec and computes the
same thing with one grouped GEMM per projection for the forward and the input gradient (and
for the weight gradient, unless it goes into megatron DDP's ``main_grad``, see
:class:`_GroupedMatmul`), using torch's CUTLASS grouped kernel (bf16 on Hopper; torch 2.13
also runs it on CPU in fp32, which is how parity with ``SequentialMLP`` is tested). On one H100
(Mixtral 8x7B's layers) the step is 472-477 ms against ``SequentialMLP``'s 705-1036 ms, whose
GPU mostly waits on the host (``benchmarks/moe/results/repeat-h100.txt``).
"""

from typing import Any

import torch
import torch.nn.functional as F


class _GroupedMatmul(torch.autograd.Function):
    """``y[rows of expert e] = x[rows of expert e] @ weight[e].T`` with its two gradients.

    Written out rather than left to torch's autograd formula for two reasons. The incoming
    gradient is made contiguous first: torch 2.13's CPU kernel rejects the stride-0 gradients
    that a broadcast produces. And with ``counts`` (the tokens per expert, known on the host)
    and a weight that carries megatron DDP's fp32 ``main_grad``, each expert's weight gradient
    is added straight into ``main_grad`` by one ``addmm`` (fp32 accumulation in cuBLAS, as
    megatron-core's linears do under ``gradient_accumulation_fusion``): a grouped GEMM cannot
    accumulate into its output, and writing a bf16 gradient for DDP to add afterwards costs a
    pass over every expert weight in every micro-batch.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor,  # type: ignore[override]
                offsets: torch.Tensor, counts: list[int] | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight, offsets)
        ctx.counts = counts
        return torch._grouped_mm(x, weight.transpose(-2, -1), offs=offsets)

    @staticmethod
    def backward(ctx: Any,  # type: ignore[override]
                 grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, None, None]:
        x, weight, offsets = ctx.saved_tensors
        grad = grad.contiguous()
        grad_x = torch._grouped_mm(grad, weight, offs=offsets)
        if ctx.counts is None:
            grad_weight = torch._grouped_mm(grad.t(), x, offs=offsets)  # [experts, out, in]
            return grad_x, grad_weight, None, None
        main_grad = weight.main_grad
        for e, (g, inp) in enumerate(zip(grad.split(ctx.counts), x.split(ctx.counts),
                                         strict=True)):
            if g.dtype == main_grad.dtype:  # fp32 training (the CPU tests): no dtype_out kernel
                main_grad[e].addmm_(g.t(), inp)
            else:
                torch.addmm(main_grad[e], g.t(), inp, out_dtype=main_grad.dtype, out=main_grad[e])
        return grad_x, _dummy_weight_grad(weight, grad.dtype), None, None


def _dummy_weight_grad(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """What megatron-core's linears return as the weight gradient once it is in ``main_grad``.

    Under megatron DDP (``grad_added_to_main_grad`` set) a tensor that DDP's hook then skips,
    so the hooks run on the main backward thread; without it, no gradient.
    """
    if not hasattr(weight, "grad_added_to_main_grad"):
        return None
    weight.grad_added_to_main_grad = True
    make = torch.zeros if getattr(weight, "zero_out_wgrad", False) else torch.empty
    return make(weight.shape, dtype=dtype, device=weight.device)


def grouped_matmul(x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor,
                   counts: list[int] | None = None) -> torch.Tensor:
    """Rows of ``x`` [tokens, in] grouped by ``offsets`` (int32 ends) times ``weight[e].T``.

    ``weight`` is [experts, out, in] (``nn.Linear``'s layout per expert). With ``counts``
    (``offsets`` as host integers) the weight gradient is accumulated into
    ``weight.main_grad`` (see :class:`_GroupedMatmul`).
    """
    return _GroupedMatmul.apply(x, weight, offsets, counts)


class GroupedMLP(torch.nn.Module):
    """The experts of one MoE layer, in ``SequentialMLP``'s place and with its results.

    Takes what megatron-core's ``MoELayer`` passes its experts (0.16 through 0.19) and returns
    ``(output, None)``. Weights are two tensors, ``weight1`` [experts, fc1 out, hidden] and
    ``weight2`` [experts, hidden, ffn], each expert's slice laid out as that expert's
    ``linear_fc1``/``linear_fc2`` weight in ``SequentialMLP`` (under expert tensor
    parallelism: this rank's shard; as there, the partial sums are reduced by the token
    dispatcher). No biases: the spec allows this path only for bias-free workloads.
    """

    def __init__(self, num_local_experts: int, config: Any, pg_collection: Any = None,
                 name: str | None = None) -> None:
        super().__init__()
        from megatron.core.tensor_parallel.layers import _initialize_affine_weight_gpu

        if config.add_bias_linear:
            raise ValueError("GroupedMLP has no expert biases; use SequentialMLP")
        self.config = config
        self.num_local_experts = num_local_experts
        self._padded_offsets: tuple[tuple[int, ...], torch.Tensor] | None = None
        tp = pg_collection.expt_tp.size()
        ffn = config.moe_ffn_hidden_size // tp
        fc1 = 2 * ffn if config.gated_linear_unit else ffn
        device = None if config.use_cpu_initialization else torch.cuda.current_device()
        shapes = {"weight1": (fc1, config.hidden_size), "weight2": (config.hidden_size, ffn)}
        inits = {"weight1": config.init_method, "weight2": config.output_layer_init_method}
        expert_parallel = pg_collection.ep.size() > 1
        for name_, (rows, cols) in shapes.items():
            weight = torch.nn.Parameter(torch.empty(num_local_experts, rows, cols, device=device,
                                                    dtype=config.params_dtype))
            if config.use_cpu_initialization:
                inits[name_](weight.data)
            else:  # the expert-parallel RNG stream, as megatron-core's expert linears use
                _initialize_affine_weight_gpu(weight, inits[name_],
                                              partition_dim=1 if name_ == "weight1" else 2,
                                              is_expert=True)
            weight.allreduce = not expert_parallel  # megatron DDP: expert-parallel params
            setattr(self, name_, weight)

    def _activation(self, h: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        """``SequentialMLP``'s expert activation, weighted by each token's router probability."""
        c = self.config
        if c.gated_linear_unit and c.bias_activation_fusion and c.activation_func is F.silu:
            from megatron.core.fusions.fused_bias_swiglu import weighted_bias_swiglu_impl

            return weighted_bias_swiglu_impl(h, None, probs)
        if c.gated_linear_unit:
            gate, up = h.chunk(2, dim=-1)
            out = c.activation_func(gate) * up
        else:
            out = c.activation_func(h)
        return (out * probs).to(out.dtype)

    def forward(self, permuted_local_hidden_states: torch.Tensor, tokens_per_expert: torch.Tensor,
                permuted_probs: torch.Tensor) -> tuple[torch.Tensor, None]:
        """Tokens sorted by expert [tokens, hidden] -> expert outputs [tokens, hidden]."""
        x = permuted_local_hidden_states
        offsets = self._offsets(tokens_per_expert, x.device)
        # SequentialMLP reads the counts on the host too; only the fused weight gradient needs them
        counts = tokens_per_expert.tolist() if self._wgrad_into_main_grad() else None
        h = grouped_matmul(x, self.weight1, offsets, counts)
        h = self._activation(h, permuted_probs.unsqueeze(-1))
        return grouped_matmul(h, self.weight2, offsets, counts), None

    def _offsets(self, tokens_per_expert: torch.Tensor, device: torch.device) -> torch.Tensor:
        """Each expert's end row in the sorted tokens, on ``device``.

        Padded to capacity (``moe_pad_expert_input_to_capacity``), the counts are the same
        every step and megatron-core's dispatcher gives them on the host: their device copy is
        made once and kept, so a captured step holds no copy from pageable host memory (which
        a CUDA graph cannot capture).
        """
        if not self.config.moe_pad_expert_input_to_capacity:
            return torch.cumsum(tokens_per_expert.to(device), 0, dtype=torch.int32)
        key = tuple(tokens_per_expert.tolist())
        if self._padded_offsets is None or self._padded_offsets[0] != key:
            ends = torch.tensor(key, dtype=torch.int64).cumsum(0).to(torch.int32)
            self._padded_offsets = (key, ends.to(device))
        return self._padded_offsets[1]

    def _wgrad_into_main_grad(self) -> bool:
        """Whether weight gradients go straight into DDP's fp32 ``main_grad`` (``wgrad_fusion``)."""
        return self.config.gradient_accumulation_fusion and hasattr(self.weight1, "main_grad")

    def backward_dw(self) -> None:
        """Nothing deferred: weight gradients are computed in the backward pass."""
