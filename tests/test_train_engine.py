"""The training engine: learning on digits, exact resume, divergence as data, parameter groups, schedules."""

from __future__ import annotations

import math

import pytest
import torch

import fixup
from fixup.branch import find_branches
from fixup.cli import build_parser
from fixup.cli import main as cli_main
from fixup.nn import Bias, Scale
from fixup.train import CheckpointError, TrainConfig, config_groups, fit, lr_factor
from fixup.train.cli import config_from_args
from fixup.train.engine import CHECKPOINT
from fixup.train.task import create_task

SMALL = {"depth": 8, "batch_size": 64, "epochs": 3, "schedule": "cosine"}


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_fixup_resnet_learns_digits() -> None:
    # Measured: Fixup ResNet-8, 6 epochs, batch 32, lr 0.1 cosine -> 97.7 +- 0.5% test accuracy on the 360
    # held-out digits (seeds 0-4, n=5; seed 0: 97.5%).
    result = fit(TrainConfig(depth=8, epochs=6, batch_size=32, schedule="cosine"), progress=False)
    assert result.outcome.status == "completed"
    assert [h["epoch"] for h in result.history] == list(range(1, 7))
    assert result.final["test_acc"] >= 0.95
    assert result.history[-1]["train_loss"] < result.history[0]["train_loss"]


def test_resume_is_bitwise_exact(tmp_path) -> None:
    # Augmentation, Mixup and Cutout draw randomness every step: resuming must replay it exactly.
    cfg = TrainConfig(**SMALL, crop_padding=1, hflip="on", mixup_alpha=0.4, cutout=3, label_smoothing=0.1)
    straight = fit(cfg, out_dir=tmp_path / "straight", progress=False)
    steps = straight.history[0]["step"]

    stop_at = steps + 5  # in the middle of the second epoch
    first = fit(cfg, out_dir=tmp_path / "resumed", progress=False, on_step=lambda s: s.step == stop_at)
    assert first.outcome.status == "interrupted" and first.outcome.step == stop_at
    assert len(first.history) == 1
    resumed = fit(cfg, out_dir=tmp_path / "resumed", progress=False)
    assert resumed.outcome.status == "completed"
    a, b = _weights(straight.model), _weights(resumed.model)
    assert all(torch.equal(a[k], b[k]) for k in a)
    drop = ("time_s",)
    assert [{k: v for k, v in h.items() if k not in drop} for h in straight.history] == \
           [{k: v for k, v in h.items() if k not in drop} for h in resumed.history]
    # A finished run folder returns its result without training again.
    again = fit(cfg, out_dir=tmp_path / "resumed", progress=False)
    assert again.history == resumed.history


def test_sigint_stops_after_the_step_and_resumes(tmp_path) -> None:
    import os
    import signal

    cfg = TrainConfig(**{**SMALL, "epochs": 1})

    def interrupt(info):
        if info.step == 4:
            os.kill(os.getpid(), signal.SIGINT)

    # Our own handler: a background job inherits SIGINT ignored, and the engine leaves ignored signals alone.
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        first = fit(cfg, out_dir=tmp_path, progress=False, on_step=interrupt)
        assert first.outcome == "interrupted" and first.outcome.step == 4 and "SIGINT" in first.reason
        assert first.stopped_by == "SIGINT" and first.exit_code == 130
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is put back
    finally:
        signal.signal(signal.SIGINT, inherited)
    assert fit(cfg, out_dir=tmp_path, progress=False).outcome == "completed"


def test_too_high_lr_is_a_recorded_divergence(tmp_path) -> None:
    result = fit(TrainConfig(**SMALL, lr=1e4), out_dir=tmp_path, progress=False)
    assert result.outcome.status == "diverged"
    assert "loss is" in result.outcome.reason and ("nan" in result.outcome.reason or "inf" in result.outcome.reason)
    assert result.outcome.step < 3 * 23
    assert result.exit_code == 3
    assert (tmp_path / "result.json").exists()
    again = fit(TrainConfig(**SMALL, lr=1e4), out_dir=tmp_path, progress=False)  # a study re-running the cell
    assert again.outcome == "diverged" and again.outcome.step == result.outcome.step


def test_loss_bound_is_divergence_and_cli_exit_code(tmp_path) -> None:
    # Untrained logits are zero, so the first loss is ln(10) = 2.30 > 1.
    result = fit(TrainConfig(**SMALL, max_loss=1.0), progress=False)
    assert result.outcome.status == "diverged" and result.outcome.step == 0
    assert "exceeds max_loss=1" in result.outcome.reason
    code = cli_main(["train", "--depth", "8", "--epochs", "1", "--max-loss", "1", "--no-progress",
                           "--json", str(tmp_path / "r.json")])
    assert code == 3


