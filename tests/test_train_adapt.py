"""``fixup train --adapt module:factory`` adapts a user's model by the method ``--init`` names."""

from __future__ import annotations

from pathlib import Path

import pytest

FACTORY = '''
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(x + self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))


def build(num_classes=10, in_channels=1):
    return nn.Sequential(nn.Conv2d(in_channels, 8, 3, padding=1), nn.ReLU(), Block(8), Block(8),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, num_classes))
'''


@pytest.fixture
def factory(tmp_path: Path) -> str:
    path = tmp_path / "user_cnn.py"
    path.write_text(FACTORY)
    return f"{path}:build"


def _fit(factory: str, **fields: object):
    from fixup.train import TrainConfig, fit

    config = TrainConfig(adapt=factory, batch_size=64, max_updates=2, epochs=1, checkpoint=False, device="cpu",
                         **fields)
    return fit(config, out_dir=None, progress=False)


@pytest.mark.parametrize("init", ["rezero", "skipinit"])
def test_init_names_the_method_the_users_model_is_adapted_by(factory: str, init: str) -> None:
    result = _fit(factory, init=init)
    assert result.outcome.status == "completed"
    groups = {g["name"] for g in result.param_groups}
    assert "gates" in groups, groups  # a gate at 0 on each branch (before, --init was ignored: trained as built)


def test_without_init_the_model_is_fixup_adapted_and_norm_none_trains_it_as_built(factory: str) -> None:
    fixup = {g["name"] for g in _fit(factory).param_groups}
    assert "scalars" in fixup and "gates" not in fixup
    assert {g["name"] for g in _fit(factory, norm="none").param_groups} <= {"weights", "no_decay", "default"}


def test_nf_resnet_adapts_the_users_model_and_trains_it_by_the_method_s_recipe(factory: str) -> None:
    result = _fit(factory, init="nf_resnet")
    assert result.outcome.status == "completed"
    groups = {g["name"]: g for g in result.param_groups}
    assert {"gates", "gains_biases"} <= set(groups) and groups["gains_biases"]["weight_decay"] == 0
    recipe = result.recipe if isinstance(result.recipe, dict) else result.recipe.to_dict()
    assert recipe["clip"] == "agc" and recipe["clip_from"] == "method"  # AGC, the NF-ResNets' recipe


def test_a_method_adapt_cannot_apply_is_refused_naming_what_works(factory: str) -> None:
    with pytest.raises(ValueError, match="t_fixup"):
        _fit(factory, init="t_fixup")


def _built(factory: str, **fields: object):
    import torch

    from fixup.train import TrainConfig
    from fixup.train.image_task import ImageClassification

    torch.manual_seed(0)
    config = TrainConfig(adapt=factory, device="cpu", checkpoint=False, **fields).validate()
    return ImageClassification(config).build_model(config)


def test_adapt_options_reach_fixup_adapt(factory: str) -> None:
    """--adapt-options '{"rescale": 2}' doubles rule 2's factor on the branches' inner layers (RegNet's lever,
    docs/adapt.md), the same draw otherwise; the zeroed last layers stay zero."""
    base, doubled = _built(factory), _built(factory, adapt_options={"rescale": 2})
    for name in ("2.conv1.weight", "3.conv1.weight"):
        a, b = base.get_parameter(name), doubled.get_parameter(name)
        assert float(b.detach().std()) == pytest.approx(2 * float(a.detach().std()), rel=1e-5), name
    assert not doubled.get_parameter("2.conv2.weight").any()


@pytest.mark.parametrize("fields, match", [
    ({"adapt_options": {"rescale": 2}, "adapt": ""}, "apply to a model the engine adapts"),
    ({"adapt_options": {"rescale": 2}, "norm": "none"}, "apply to a model the engine adapts"),
    ({"adapt_options": {"rescale": 2}, "init": "skipinit"}, "rescale"),
    ({"adapt_options": {"method": "rezero"}}, "set by the engine"),
    ({"adapt_options": {"trunk": "sideways"}}, "trunk"),
    ({"adapt_options": {"no_such_option": 1}}, "no_such_option"),
])
def test_adapt_options_that_cannot_apply_are_refused_before_anything_is_built(factory: str, fields, match) -> None:
    from fixup.train import TrainConfig

    with pytest.raises(ValueError, match=match):
        TrainConfig(**{"adapt": factory, **fields}).validate()
