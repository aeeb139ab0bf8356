"""What an eager (not CUDA-graph) target's host adds to its step beyond the kernels.

Two effects the device-side model (kit.projection.compute, kit.projection.network) cannot see, each
taken from what the measured run and megatron-core's code say:

* **The pipeline's p2p synchronization.** megatron-core's p2p layer (``batch_p2p_comm`` and
  ``batch_p2p_sync``, both on by default, as the kit runs them) ends every p2p call with
  ``torch.cuda.synchronize()``: the host waits until the device has run everything queued
  before it issues the next chunk. A host-paced stream trails its host by at most the kernels
  of the layer the host issued last, so each call adds between nothing and one layer's device
  time of the chunk before it (the forward's on the first stage, the backward's on the last,
  both on an inner one; ``v`` chunks per micro-batch with virtual stages): the point is half
  of that, :func:`p2p_sync_s`.
* **Ranks paced by their hosts wait on each other.** Every p2p exchange (and every TP, CP or
  EP collective) makes one rank wait for another, and the step ends with the slowest. An
  eager source's steps vary with its host (the measured steps' spread, not the profiler's:
  profiled steps are left out); a target of ``k`` such ranks lasts, per step, as long as the
  slowest of ``k`` draws from that spread (``k``: the target's ranks over the measured run's,
  whose every step already is the slowest of its own ranks): :func:`coupling` is
  ``E[max of k draws] / median`` over the measured steps (point), ``1`` (every host at the
  median: low) and the slowest measured step over the median (high). A CUDA-graph source's
  spread is the replay's, not a host's: no coupling is drawn from it.
"""

import statistics

from kit.projection.span import Span


def expected_max(samples: tuple[float, ...] | list[float], k: int) -> float:
    """``E[max of k]`` independent draws from the empirical distribution of ``samples``.

    With the samples sorted, the ``i``-th (1-based) of ``n`` is the maximum with probability
    ``(i/n)^k - ((i-1)/n)^k``.
    """
    xs = sorted(samples)
    n = len(xs)
    if n == 0 or k < 1:
        raise ValueError("expected_max needs samples and k >= 1")
    return sum(x * ((i / n) ** k - ((i - 1) / n) ** k) for i, x in enumerate(xs, start=1))


def coupling(samples: tuple[float, ...] | list[float], ranks: int) -> Span:
    """The step's factor for ``ranks`` host-paced ranks that wait on each other.

    ``[1, E[max of ranks] / median, max / median]`` over the measured steps (module docstring).
    The point is at least 1: waiting on each other never makes the hosts faster than their
    median, though a few skewed samples (most steps fast, the median among the slow ones) can
    put ``E[max]`` below it.
    """
    median = statistics.median(samples)
    if ranks <= 1 or median <= 0:
        return Span.exact(1.0)
    point = max(1.0, expected_max(samples, ranks) / median)
    return Span.of(1.0, max(samples) / median, point=point)


def p2p_sync_s(device_per_layer_s: float, backward_share: float, stage: int, stages: int,
               virtual: int) -> Span:
    """Per micro-batch: what the synchronization after each p2p call adds (module docstring).

    ``device_per_layer_s``: the stage's device seconds of one layer and micro-batch (forward
    and backward); ``backward_share`` of it in the backward.
    """
    if stages <= 1:
        return Span.exact(0.0)
    if virtual > 1:
        share = float(virtual)
    elif stage == 0:
        share = 1 - backward_share
    elif stage == stages - 1:
        share = backward_share
    else:
        share = 1.0
    high = device_per_layer_s * share
    return Span(0.0, high / 2, high)