def test_param_groups_are_exactly_the_scalars_with_the_stream_biases_budgeted() -> None:
    model = fixup.create_model("resnet_cifar", depth=14)
    cfg = TrainConfig(lr=0.2, scalar_lr_mult=0.1, weight_decay=5e-4, scalar_weight_decay=0.0)
    groups = {g["name"]: g for g in config_groups(model, cfg)}
    scalars = {id(p) for m in model.modules() if isinstance(m, (Bias, Scale)) for p in m.parameters()}
    stream = {id(b.stream_bias.bias) for _, b in find_branches(model)}
    assert {id(p) for p in groups["scalars"]["params"]} == scalars - stream
    assert {id(p) for p in groups["stream_biases"]["params"]} == stream and len(stream) == 6  # one per block
    assert len(scalars) == 2 + 6 * 5  # stem and head biases; 6 blocks of 4 biases and 1 multiplier
    assert all(p.numel() == 1 for p in groups["scalars"]["params"])
    assert {id(p) for p in groups["weights"]["params"]} == {id(p) for p in model.parameters()} - scalars
    assert groups["scalars"]["lr"] == pytest.approx(0.02) and groups["scalars"]["weight_decay"] == 0.0
    assert groups["stream_biases"]["lr"] == pytest.approx(0.02 / 6)  # together, one scalar's rate
    assert groups["weights"]["lr"] == 0.2 and groups["weights"]["weight_decay"] == 5e-4
    paper = fixup.create_model("resnet_cifar", depth=14, init="fixup_paper")
    assert [g["name"] for g in config_groups(paper, cfg)] == ["weights", "scalars"]  # the authors': no budget
    bn = fixup.create_model("resnet_cifar", depth=14, norm="batchnorm")
    assert [g["name"] for g in config_groups(bn, cfg)] == ["weights"]


def test_run_log_lists_groups(tmp_path) -> None:
    import json

    fit(TrainConfig(depth=8, epochs=1, batch_size=128), out_dir=tmp_path, progress=False)
    run = json.loads((tmp_path / "run.json").read_text())
    names = {g["name"]: g for g in run["param_groups"]}
    assert set(names) == {"weights", "scalars", "stream_biases"}
    assert "layer1.0.scale.scale" in names["scalars"]["params"]
    assert names["stream_biases"]["params"] == ["layer1.0.bias2b.bias", "layer2.0.bias2b.bias", "layer3.0.bias2b.bias"]
    assert (tmp_path / "metrics.csv").read_text().splitlines()[0].startswith("epoch,step,lr")
    assert TrainConfig.from_dict(json.loads((tmp_path / "config.json").read_text())).depth == 8
    # The saved config is a starting point for the command line; given options override it.
    args = build_parser().parse_args(["train", "--config", str(tmp_path / "config.json"), "--lr", "0.3"])
    cfg = config_from_args(args)
    assert (cfg.depth, cfg.batch_size, cfg.lr) == (8, 128, 0.3)


def test_schedules() -> None:
    step = TrainConfig(schedule="step", milestones=(0.5, 0.75))
    assert [lr_factor(s, 100, step) for s in (0, 49, 50, 74, 75, 99)] == pytest.approx([1, 1, .1, .1, .01, .01])
    # a milestone never falls before the first step (round(0.5 * 1) is 0): a one-step run is at the peak rate
    assert lr_factor(0, 1, step) == 1.0 and [lr_factor(s, 2, step) for s in (0, 1)] == pytest.approx([1, .1])
    cos = TrainConfig(schedule="cosine", warmup_steps=10)
    assert lr_factor(0, 110, cos) == pytest.approx(0.1) and lr_factor(9, 110, cos) == pytest.approx(1.0)
    assert lr_factor(60, 110, cos) == pytest.approx(0.5) and lr_factor(110, 110, cos) == pytest.approx(0.0)
    inv = TrainConfig(schedule="inverse_sqrt", warmup_steps=4000)
    assert lr_factor(3999, 10**5, inv) == pytest.approx(1.0)
    assert lr_factor(15999, 10**5, inv) == pytest.approx(0.5)  # sqrt(4000 / 16000)
    assert lr_factor(1999, 10**5, inv) == pytest.approx(0.5)  # linear warm-up
    assert TrainConfig(lr=0.1, batch_size=512, lr_reference_batch=128).effective_lr == pytest.approx(0.4)


def test_config_errors() -> None:
    with pytest.raises(ValueError, match="unknown training option"):
        TrainConfig.from_dict({"learning_rate": 0.1})
    with pytest.raises(ValueError, match="optimizer='rmsprop'"):
        TrainConfig(optimizer="rmsprop").validate()
    with pytest.raises(ValueError, match="warmup_steps"):
        TrainConfig(schedule="inverse_sqrt").validate()
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--learning-rate", "0.1"])
    args = build_parser().parse_args(["train", "--betas", "0.9", "0.98", "--nesterov", "--lr", "0.05"])
    cfg = config_from_args(args)
    assert cfg.betas == (0.9, 0.98) and cfg.nesterov and cfg.lr == 0.05 and cfg.epochs == TrainConfig().epochs


