"""Every block family's lean forward computes what its straightforward forward does, keeping less.

For each family (CIFAR basic block with shortcuts A and B, ImageNet basic and bottleneck blocks, the
pre-activation wide block, the Transformer's attention and feed-forward branches) and each method that
builds it without normalisation, the lean path and the straightforward path (``set_lean(model, False)``)
give the same outputs and the same gradient for every parameter, with every scalar moved off its initial
value. The memory tests count what autograd keeps for backward.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from _perturb import perturbed as _perturbed
from fixup.bench.families import BARE_TRANSFORMER
from fixup.method import METHODS
from fixup.models import create_model
from fixup.perf.ops import set_lean

FIXUP_METHODS = [name for name, m in METHODS.items() if m.fixup]
CONV_METHODS = [*FIXUP_METHODS, "he", "xavier", "sqrt2"]
# name -> builder and its keyword arguments
CONV_FAMILIES = {
    "cifar-A": dict(name="resnet_cifar", depth=8, shortcut="A"),
    "cifar-B": dict(name="resnet_cifar", depth=8, shortcut="B"),
    "imagenet-basic": dict(name="resnet_imagenet_tiny"),
    "bottleneck": dict(name="resnet_imagenet_bottleneck_tiny"),
    "wide": dict(name="wide_resnet", depth=10, width=2),
}


def _conv_model(family: str, method: str) -> nn.Module:
    kwargs = dict(CONV_FAMILIES[family])
    name = kwargs.pop("name")
    return _perturbed(create_model(name, method=method, generator=torch.Generator().manual_seed(0), **kwargs))


def _compare(model: nn.Module, plain: nn.Module, *inputs: torch.Tensor, tol: float = 1e-5,
             reach: float = 1e-3) -> None:
    """Outputs, and every parameter's gradient, equal up to rounding: ``tol`` relative to the larger of the
    gradient's own size and ``reach`` times the largest gradient (rounding there reaches every sum)."""
    out, ref = model(*inputs), plain(*inputs)
    scale = ref.abs().max().item()
    torch.testing.assert_close(out, ref, rtol=10 * tol, atol=tol * max(scale, 1.0))
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    out.backward(g)
    ref.backward(g)
    grads = [q.grad for q in plain.parameters() if q.grad is not None]
    largest = max(g.abs().max().item() for g in grads)
    for (name, p), q in zip(model.named_parameters(), plain.parameters()):
        if q.grad is None:
            assert p.grad is None or not p.grad.any(), name
            continue
        # sums in a different order: compare relative to the gradient's own size and the largest gradient
        atol = tol * max(1.0, q.grad.abs().max().item(), reach * largest)
        torch.testing.assert_close(p.grad, q.grad, rtol=10 * tol, atol=atol, msg=lambda m, n=name: f"{n}: {m}")


def _lean_blocks(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if callable(getattr(m, "lean_ready", None))]


@pytest.mark.parametrize("method", CONV_METHODS)
@pytest.mark.parametrize("family", list(CONV_FAMILIES))
def test_conv_families_lean_equals_plain(family, method, one_thread):
    model = _conv_model(family, method)
    blocks = _lean_blocks(model)
    assert blocks and all(b.lean and b.lean_ready() for b in blocks)  # the lean path is what runs
    # float64: the two paths sum in different orders, and float32 rounding of a scalar bias's gradient (a sum
    # over every position) depends on the machine's kernels; in float64 a real difference stands out
    model = model.double()
    plain = set_lean(copy.deepcopy(model), False)
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    _compare(model, plain, x, tol=1e-9)


def test_wide_block_with_dropout_follows_the_same_random_mask(one_thread):
    model = _perturbed(create_model("wide_resnet", depth=10, width=1, dropout=0.3))
    plain = set_lean(copy.deepcopy(model), False)
    x = torch.randn(2, 3, 8, 8)
    torch.manual_seed(5)
    out = model(x)
    torch.manual_seed(5)
    ref = plain(x)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5 * ref.abs().max().item())


def _tokens(batch: int, length: int, seed: int) -> torch.Tensor:
    t = torch.randint(3, 60, (batch, length), generator=torch.Generator().manual_seed(seed))
    t[0, -2:] = 0  # padding at the end of one sentence: the key mask matters
    return t


