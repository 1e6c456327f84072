"""Segment checkpointing: the same function and gradients, less memory, state dicts unchanged."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from fixup.bench.memory import peak_step_memory
from fixup.models import create_model
from fixup.perf.checkpointing import (
    CheckpointedSequential,
    checkpointed_stages,
    disable_checkpointing,
    enable_checkpointing,
)


def _perturbed(depth: int):
    model = create_model("resnet_cifar", depth=depth, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    return model


def test_segments_are_shared_among_stages_and_keys_unchanged():
    model = _perturbed(56)  # 9 blocks per stage
    keys = list(model.state_dict())
    enable_checkpointing(model, 6)
    stages = checkpointed_stages(model)
    assert [type(s) for _, s in stages] == [CheckpointedSequential] * 3
    assert [s.segments for _, s in stages] == [2, 2, 2]
    assert sum(len(list(s._bounds())) for _, s in stages) == 6
    assert list(model.state_dict()) == keys
    disable_checkpointing(model)
    assert all(type(s) is torch.nn.Sequential for _, s in checkpointed_stages(model))
    assert list(model.state_dict()) == keys


def test_outputs_and_gradients_equal_the_plain_model():
    model = _perturbed(20)
    checkpointed = enable_checkpointing(copy.deepcopy(model), 3)
    x, y = torch.randn(4, 3, 16, 16), torch.tensor([0, 1, 2, 3])
    F.cross_entropy(model(x), y).backward()
    F.cross_entropy(checkpointed(x), y).backward()
    for p, q in zip(model.parameters(), checkpointed.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-7)
    with torch.no_grad():
        torch.testing.assert_close(checkpointed(x), model(x))


def test_checkpointing_cuts_the_peak_memory_of_a_deep_step():
    x, y = torch.randn(16, 3, 32, 32), torch.zeros(16, dtype=torch.long)

    def peak(model):
        return peak_step_memory(lambda: F.cross_entropy(model(x), y).backward(), model, "cpu")["step_increase_bytes"]

    model = create_model("resnet_cifar", depth=56)
    plain = peak(model)  # activations of 27 blocks, plus the gradients (3.4 MB)
    enable_checkpointing(model, 9)  # three blocks per segment
    assert peak(model) < 0.5 * plain


@pytest.mark.parametrize("segments", [0, -2, 2.5, True])
def test_bad_segments_are_refused(segments):
    with pytest.raises(ValueError, match="segments must be"):
        enable_checkpointing(create_model("resnet20"), segments)


def test_model_without_stages_is_refused():
    with pytest.raises(ValueError, match=r"no nn\.Sequential of residual blocks"):
        enable_checkpointing(torch.nn.Sequential(torch.nn.Linear(2, 2)), 2)
