"""The sync-free token permutation gives megatron-core's permutation exactly."""

import pytest
import torch


@pytest.mark.parametrize(("tokens", "experts", "top_k"), [(64, 4, 2), (37, 8, 2), (50, 8, 1)])
def test_sync_free_permute_matches_megatron(tokens, experts, top_k):
    from megatron.core.transformer.moe import moe_utils

    from kit.engines.megatron.moe_permute import sync_free_permute

    gen = torch.Generator().manual_seed(tokens)
    logits = torch.randn(tokens, experts, generator=gen)
    logits[:, 1] -= 100  # one expert gets no token
    chosen = torch.topk(logits, top_k, dim=-1).indices
    routing_map = torch.zeros(tokens, experts, dtype=torch.bool).scatter_(1, chosen, True)
    probs = torch.softmax(logits, -1) * routing_map
    hidden = torch.randn(tokens, 16, generator=gen)
    results = []
    for permute in (moe_utils.permute, sync_free_permute(moe_utils.permute)):
        x, p = hidden.clone().requires_grad_(), probs.clone().requires_grad_()
        # three values up to megatron-core 0.18, five (padding offsets, tokens per expert) after
        out, out_probs, indices, *rest = permute(x, routing_map, probs=p,
                                                 num_out_tokens=tokens * top_k)
        (out.sum(-1) * out_probs).sum().backward()
        results.append((out, out_probs, indices, x.grad, p.grad, *rest))
    assert len(results[0]) == len(results[1])
    for want, got in zip(*results, strict=True):
        assert (want is None and got is None) or torch.equal(want, got)


def test_other_cases_fall_through_to_megatron():
    from kit.engines.megatron.moe_permute import sync_free_permute

    calls = []

    def original(*args, **kwargs):
        calls.append(kwargs)
        return "megatron"

    permute = sync_free_permute(original)
    routing_map = torch.ones(4, 2, dtype=torch.bool)
    assert permute(torch.ones(4, 3), routing_map, num_out_tokens=torch.tensor(8)) == "megatron"
    assert permute(torch.ones(4, 3), routing_map, num_out_tokens=8, drop_and_pad=True) == "megatron"
    assert permute(torch.ones(4, 3), routing_map, num_out_tokens=None) == "megatron"
    assert permute(torch.ones(4, 3), routing_map, num_out_tokens=8, pad=1) == "megatron"
    assert len(calls) == 4 and calls[-1]["pad"] == 1


def test_the_adapter_installs_and_removes_it_in_both_megatron_modules():
    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    from kit.engines.megatron import adapter

    original = moe_utils.permute
    adapter.use_sync_free_permute(True)
    try:
        assert getattr(token_dispatcher.permute, "kit_sync_free", False)
        assert moe_utils.permute is token_dispatcher.permute
    finally:
        adapter.use_sync_free_permute(False)
    assert moe_utils.permute is original and token_dispatcher.permute is original
