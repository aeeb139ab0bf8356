"""One CUDA graph for the forward and backward of a whole training step.

Without Transformer Engine a gpt3-1.3b step launches ~5000 kernels through megatron-core's
Python, and the GPU waits for some of them: capturing the step once and replaying it saved
5 ms of 551 on an H100 and 31 ms of 556 on an H200 (``benchmarks/results/engine_throughput-*``).

megatron-core's ``FullCudaGraphWrapper`` does the same, but captures on a stream of its own
while the autograd nodes of the parameters (``AccumulateGrad``, which megatron's DDP creates
and keeps at wrap time) stay bound to the stream current when they were made; torch 2.11
then refuses the capture ("operation would make the legacy stream depend on a capturing
blocking stream") unless it has ``set_override_stale_capture_stream`` (pytorch#180090). Here
the engine makes one side stream current before it builds and wraps the model and captures
on that stream, so every node lives on the stream the step is captured on.
"""

from collections.abc import Callable, Iterator
from typing import Any

import torch


class StepGraph:
    """``forward_backward_func`` of megatron-core's schedules, captured after ``warmup`` calls.

    Each call copies the step's micro-batches into static input buffers (the graph reads them
    from fixed addresses); the first ``warmup`` calls run eagerly (cuBLAS/cuDNN plans, Triton
    compilation), the next one captures, and every call from then on replays. The returned
    losses are the same tensors each time, refreshed in place by each replay.
    """

    def __init__(self, forward_backward_func: Callable[..., Any], stream: torch.cuda.Stream,
                 warmup: int = 1) -> None:
        self.stream = stream
        self._fwd_bwd = forward_backward_func
        self._warmup = warmup
        self._calls = 0
        self._graph: torch.cuda.CUDAGraph | None = None
        self._inputs: list[dict[str, torch.Tensor]] = []
        self._result: Any = None

    def _static_inputs(self, batches: Iterator[dict[str, torch.Tensor]]) -> Iterator[dict]:
        fresh = list(batches)
        if not self._inputs:
            self._inputs = [{k: v.clone() for k, v in b.items()} for b in fresh]
        else:
            for static, batch in zip(self._inputs, fresh, strict=True):
                for key, value in batch.items():
                    static[key].copy_(value, non_blocking=True)
        return iter(self._inputs)

    def __call__(self, *, data_iterator: Iterator[dict[str, torch.Tensor]], **kwargs: Any) -> Any:
        """Run one step: eagerly while warming up, else by replaying the captured graph."""
        inputs = self._static_inputs(data_iterator)
        self._calls += 1
        if self._graph is None and self._calls <= self._warmup:
            return self._fwd_bwd(data_iterator=inputs, **kwargs)
        if self._graph is None:
            self._capture(inputs, kwargs)
        assert self._graph is not None
        self._graph.replay()
        return self._result

    def _capture(self, inputs: Iterator[dict], kwargs: dict[str, Any]) -> None:
        from megatron.core.tensor_parallel.random import get_all_rng_states

        graph = torch.cuda.CUDAGraph()
        for state in get_all_rng_states().values():
            if isinstance(state, torch.Generator):
                graph.register_generator_state(state)
        # torch.cuda.graph synchronizes and empties the allocator's cache before capturing, so
        # the eager steps' cached blocks and the graph's private pool are never held together
        with torch.cuda.graph(graph, stream=self.stream, capture_error_mode="thread_local"):
            self._result = self._fwd_bwd(data_iterator=inputs, **kwargs)
        self._graph = graph

    def release(self) -> None:
        """Drop the graph, its memory pool and the static inputs."""
        self._graph, self._result, self._inputs = None, None, []