def test_bad_checkpoints_are_clear_errors_and_kept(tmp_path) -> None:
    cfg = TrainConfig(depth=8, epochs=1, batch_size=128)
    (tmp_path / CHECKPOINT).write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):
        fit(cfg, out_dir=tmp_path, progress=False)
    assert (tmp_path / CHECKPOINT).read_bytes() == b"not a checkpoint"
    good = tmp_path / "good"
    fit(cfg, out_dir=good, progress=False)
    before = (good / CHECKPOINT).read_bytes()
    with pytest.raises(CheckpointError, match=r"lr: checkpoint 0\.1, now 0\.05"):
        fit(cfg.replace(lr=0.05), out_dir=good, progress=False)
    assert (good / CHECKPOINT).read_bytes() == before


def test_tensorboard_missing_is_a_clear_error(tmp_path, monkeypatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if tensorboard were not installed
    with pytest.raises(ValueError, match="needs the tensorboard package"):
        fit(TrainConfig(**SMALL, tensorboard=True), out_dir=tmp_path, progress=False)


def test_activation_checkpointing_trains_the_same_model() -> None:
    cfg = TrainConfig(**{**SMALL, "depth": 14, "epochs": 1})
    plain = fit(cfg, progress=False)
    segmented = fit(cfg.replace(checkpoint_segments=3), progress=False)
    assert type(segmented.model.layer1).__name__ == "CheckpointedSequential"
    a, b = _weights(plain.model), _weights(segmented.model)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)  # recomputation is exact on CPU


class _Recording:
    """The configured task, with forward hooks that record each weight layer's output dtype in training."""

    def __init__(self, config: TrainConfig) -> None:
        self.inner, self.dtypes = create_task(config), set()

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def build_model(self, config: TrainConfig) -> torch.nn.Module:
        model = self.inner.build_model(config)
        for module in model.modules():
            if isinstance(module, torch.nn.Conv2d | torch.nn.Linear):
                module.register_forward_hook(
                    lambda mod, args, out: self.dtypes.add(out.dtype) if mod.training else None)
        return model


def test_bf16_autocast_trains() -> None:
    cfg = TrainConfig(**SMALL, precision="bf16")
    task, losses = _Recording(cfg), []
    result = fit(cfg, task=task, progress=False, on_step=lambda info: losses.append(info.loss))
    assert result.outcome.status == "completed" and math.isfinite(result.final["train_loss"])
    # The convolutions and the classifier computed in bfloat16, while the weights stayed float32.
    assert task.dtypes == {torch.bfloat16}
    assert {p.dtype for p in result.model.parameters()} == {torch.float32}
    # And it learned: from log 10 (a zero classifier) to well below it over 3 epochs.
    assert len(losses) == result.history[-1]["step"] >= 60
    assert losses[0] == pytest.approx(math.log(10), abs=0.05)
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5
    assert result.final["test_acc"] > 0.5
    # The control: the same hooks see float32 when the run is fp32, so the check above is autocast's doing.
    control = _Recording(cfg)
    fit(TrainConfig(**{**SMALL, "max_updates": 1}), task=control, progress=False)
    assert control.dtypes == {torch.float32}


def test_rerunning_a_finished_run_says_so_and_force_trains_again(tmp_path, capsys) -> None:
    args = ["train", "--depth", "8", "--batch-size", "256", "--epochs", "1", "--no-progress",
            "--out-dir", str(tmp_path)]
    assert cli_main(args) == 0
    assert "completed after 1 epoch(s)" in capsys.readouterr().out
    assert cli_main(args) == 0
    again = capsys.readouterr()
    assert "completed after" not in again.out  # the old result is not reprinted as if it had trained
    assert "already ended (completed after 6 steps" in again.err and "Add --force" in again.err
    assert cli_main([*args, "--force"]) == 0
    assert "completed after 1 epoch(s), 6 steps" in capsys.readouterr().out


def test_the_default_clips_the_gradient_norm_before_the_step() -> None:
    assert TrainConfig().grad_clip == 1.0
    # one plain SGD step (no momentum, no decay, every group at lr 1 but the budgeted stream biases): the weights
    # move by exactly the clipped gradient
    base = dict(depth=8, batch_size=64, max_updates=1, momentum=0.0, weight_decay=0.0, scalar_lr_mult=1.0,
                schedule="constant", checkpoint=False)
    start = _weights(fit(TrainConfig(**base, lr=0.0), progress=False).model)

    def moved(clip: float) -> float:
        model = fit(TrainConfig(**base, lr=1.0, grad_clip=clip), progress=False).model
        return torch.cat([(v - start[k]).flatten() for k, v in _weights(model).items()]).norm().item()

    # at initialisation only the classifier has a gradient, of norm about 0.34 here
    assert moved(0.0) > 0.1  # larger than the bound below: clipping has work to do
    assert 0.5 * 0.01 < moved(0.01) <= 0.01 * (1 + 1e-4)


def test_studies_and_translation_recipes_train_without_clipping() -> None:
    from fixup.studies import depth
    from fixup.studies.grid import make_grid
    from fixup.studies.store import Store
    from fixup.translation.task import translation_config

    tasks = depth.plan(make_grid("quick"), Store("/nonexistent")).tasks
    assert tasks and all(t.cell.config["train"]["grad_clip"] == 0.0 for t in tasks)  # the paper's protocol
    assert translation_config("tiny").grad_clip == 0.0 and translation_config("iwslt").grad_clip == 0.0
