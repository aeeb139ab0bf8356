"""The deepspeed engine's speed features against the plain path, fp32 on the CPU: the fused
cross-entropy and ``torch.compile``d blocks give the loss and gradients of the plain model."""

import copy

import pytest
import torch

from kit.config.loader import load_workload
from kit.config.workload import padded_vocab_size
from kit.engines.deepspeed import speed
from kit.engines.deepspeed.model import Block, CausalLM
from kit.engines.kernels.compiled import compile_modules


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("workload", ["gpt3-tiny", "mixtral-tiny"])
def test_fused_loss_and_compiled_blocks_match_the_plain_model(workload):
    w = load_workload(workload)
    vocab = padded_vocab_size(w.vocab_size)
    torch.manual_seed(0)
    tokens = torch.randint(0, w.vocab_size, (2, w.seq_length))
    labels = torch.randint(0, w.vocab_size, (2, w.seq_length))

    plain = CausalLM(w, vocab, seed=7, recompute=False, loss_fn=speed.plain_loss)
    fast = copy.deepcopy(plain)
    fast.loss_fn = speed.loss_function(frozenset({"cross_entropy"}))
    assert compile_modules([fast], Block) == w.num_layers

    losses = []
    for model in (plain, fast):
        loss, _ = model(tokens, labels)
        loss.backward()
        losses.append(loss.detach())
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-5)
    want, got = _grads(plain), _grads(fast)
    assert want.keys() == got.keys() and len(want) > 0
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-5, msg=name)
