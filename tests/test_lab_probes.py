"""Probes on real networks: layer statistics, functional update, batch coupling, symmetry, residual shapes."""

import math

import pytest
import torch
from torch import nn

from fixup.lab import (
    batch_coupling,
    build_model,
    functional_update,
    layer_stats,
    loglog_slope,
    residual_shapes,
    sample_batch,
    symmetry_probe,
    update_sweep,
)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def batch():
    return sample_batch(10, 8)


def test_loglog_slope_recovers_a_power_law_and_excludes_divergence():
    L = [10, 100, 1000, 10000]
    fit = loglog_slope(L, [3.0 * v**0.5 for v in L])
    assert fit["slope"] == pytest.approx(0.5) and fit["stderr"] == pytest.approx(0.0, abs=1e-9)
    fit = loglog_slope([*L, 10**5], [1.0, 2.2, 3.9, 8.5, math.inf])
    assert fit["excluded"] == 1 and fit["n"] == 4 and fit["stderr"] > 0


def test_fixup_first_step_moves_only_the_classifier(batch):
    x, y = batch
    rec = functional_update(build_model("resnet20", "fixup"), x, y, steps=(1, 2))
    step1, step2 = rec
    assert step1["df"] > 0
    assert all(b["df"] == 0.0 for b in step1["blocks"])  # zero classifier: no gradient reaches a branch
    assert max(b["df"] for b in step2["blocks"]) > 0  # the branches move from step 2


def test_fixup_step_k_is_bounded_in_depth_while_no_depth_scale_and_he_grow():
    """Scalars held fixed (scalar_lr_factor=0) as in section 3's analysis, which has no biases.

    With the scalar biases trained at the full rate, Fixup's Δf also grows with L (docs/lab.md).
    """
    res = update_sweep("resnet_cifar", (20, 110), methods=("fixup", "fixup_no_depth_scale"), steps=(10,),
                       scalar_lr_factor=0.0)
    df = {(r["method"], r["depth"]): r["df_max"] for r in res["records"]}
    assert df[("fixup", 110)] < 1.5 * df[("fixup", 20)]
    # without rule 2's factor Δf grows with depth until the logits' change saturates (about 5 from 56 layers on,
    # with the stem drawn from its fan-in), far beyond Fixup's at the same depth
    assert df[("fixup_no_depth_scale", 110)] > 10 * df[("fixup_no_depth_scale", 20)]
    assert df[("fixup_no_depth_scale", 110)] > 30 * df[("fixup", 110)]
    he = update_sweep("resnet_cifar", (20, 56), methods=("none",), steps=(1,))["records"]
    shallow, deep = (r["df"] for r in he)
    assert not math.isfinite(deep) or deep > 100 * shallow


@pytest.mark.slow
def test_depth_sweep_to_about_400_layers():
    res = update_sweep("resnet_cifar", (20, 56, 110, 200, 398), methods=("fixup", "fixup_no_depth_scale", "none"),
                       steps=(1, 10), scalar_lr_factor=0.0)
    fits = res["fits"]
    assert abs(fits["fixup"]["df_max@10"]["slope"]) < 0.15
    assert fits["fixup_no_depth_scale"]["df_max@10"]["slope"] > 1.0
    deep = [r for r in res["records"] if r["method"] == "none" and r["depth"] >= 110]
    assert all(not math.isfinite(r["df"]) for r in deep)


@pytest.mark.slow
def test_depth_sweep_of_the_depth_study_wide_resnet():
    res = update_sweep("wide_resnet", (16, 52, 100, 202, 400), methods=("fixup", "fixup_no_depth_scale"),
                       steps=(10,), scalar_lr_factor=0.0)
    fits = res["fits"]
    assert abs(fits["fixup"]["df_max@10"]["slope"]) < 0.2
    # without rule 2's factor Δf grows from 16 layers and saturates at 5-20 from about 50 on (fan-in stem)
    assert fits["fixup_no_depth_scale"]["df_max@10"]["slope"] > 0.5
    deepest = {r["method"]: r["df_max"] for r in res["records"] if r["depth"] == 400}
    assert deepest["fixup_no_depth_scale"] > 30 * deepest["fixup"]


def test_layer_stats_fixup_blocks_are_identities_and_only_classifier_gets_gradient(batch):
    x, y = batch
    recs = layer_stats(build_model("resnet20", "fixup"), x, y)
    train = [r for r in recs if r["mode"] == "train"]
    stage1 = [r for r in train if r["role"] == "block" and r["name"].startswith("layer1.")]
    assert len(stage1) == 3 and len({r["std"] for r in stage1}) == 1  # each block returns its input
    relu = next(r for r in train if r["name"] == "relu")
    assert 0.3 < relu["frac_zero"] < 0.7  # ReLU of a zero-mean preactivation
    assert all(r["grad_norm"] == 0.0 for r in train if r["role"] == "block")
    assert next(r for r in train if r["role"] == "classifier")["grad_norm"] > 0
    # with no batch statistic, train and eval mode see the same activations
    assert [r["std"] for r in recs if r["mode"] == "eval"] == [r["std"] for r in train]


