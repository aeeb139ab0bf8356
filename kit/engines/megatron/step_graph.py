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

from collections.abc import Callable
from typing import Any

import torch


class StaticBatches:
    """The step's micro-batches at fixed addresses, refreshed in place each step.

    A graph reads its inputs from the tensors it was captured with: the first step's batches
    are cloned once, and each later step's are copied into those clones. A step's data is one
    iterator of batches, or one per virtual pipeline chunk (``None`` for a chunk whose stage
    reads no data), as megatron-core's schedules take it.
    """

    def __init__(self) -> None:
        self._held: list[list[dict[str, torch.Tensor]] | None] | None = None

    def load(self, data_iterator: Any) -> Any:
        """Copy this step's batches in; return iterators over the held ones, shaped like
        ``data_iterator``."""
        chunks = data_iterator if isinstance(data_iterator, list) else [data_iterator]
        fresh = [None if it is None else list(it) for it in chunks]
        if self._held is None:
            self._held = [None if b is None else [{k: v.clone() for k, v in x.items()} for x in b]
                          for b in fresh]
        else:
            for held, batches in zip(self._held, fresh, strict=True):
                for static, batch in zip(held or [], batches or [], strict=True):
                    for key, value in batch.items():
                        static[key].copy_(value, non_blocking=True)
        out = [None if held is None else iter(held) for held in self._held]
        return out if isinstance(data_iterator, list) else out[0]


class StepGraph:
    """``forward_backward_func`` of megatron-core's schedules, captured after ``warmup`` calls.

    Each call copies the step's micro-batches into static input buffers (:class:`StaticBatches`:
    the graph reads them from fixed addresses); the first ``warmup`` calls run eagerly
    (cuBLAS/cuDNN plans, Triton compilation, every collective's first use), the next one
    captures, and every call from then on replays. Under pipeline parallelism every stage
    captures the same call after a barrier, so each stage's captured sends meet its peers'
    captured receives. The returned losses are the same tensors each time, refreshed in place
    by each replay.
    """

    def __init__(self, forward_backward_func: Callable[..., Any], stream: torch.cuda.Stream,
                 warmup: int = 1) -> None:
        self.stream = stream
        self._fwd_bwd = forward_backward_func
        self._warmup = warmup
        self._calls = 0
        self._graph: torch.cuda.CUDAGraph | None = None
        self._inputs = StaticBatches()
        self._result: Any = None

    def __call__(self, *, data_iterator: Any, **kwargs: Any) -> Any:
        """Run one step: eagerly while warming up, else by replaying the captured graph."""
        inputs = self._inputs.load(data_iterator)
        self._calls += 1
        if self._graph is None and self._calls <= self._warmup:
            return self._fwd_bwd(data_iterator=inputs, **kwargs)
        if self._graph is None:
            self._capture(inputs, kwargs)
        assert self._graph is not None
        self._graph.replay()
        return self._result

    def _capture(self, inputs: Any, kwargs: dict[str, Any]) -> None:
        import torch.distributed as dist
        from megatron.core.tensor_parallel.random import get_all_rng_states

        graph = torch.cuda.CUDAGraph()
        for state in get_all_rng_states().values():
            if isinstance(state, torch.Generator):
                graph.register_generator_state(state)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()  # every rank captures the same step, none still in an eager one
        # torch.cuda.graph synchronizes and empties the allocator's cache before capturing, so
        # the eager steps' cached blocks and the graph's private pool are never held together
        with torch.cuda.graph(graph, stream=self.stream, capture_error_mode="thread_local"):
            self._result = self._fwd_bwd(data_iterator=inputs, **kwargs)
        self._graph = graph

    def release(self) -> None:
        """Drop the graph, its memory pool and the static inputs."""
        self._graph, self._result, self._inputs = None, None, StaticBatches()
