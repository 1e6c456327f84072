"""The stream biases: declared by their blocks, budgeted by fixup.param_groups, watched for collapse."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fixup
from fixup.branch import find_branches
from fixup.groups import stream_biases
from fixup.lab.stream import stream_probe
from fixup.perf.ops import set_lean
from fixup.train import TrainConfig, fit
from fixup.train.collapse import CollapseWatch, live_fraction, stream_offsets
from fixup.train.task import create_task


def _groups(model: nn.Module, **kw) -> dict[str, dict]:
    return {g["name"]: g for g in fixup.param_groups(model, 0.1, 5e-4, **kw)}


@pytest.mark.parametrize(("name", "kw"), [("resnet_cifar", {"depth": 20}), ("wide_resnet", {"depth": 16}),
                                          ("resnet_imagenet_bottleneck_tiny", {})])
def test_each_branch_declares_the_bias_after_its_last_layer_as_its_stream_bias(name: str, kw: dict) -> None:
    model = fixup.create_model(name, **kw)
    branches = [b for _, b in find_branches(model)]
    assert all(isinstance(b.stream_bias, fixup.Bias) and b.stream_bias not in b.biases for b in branches)
    assert len(stream_biases(model)) == len(branches) == model.init_report.num_stream_biases
    literal = fixup.create_model(name, init="fixup_no_stream_bias", **kw)
    assert all(b.stream_bias is None for _, b in find_branches(literal)) and not stream_biases(literal)
    assert literal.init_report.stream_bias == "none" and "rule 3 taken literally" in str(literal.init_report)


def test_param_groups_give_the_stream_biases_one_scalars_rate_between_them() -> None:
    model = fixup.create_model("resnet_cifar", depth=56)  # 27 blocks
    groups = _groups(model)
    assert groups["weights"]["lr"] == 0.1 and groups["scalars"]["lr"] == pytest.approx(0.01)
    assert len(groups["stream_biases"]["params"]) == 27
    assert groups["stream_biases"]["lr"] == pytest.approx(0.01 / 27)
    assert all(n.endswith("bias2b.bias") for n in groups["stream_biases"]["param_names"])
    every = [p for g in groups.values() for p in g["params"]]
    assert len(every) == len({id(p) for p in every}) == len(list(model.parameters()))
    # the authors' parameterisation: every scalar at the scalar rate, one argument away either way
    assert set(_groups(fixup.create_model("resnet_cifar", depth=56, init="fixup_paper"))) == {"weights", "scalars"}
    assert set(_groups(model, stream_budget=False)) == {"weights", "scalars"}
    assert _groups(model, scalar_lr_mult=1.0)["stream_biases"]["lr"] == pytest.approx(0.1 / 27)


def _sgd_first_step(p: torch.Tensor, g: torch.Tensor, lr: float, wd: float) -> torch.Tensor:
    return -lr * (g + wd * p)  # momentum's buffer starts as the first gradient


def _adamw_first_step(p: torch.Tensor, g: torch.Tensor, lr: float, wd: float) -> torch.Tensor:
    # decoupled decay, then the bias-corrected first moment over the root second moment: g / (|g| + eps)
    return -lr * wd * p - lr * g / (g.abs() + 1e-8)


@pytest.mark.parametrize(("make", "first_step"), [
    (lambda groups: torch.optim.SGD(groups, lr=1.0, momentum=0.9), _sgd_first_step),
    (lambda groups: torch.optim.AdamW(groups, lr=1.0), _adamw_first_step)], ids=["SGD", "AdamW"])
def test_param_groups_feed_any_optimiser_look_through_ddp_and_skip_frozen_parameters(make, first_step) -> None:
    model = fixup.create_model("resnet_cifar", depth=8)
    with torch.no_grad():  # off the zero initialisation, so that every parameter has a gradient
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    model.conv1.weight.requires_grad_(False)
    groups = fixup.param_groups(nn.DataParallel(model), 0.1, 5e-4)
    assert "conv1.weight" not in groups[0]["param_names"]
    # weights at lr, scalars at lr/10, the 3 stream biases sharing one scalar's rate: three distinct rates
    rates = {g["name"]: g["lr"] for g in groups}
    assert rates == pytest.approx({"weights": 0.1, "scalars": 0.01, "stream_biases": 0.01 / 3})
    opt = make(groups)  # the optimiser's own lr (1.0) must not replace any group's
    assert [(g["lr"], g["weight_decay"]) for g in opt.param_groups] == [(g["lr"], g["weight_decay"]) for g in groups]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model(torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(0))).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    opt.step()
    params = dict(model.named_parameters())
    assert torch.equal(params["conv1.weight"], before["conv1.weight"])  # frozen: not in any group, not moved
    for g in groups:
        for name in g["param_names"]:
            moved = params[name].detach() - before[name]
            assert moved.abs().max() > 0, f"{name} ({g['name']}) did not move"
            expected = first_step(before[name], grads[name], g["lr"], g["weight_decay"])
            torch.testing.assert_close(moved, expected, rtol=1e-4, atol=1e-7, msg=f"{name} in {g['name']}")
    with pytest.raises(ValueError, match="lr must be a finite number >= 0, got nan"):
        fixup.param_groups(model, float("nan"))


def test_in_a_stage_every_stream_bias_gets_the_same_gradient_and_the_budget_keeps_the_offset_slow() -> None:
    x, y = torch.randn(16, 3, 8, 8, generator=torch.Generator().manual_seed(0)), torch.arange(16) % 10
    paper = fixup.create_model("resnet_cifar", depth=20, init="fixup_paper", generator=torch.Generator().manual_seed(0))
    out = stream_probe(paper, x, y, steps=4)
    assert out["grad_step"] == 2  # step 1 has none: the classifier starts at zero
    assert [s["blocks"] for s in out["stages"]] == [3, 3, 3]
    assert all(s["identical"] and s["relative_spread"] < 1e-6 and s["offset_speed"] == pytest.approx(3)
               for s in out["stages"])
    set_lean(paper, False)  # the straightforward forward: bit-identical
    assert all(s["relative_spread"] == 0 for s in stream_probe(paper, x, y, steps=2)["stages"])
    assert not out["stream_budget"] and out["stream_bias_lr"] == pytest.approx(0.01)
    budget = stream_probe(paper, x, y, steps=4, stream_budget=True)
    assert budget["stream_bias_lr"] == pytest.approx(0.01 / 9)
    for stage in ("layer1", "layer2", "layer3"):  # the same gradients, a ninth of the rate: a ninth of the drift
        assert abs(budget["steps"][2][stage]) == pytest.approx(abs(out["steps"][2][stage]) / 9, rel=1e-3)


def test_stream_probe_runs_on_an_adapted_model() -> None:
    from torch.nn import functional as F

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
            self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)

        def forward(self, x):
            return F.relu(x + self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))

    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), Block(), Block(), Block(),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    model, report = fixup.adapt(net, torch.randn(2, 3, 8, 8))
    assert report.num_stream_biases == 3
    out = stream_probe(model, torch.randn(8, 3, 8, 8), torch.arange(8), steps=3)
    assert out["stream_biases"] == 3 and out["stages"][0]["identical"]


def test_live_fraction_and_offsets() -> None:
    assert float(live_fraction(torch.tensor([[0.0, 1.0], [0.0, 2.0]]))) == 0.5
    assert float(live_fraction(torch.full((4, 3), 7.5))) == 0.0  # a constant, however large, is dead
    assert float(live_fraction(torch.randn(2, 5, 6))) == 1.0  # (B, T, C): over batch and positions
    model = fixup.create_model("resnet_cifar", depth=14)
    with torch.no_grad():
        for _, b in find_branches(model):
            b.stream_bias.bias.fill_(-1.0)
    assert stream_offsets(model) == {"layer1": -2.0, "layer2": -2.0, "layer3": -2.0}


class _DeadTask:
    """The digits task with a model whose last stage's stream biases kill every unit after the last ReLU."""

    def __init__(self, config: TrainConfig) -> None:
        self.inner = create_task(config)

    def build_model(self, config: TrainConfig) -> nn.Module:
        model = self.inner.build_model(config)
        with torch.no_grad():
            model.layer3[-1].bias2b.bias.fill_(-1e3)
        return model

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def test_a_dead_network_ends_the_run_as_collapsed_with_the_reason() -> None:
    config = TrainConfig(depth=8, epochs=3, batch_size=64, collapse_patience=5)
    result = fit(config, task=_DeadTask(config), progress=False)
    assert result.outcome == "collapsed" and result.outcome.step == 5 and result.exit_code == 5
    assert "no unit of the classifier's input has varied across the batch since step 1 (5 steps)" in result.reason
    assert "layer3 -1e+03" in result.reason
    healthy = fit(TrainConfig(depth=8, epochs=1, batch_size=64, collapse_patience=5), progress=False)
    assert healthy.outcome == "completed" and 0 < healthy.final["live_fraction"] <= 1
    assert {"stream_offset.layer1", "stream_offset.layer2", "stream_offset.layer3"} <= set(healthy.final)


def test_the_watch_is_off_with_patience_zero_and_for_models_without_a_classifier() -> None:
    model = fixup.create_model("resnet_cifar", depth=8)
    assert not CollapseWatch(model, 0).active and CollapseWatch(model, 3).active
    assert not CollapseWatch(nn.Linear(2, 2), 3).active


@pytest.mark.slow
def test_the_papers_placement_collapses_a_wide_resnet_1000_at_the_full_scalar_rate() -> None:
    """The failure the stream budget corrects (docs/training.md): WRN-1000, digits, lr 0.1, batch 32."""
    common = {"model": "wide_resnet", "depth": 1000, "width": 1, "channels": 3, "epochs": 1, "batch_size": 32,
              "schedule": "constant", "scalar_lr_mult": 1.0}
    paper = fit(TrainConfig(init="fixup_paper", **common), progress=False)
    assert paper.outcome == "collapsed", paper.outcome
