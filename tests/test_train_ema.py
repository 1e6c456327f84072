"""The moving average of the weights (``ema_decay``): its formula, its evaluation, its checkpoint, under DP too."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fixup.train import TrainConfig, fit
from fixup.train.ema import WeightAverage

TINY = {"depth": 8, "epochs": 2, "device": "cpu", "batch_size": 256}


def _weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_the_average_follows_the_formula_with_its_warm_up_and_keeps_integer_buffers_live() -> None:
    model = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    average = WeightAverage(model, decay=0.5)
    expected = {k: v.clone() for k, v in model.state_dict().items() if v.is_floating_point()}
    for t in range(4):  # decays 1/10, 2/11, 3/12, then capped at 0.5 (4/13 is below it: 0.31)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
            model[1].running_mean.add_(1.0)
            model[1].num_batches_tracked.add_(1)
        d = min(0.5, (1 + t) / (10 + t))
        assert average.current_decay() == pytest.approx(d)
        average.update()
        live = model.state_dict()
        expected = {k: d * v + (1 - d) * live[k] for k, v in expected.items()}
    assert "1.num_batches_tracked" not in average.names
    with average.applied():
        inside = _weights(model)
    for k, v in expected.items():
        torch.testing.assert_close(inside[k], v)
    assert int(inside["1.num_batches_tracked"]) == 4  # the live counter
    assert not torch.equal(model[0].weight, inside["0.weight"])  # the live weights came back


def test_the_live_weights_come_back_after_an_error_inside() -> None:
    model = nn.Linear(3, 2)
    average = WeightAverage(model, decay=0.9)
    with torch.no_grad():
        model.weight.add_(1.0)
    live = _weights(model)
    with pytest.raises(RuntimeError, match="boom"), average.applied():
        raise RuntimeError("boom")
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in live.items())


@pytest.mark.parametrize("decay", [1.0, -0.1])
def test_a_decay_outside_the_unit_interval_is_refused(decay: float) -> None:
    with pytest.raises(ValueError, match=r"ema_decay must lie in \[0, 1\)"):
        TrainConfig(ema_decay=decay).validate()
    with pytest.raises(ValueError, match=r"decay must lie in \(0, 1\)"):
        WeightAverage(nn.Linear(2, 2), decay if decay else 0.0)


def test_a_saved_average_of_another_model_is_refused_by_name() -> None:
    saved = WeightAverage(nn.Linear(3, 2), 0.9).state_dict()
    with pytest.raises(ValueError, match="shape"):
        WeightAverage(nn.Linear(4, 2), 0.9).load_state_dict(saved)
    with pytest.raises(ValueError, match="other tensors"):
        WeightAverage(nn.Sequential(nn.Linear(3, 2)), 0.9).load_state_dict(saved)


def test_a_run_evaluates_the_average_delivers_it_and_reports_the_live_model_beside(one_thread) -> None:
    plain = fit(TrainConfig(**TINY), progress=False)
    averaged = fit(TrainConfig(**TINY, ema_decay=0.9), progress=False)
    # the live weights are those of the run without the average: averaging never touches training
    assert averaged.final["live_test_acc"] == plain.final["test_acc"]
    assert averaged.final["live_test_loss"] == plain.final["test_loss"]
    assert averaged.final["test_loss"] != plain.final["test_loss"]
    a, p = _weights(averaged.model), _weights(plain.model)
    assert any(not torch.equal(a[k], p[k]) for k in a)  # the run hands back the averaged weights


def test_a_resumed_run_keeps_the_average_exactly(tmp_path, one_thread) -> None:
    cfg = TrainConfig(**TINY, ema_decay=0.8)
    straight = fit(cfg, out_dir=tmp_path / "straight", progress=False)
    first = fit(cfg, out_dir=tmp_path / "resumed", progress=False, on_step=lambda s: s.step == 7)  # mid-epoch 2
    assert first.outcome.status == "interrupted"
    resumed = fit(cfg, out_dir=tmp_path / "resumed", progress=False)
    a, b = _weights(straight.model), _weights(resumed.model)
    assert all(torch.equal(a[k], b[k]) for k in a)
    drop = ("time_s",)
    assert [{k: v for k, v in h.items() if k not in drop} for h in straight.history] == \
           [{k: v for k, v in h.items() if k not in drop} for h in resumed.history]


def test_a_private_run_averages_the_weights_it_releases(one_thread) -> None:
    pytest.importorskip("opacus", reason="opacus is not installed (pip install 'fixup-lab[dp]')")
    cfg = TrainConfig(model="wide_resnet", depth=10, width=1, init="skipinit", lr=0.5, device="cpu", batch_size=512,
                      epochs=2, dp=True, noise_multiplier=0.8)
    plain = fit(cfg, progress=False)
    averaged = fit(cfg.replace(ema_decay=0.5), progress=False)
    assert averaged.privacy == plain.privacy  # post-processing: the same steps spend the same epsilon
    assert averaged.final["live_test_acc"] == plain.final["test_acc"]
    assert averaged.final["test_loss"] != plain.final["test_loss"]