@pytest.mark.parametrize("method", FIXUP_METHODS)
def test_transformer_lean_equals_plain(method, one_thread):
    kw = dict(d_model=32, ffn_dim=48, src_vocab=64, tgt_vocab=64, dropout=0.0)
    # Every method's structure, on the same sane weights: the ablations that only change initial values (x10,
    # no depth scaling) make the perturbed network so large that ReLUs at ~1e-14 flip under float64 rounding.
    model = create_model("transformer_tiny", method=method, **kw).double()
    reference = _perturbed(create_model("transformer_tiny", method="fixup", **kw)).double().state_dict()
    model.load_state_dict({k: v for k, v in reference.items() if k in model.state_dict()}, strict=False)
    blocks = _lean_blocks(model)
    assert len(blocks) == 2 * 2 + 3 * 2 and all(b.lean_ready() for b in blocks)
    plain = set_lean(copy.deepcopy(model), False)
    # Attention saturates in places: those weights' gradients are rounding noise of the others (1e-12 of the largest).
    _compare(model, plain, _tokens(3, 7, 1), _tokens(3, 5, 2), tol=1e-9, reach=1.0)


def test_transformer_lean_with_dropout_and_incremental_decoding(one_thread):
    model = _perturbed(create_model("transformer_tiny", d_model=32, ffn_dim=48, src_vocab=64, tgt_vocab=64,
                                    dropout=0.2, activation_dropout=0.1,
                                    generator=torch.Generator().manual_seed(0))).double()
    plain = set_lean(copy.deepcopy(model), False)
    src, tgt = _tokens(2, 6, 3), _tokens(2, 4, 4)
    torch.manual_seed(7)
    out = model(src, tgt)
    torch.manual_seed(7)
    ref = plain(src, tgt)
    torch.testing.assert_close(out, ref, rtol=1e-8, atol=1e-9 * ref.abs().max().item())
    model.eval()
    with torch.no_grad():  # step-by-step decoding with the cache equals the full pass
        memory, mask = model.encode(src)
        cache = model.new_cache()
        steps = [model.decode(tgt[:, i:i + 1], memory, mask, cache, start=i) for i in range(tgt.shape[1])]
        torch.testing.assert_close(torch.cat(steps, 1), model(src, tgt), rtol=1e-4, atol=1e-5)


def _saved_bytes(model: nn.Module, *inputs: torch.Tensor) -> int:
    """Bytes of distinct storages that autograd keeps for the backward pass of one forward."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(*inputs).sum().backward()
    return sum(storages.values())


@pytest.mark.parametrize("family", ["bottleneck", "wide"])
def test_lean_conv_families_keep_what_the_bare_network_keeps(family, one_thread):
    # batch 32: activations dominate, as in training (the lean path keeps a parameter-sized s * W per block)
    x = torch.randn(32, 3, 32, 32)
    lean = _conv_model(family, "fixup")
    plain = set_lean(copy.deepcopy(lean), False)
    bare = _conv_model(family, "he")
    lean_b, plain_b, bare_b = (_saved_bytes(m, x) for m in (lean, plain, bare))
    assert lean_b <= 1.05 * bare_b, (lean_b, bare_b)
    assert plain_b >= 1.3 * bare_b, (plain_b, bare_b)  # the straightforward path keeps a tensor per scalar


def test_lean_transformer_keeps_what_the_bare_transformer_keeps(one_thread):
    kw = dict(d_model=64, ffn_dim=128, src_vocab=64, tgt_vocab=64, dropout=0.0)
    lean = create_model("transformer_tiny", method="fixup", **kw)
    plain = set_lean(copy.deepcopy(lean), False)
    bare = create_model("transformer_tiny", method=METHODS["fixup_no_bias"], **kw)  # scale only: see below
    set_lean(bare, True)
    src, tgt = _tokens(8, 24, 1), _tokens(8, 24, 2)
    lean_b, plain_b, bare_b = (_saved_bytes(m, src, tgt) for m in (lean, plain, bare))
    # The bare reference has the multipliers too: the lean path keeps no scaled weight, only bias-sized vectors.
    assert lean_b <= 1.01 * bare_b, (lean_b, bare_b)
    assert plain_b >= 1.15 * bare_b, (plain_b, bare_b)
    # Against no scalars at all: the scaled weights' copies would be +8% here; what is left is the encoder
    # output's bias and multiplier, one (B, S, d) tensor that the cross-attentions keep (+2%).
    floor = create_model("transformer_tiny", method=BARE_TRANSFORMER, **kw)
    assert lean_b <= 1.03 * _saved_bytes(floor, src, tgt)