def test_layer_stats_batchnorm_modes_differ_and_model_is_untouched(batch):
    x, y = batch
    model = build_model("resnet20", "batchnorm")
    before = model.layer1[0].norm1.running_mean.clone()
    recs = layer_stats(model, x, y)
    assert torch.equal(model.layer1[0].norm1.running_mean, before)
    scaled = layer_stats(model, 10 * x, y)  # train mode normalises by the batch; eval mode by stored statistics
    std = {(r["mode"], r["name"]): r["std"] for r in recs}
    std10 = {(r["mode"], r["name"]): r["std"] for r in scaled}
    assert std10[("train", "layer3.2")] == pytest.approx(std[("train", "layer3.2")], rel=0.01)
    assert std10[("eval", "layer3.2")] > 5 * std[("eval", "layer3.2")]


def test_saturation_is_counted_for_bounded_activations():
    net = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 3))
    with torch.no_grad():
        net[0].weight.mul_(100.0)
    recs = layer_stats(net, torch.randn(16, 4), modes=("eval",))
    tanh = next(r for r in recs if r["type"] == "Tanh")
    assert tanh["frac_saturated"] > 0.5
    assert next(r for r in recs if r["name"] == "0")["frac_saturated"] is None


def test_batch_coupling_zero_for_fixup_positive_for_batchnorm_in_train_mode(batch):
    x, _ = batch
    out = {}
    for method in ("fixup", "batchnorm"):
        model = build_model("resnet20", method)
        with torch.no_grad():
            model.fc.weight.normal_()  # a non-zero classifier, so that the output itself is informative
        out[method] = {r["mode"]: r for r in batch_coupling(model, x[:1], x[1:5], x[5:9])}
    for mode in ("train", "eval"):
        assert out["fixup"][mode]["output_rel"] < 1e-6 and out["fixup"][mode]["blocks_rel"] < 1e-6
    assert out["batchnorm"]["train"]["output_rel"] > 0.05 and out["batchnorm"]["train"]["blocks_rel"] > 0.05
    assert out["batchnorm"]["eval"]["output_rel"] < 1e-6


def test_symmetry_probe_flags_identically_initialised_hidden_units(batch):
    x, y = batch
    model = build_model("resnet20", "none")
    assert not any(r["flagged"] for r in symmetry_probe(model, x, y, lr=0.01, steps=1))
    with torch.no_grad():  # one hidden layer of identical units with identical outgoing weights
        model.layer2[1].conv1.weight.fill_(0.01)
        model.layer2[1].conv2.weight.fill_(0.01)
    recs = {r["name"]: r for r in symmetry_probe(model, x, y, lr=0.01, steps=3)}
    assert recs["layer2.1.conv1"]["identical_nonzero"] == 32 and recs["layer2.1.conv1"]["largest"] == 32
    assert not recs["layer1.0.conv1"]["flagged"]


def test_symmetry_probe_sees_fixup_zeroed_layers_until_gradient_reaches_them(batch):
    x, y = batch
    model = build_model("resnet20", "fixup")
    after1 = {r["name"]: r for r in symmetry_probe(model, x, y, steps=1)}
    assert after1["layer1.0.conv2"]["all_zero"] and after1["layer1.0.conv2"]["flagged"]
    after2 = {r["name"]: r for r in symmetry_probe(model, x, y, steps=2)}
    assert not after2["layer1.0.conv2"]["flagged"]  # stage 1 has no zero-padded channels
    assert all(r["identical_nonzero"] == 0 for r in after2.values())


def test_residual_shapes_name_the_broken_block(batch):
    x, _ = batch
    model = build_model("resnet20", "fixup")
    assert all(r["ok"] for r in residual_shapes(model, x))
    model.layer2[1].conv2 = nn.Conv2d(32, 16, 3, 1, 1, bias=False)  # branch narrower than its shortcut
    recs = residual_shapes(model, x)
    bad = [r for r in recs if r["ok"] is False]
    assert [r["block"] for r in bad] == ["layer2.1"] and "layer2.1" in bad[0]["message"]
    assert all(r["ok"] for r in recs if r["block"] in ("layer1.0", "layer2.0"))


class _Broadcasting(nn.Module):
    """A residual block that adds with a plain `+`, so a one-channel branch broadcasts silently."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 1, 3, padding=1)

    def residual_branches(self):
        from fixup.branch import Branch

        return [Branch([self.conv])]

    def forward(self, x):
        return x + self.conv(x)


def test_residual_shapes_catch_a_sum_that_broadcast():
    net = nn.Sequential(_Broadcasting())
    (rec,) = residual_shapes(net, torch.randn(2, 4, 5, 5))
    assert rec["ok"] is False and rec["branch"] == [[2, 1, 5, 5]] and "broadcast" in rec["message"]
