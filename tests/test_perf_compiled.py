"""The lean path as torch.compile traces it, and the linear layers' fresh outputs.

Traced by dynamo and run through AOTAutograd, every convolutional family's lean forward gives eager's outputs
and gradients (the in-place map additions and ReLUs are functionalised). ``lean_linear`` on (B, T, D) inputs
returns a fresh tensor, so that the blocks' in-place residual sums and ReLUs do not cost backward a
zero-filled copy of the output per layer (AsStridedBackward0, CopySlices).
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo as dynamo
from torch import nn

from _perturb import perturbed
from fixup.bench.families import FAMILIES, build_variant, make_batch
from fixup.models import create_model
from fixup.perf.ops import lean_linear

_CONV_FAMILIES = {
    "cifar": dict(name="resnet_cifar", depth=8),
    "bottleneck": dict(name="resnet_imagenet_bottleneck_tiny"),
    "wide": dict(name="wide_resnet", depth=10, width=1),
}


def _model(family: str, method: str) -> nn.Module:
    kwargs = dict(_CONV_FAMILIES[family])
    return perturbed(create_model(kwargs.pop("name"), method=method, generator=torch.Generator().manual_seed(0),
                                  **kwargs))


# one family in the default run (each compiles for seconds on 2 cores); the others with -m slow
@pytest.mark.parametrize("family", [f if f == "cifar" else pytest.param(f, marks=pytest.mark.slow)
                                    for f in sorted(_CONV_FAMILIES)])
def test_compiled_formulation_matches_eager_outputs_and_gradients(family):
    """aot_eager runs the traced, functionalised graph op by op: the same function and gradients as eager."""
    model = _model(family, "fixup")
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    out = compiled(x)
    grads = torch.autograd.grad(out.square().sum(), list(model.parameters()))
    ref = model(x)
    ref_grads = torch.autograd.grad(ref.square().sum(), list(model.parameters()))
    # float32 sums in another order: tolerances relative to the sizes
    torch.testing.assert_close(out, ref, rtol=1e-3, atol=1e-4 * max(1.0, ref.abs().max().item()))
    largest = max(r.abs().max().item() for r in ref_grads)
    for (name, _), g, r in zip(model.named_parameters(), grads, ref_grads):
        atol = 1e-4 * max(1.0, r.abs().max().item(), 1e-3 * largest)
        torch.testing.assert_close(g, r, rtol=1e-3, atol=atol, msg=lambda m, n=name: f"{n}: {m}")


def _autograd_nodes(t: torch.Tensor) -> set[str]:
    seen, todo, names = set(), [t.grad_fn], set()
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        names.add(type(fn).__name__)
        todo.extend(f for f, _ in fn.next_functions)
    return names


def test_lean_linear_output_is_fresh_and_equal_to_linear():
    layer = nn.Linear(8, 6, bias=False)
    shift, scale = torch.tensor([0.3], requires_grad=True), torch.tensor([1.5], requires_grad=True)
    x = torch.randn(4, 5, 8)
    out = lean_linear(x, layer, shift=shift, scale=scale)
    assert out._base is None  # not a view: in-place changes need no copy in backward
    torch.testing.assert_close(out, scale * layer(x + shift))


def test_lean_transformer_backward_makes_no_copies_of_views():
    family = FAMILIES["transformer"]
    (src, tgt), _ = make_batch(family, 2)
    out = build_variant(family, "fixup")(src, tgt)
    nodes = _autograd_nodes(out)
    assert "AddmmBackward0" in nodes or "MmBackward0" in nodes
    assert not nodes & {"AsStridedBackward0", "CopySlices"}, nodes
