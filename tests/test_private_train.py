"""Private training in the engine (``fixup train --dp``): options, refusals, Poisson sampling, accounting, resume."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from fixup.cli import build_parser
from fixup.cli import main as cli_main
from fixup.train import TrainConfig, fit
from fixup.train.checkpoint import load_checkpoint
from fixup.train.cli import config_from_args
from fixup.train.engine import CHECKPOINT
from fixup.train.image_task import ImageClassification
from fixup.train.task import poisson_batches, seeded_generator

try:
    import opacus  # noqa: F401

    HAVE_OPACUS = True
except ImportError:
    HAVE_OPACUS = False
needs_opacus = pytest.mark.skipif(not HAVE_OPACUS, reason="opacus is not installed (pip install 'fixup-lab[dp]')")

# A SkipInit Wide-ResNet-10-1: small, and its forward has no in-place operation on a module's output.
TINY = {"model": "wide_resnet", "depth": 10, "width": 1, "init": "skipinit", "momentum": 0.0, "weight_decay": 0.0,
        "lr": 0.5, "device": "cpu"}


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_the_dp_options_exist_and_parse() -> None:
    args = build_parser().parse_args(["train", "--dp", "--target-epsilon", "8", "--delta", "1e-6",
                                      "--max-grad-norm", "1.5", "--accountant", "prv", "--init", "skipinit",
                                      "--dp-physical-batch", "32"])
    cfg = config_from_args(args)
    assert (cfg.dp, cfg.target_epsilon, cfg.delta, cfg.max_grad_norm, cfg.accountant) == (True, 8.0, 1e-6, 1.5, "prv")
    assert cfg.dp_physical_batch == 32
    assert cfg.to_dict()["privacy"]["target_epsilon"] == 8.0
    cfg = config_from_args(build_parser().parse_args(["train", "--dp", "--noise-multiplier", "1.1"]))
    assert cfg.noise_multiplier == 1.1 and cfg.target_epsilon == 0.0


@pytest.mark.parametrize(("options", "message"), [
    ({"dp": True, "target_epsilon": 8.0, "norm": "batchnorm"}, "BatchNorm mixes the examples of a batch"),
    ({"dp": True, "target_epsilon": 8.0, "norm": "batchnorm"}, "--init skipinit"),
    ({"dp": True}, "exactly one of target_epsilon"),
    ({"dp": True, "target_epsilon": 8.0, "noise_multiplier": 1.0}, "exactly one of target_epsilon"),
    ({"target_epsilon": 8.0}, "add --dp"),
    ({"dp": True, "target_epsilon": 8.0, "delta": 1.0}, "delta must lie strictly between 0 and 1"),
    ({"dp": True, "target_epsilon": 8.0, "max_grad_norm": 0.0}, "max_grad_norm must be > 0"),
    ({"dp": True, "target_epsilon": 8.0, "dp_physical_batch": -1},
     r"dp_physical_batch must be >= 0 .*--dp-physical-batch 32.*got -1"),
    ({"dp_physical_batch": 32}, "add --dp"),
    ({"dp": True, "target_epsilon": 8.0, "mixup_alpha": 0.2}, "mixes the examples of a batch"),
    ({"dp": True, "target_epsilon": 8.0, "clip": "agc"}, "replaces the engine's clipping"),
    ({"dp": True, "target_epsilon": 8.0, "init": "lsuv"}, "privacy accounting does not cover"),
    ({"dp": True, "target_epsilon": 8.0, "precision": "fp16"}, "use --precision fp32"),
    ({"dp": True, "target_epsilon": 8.0, "accountant": "gdp"}, "choose one of rdp, prv"),
])
def test_refused_options_say_why_and_what_to_do(options, message) -> None:
    with pytest.raises(ValueError, match=message):
        TrainConfig(**options).validate()


def test_dp_without_opacus_names_the_extra(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setitem(sys.modules, "opacus", None)  # as if opacus were not installed
    with pytest.raises(ValueError, match=r"pip install 'fixup-lab\[dp\]'"):
        fit(TrainConfig(**TINY, dp=True, target_epsilon=8.0, max_updates=1), progress=False)
    code = cli_main(["train", "--dp", "--target-epsilon", "8", "--init", "skipinit", "--model", "wide_resnet",
                     "--depth", "10", "--width", "1", "--no-progress"])
    assert code == 2 and "fixup-lab[dp]" in capsys.readouterr().err


def test_poisson_batches_sample_each_example_independently() -> None:
    batches = poisson_batches(1000, 50, seeded_generator(0, 1))
    assert len(batches) == 50
    sizes = torch.tensor([len(b) for b in batches], dtype=torch.float)
    assert 15 < sizes.mean() < 25  # 1000 / 50 = 20 expected
    assert len({len(b) for b in batches}) > 1  # sizes vary, unlike a fixed-size sampler
    assert all(b == sorted(set(b)) for b in batches)  # no example twice in a batch
    assert batches == poisson_batches(1000, 50, seeded_generator(0, 1))  # resumable: a pure function of the seed
    assert any(not b for b in poisson_batches(100, 100, seeded_generator(0, 2)))  # rate 1/100: empty batches occur


@needs_opacus
def test_private_run_records_epsilon_everywhere(tmp_path, capsys, one_thread) -> None:
    out = tmp_path / "run"
    code = cli_main(["train", "--model", "wide_resnet", "--depth", "10", "--width", "1", "--init", "skipinit",
                     "--batch-size", "512", "--epochs", "2", "--lr", "0.5", "--momentum", "0", "--weight-decay", "0",
                     "--gate-lr-mult", "0.5", "--dp", "--target-epsilon", "8", "--device", "cpu", "--no-progress",
                     "--out-dir", str(out), "--json", str(tmp_path / "r.json")])
    assert code == 0
    printed = capsys.readouterr().out
    assert "privacy: epsilon 7.9" in printed and "per-example clipping at 1" in printed
    result, run = json.loads((out / "result.json").read_text()), json.loads((out / "run.json").read_text())
    privacy = result["privacy"]
    # The noise was solved for the run's 6 steps (2 epochs of ceil(1437 / 512) = 3), so the budget is spent by the end.
    assert privacy["steps"] == 6 and run["privacy"]["total_steps"] == 6
    assert 7.9 < privacy["epsilon"] <= 8.0 and privacy["noise_multiplier"] == run["privacy"]["noise_multiplier"]
    assert privacy["sample_rate"] == pytest.approx(1 / 3) and privacy["expected_batch_size"] == 1437 // 3
    epsilons = [h["epsilon"] for h in result["history"]]
    assert 0 < epsilons[0] < epsilons[1] == privacy["epsilon"]
    assert json.loads((tmp_path / "r.json").read_text())["privacy"]["epsilon"] == privacy["epsilon"]
    assert result["recipe"]["clip"] == "none" and result["recipe"]["clip_from"] == "dp"
    assert "each example's gradient is clipped to max_grad_norm 1" in result["recipe"]["notes"][0]
    rates = {g["name"]: g["lr"] for g in result["param_groups"]}
    assert rates["gates"] == 0.5 * rates["weights"]  # fixup's groups survive Opacus's optimiser wrapper


@needs_opacus
def test_the_progress_line_shows_the_epsilon_spent(capsys, one_thread) -> None:
    fit(TrainConfig(**TINY, batch_size=512, epochs=1, dp=True, noise_multiplier=1.0), progress=True)
    assert "epsilon=" in capsys.readouterr().err


@needs_opacus
@pytest.mark.parametrize("method", [{"norm": "fixup"}, {"init": "rezero"}, {"norm": "groupnorm"}])
def test_our_resnets_train_privately(method, one_thread) -> None:
    # The engine's default model, Fixup's ResNet-8, and its ReZero and GroupNorm forms: fixup.private makes them ready.
    result = fit(TrainConfig(depth=8, **method, dp=True, noise_multiplier=1.0, batch_size=64, max_updates=2,
                             device="cpu"), progress=False)
    assert result.outcome.status == "completed" and result.privacy["steps"] == 2
    assert result.privacy["prepared"]["ready"] and result.privacy["epsilon"] > 0


@needs_opacus
def test_per_example_clipping_bounds_the_step(one_thread) -> None:
    # Plain SGD at lr 1 with almost no noise: one step moves the weights by the mean of clipped per-example gradients,
    # so by at most max_grad_norm * (examples drawn / expected batch). Without dp the same step is far larger.
    cfg = TrainConfig(**{**TINY, "lr": 1.0}, batch_size=64, max_updates=1, epochs=1)
    start = _weights(fit(cfg.replace(max_updates=1, lr=0.0), progress=False).model)
    private = fit(cfg.replace(dp=True, noise_multiplier=1e-6, max_grad_norm=1e-3), progress=False)
    plain = fit(cfg.replace(clip="none"), progress=False)

    def moved(model: torch.nn.Module) -> float:
        now = _weights(model)
        return float(torch.sqrt(sum(((now[k] - start[k]).float() ** 2).sum() for k in start)))

    steps = -(-1437 // 64)
    drawn = len(poisson_batches(1437, steps, seeded_generator(0, 0, 0, 0x706F6973))[0])
    assert moved(private.model) <= 1e-3 * drawn / (1437 // steps) * 1.01
    assert moved(plain.model) > 100 * moved(private.model)


@needs_opacus
def test_empty_poisson_batches_take_a_noisy_step(one_thread) -> None:
    # Batch size 1 over 1,437 digits: each batch is empty with probability (1 - 1/1437)^1437 = 0.37.
    cfg = TrainConfig(**TINY, batch_size=1, max_updates=6, epochs=1, dp=True, noise_multiplier=1.0)
    drawn = poisson_batches(1437, 1437, seeded_generator(0, 0, 0, 0x706F6973))[:6]
    assert any(not b for b in drawn) and any(b for b in drawn)  # the case under test occurs with this seed
    result = fit(cfg, progress=False)
    assert result.outcome.status == "completed" and result.privacy["steps"] == 6


@needs_opacus
def test_resumed_private_run_spends_the_same_epsilon_and_trains_the_same_weights(tmp_path, one_thread) -> None:
    cfg = TrainConfig(**TINY, batch_size=512, epochs=2, dp=True, noise_multiplier=0.8, label_smoothing=0.1)
    straight = fit(cfg, out_dir=tmp_path / "straight", progress=False)
    first = fit(cfg, out_dir=tmp_path / "resumed", progress=False, on_step=lambda s: s.step == 4)  # mid-epoch 2
    assert first.outcome.status == "interrupted" and first.outcome.step == 4
    assert load_checkpoint(tmp_path / "resumed" / CHECKPOINT)["privacy"]["accountant"]["history"][0][2] == 4
    resumed = fit(cfg, out_dir=tmp_path / "resumed", progress=False)
    assert resumed.outcome.status == "completed"
    assert resumed.privacy == straight.privacy  # the same epsilon after the same 6 steps, the same noise multiplier
    histories = [load_checkpoint(tmp_path / d / CHECKPOINT)["privacy"]["accountant"]["history"]
                 for d in ("straight", "resumed")]
    assert histories[0] == histories[1] and histories[0][0][2] == 6
    a, b = _weights(straight.model), _weights(resumed.model)
    assert all(torch.equal(a[k], b[k]) for k in a)  # the noise generator resumed where it stopped
    drop = ("time_s",)
    assert [{k: v for k, v in h.items() if k not in drop} for h in straight.history] == \
           [{k: v for k, v in h.items() if k not in drop} for h in resumed.history]


def _chunk_sizes(cfg: TrainConfig) -> tuple[ImageClassification, list[int]]:
    """The task of ``cfg``, recording the number of examples of every batch its loss is computed on."""
    task, sizes = ImageClassification(cfg), []
    plain = task.loss
    task.loss = lambda model, batch: (sizes.append(len(batch[1])), plain(model, batch))[1]
    return task, sizes


@needs_opacus
def test_physical_batches_take_the_same_step_and_spend_the_same_epsilon(one_thread) -> None:
    # Poisson batches of about 479 examples (1437 / 3) in chunks of at most 100: per-example clipping makes each
    # example's contribution independent of its chunk, and the noise is drawn once per logical step, so the weights
    # equal those of whole batches up to float rounding of the sum. Had a chunk stepped, or drawn its own noise, or
    # been divided by its own size, they would differ by the size of a step.
    cfg = TrainConfig(**{**TINY, "momentum": 0.9}, batch_size=512, epochs=1, dp=True, noise_multiplier=0.8)
    start = _weights(fit(cfg.replace(max_updates=1, lr=0.0), progress=False).model)
    whole_task, whole_sizes = _chunk_sizes(cfg)
    whole = fit(cfg, progress=False, task=whole_task)
    chunked_cfg = cfg.replace(dp_physical_batch=100)
    task, sizes = _chunk_sizes(chunked_cfg)
    chunked = fit(chunked_cfg, progress=False, task=task)
    assert len(whole_sizes) == 3 and min(whole_sizes) > 400  # three whole Poisson batches ...
    assert max(sizes) <= 100 and len(sizes) >= 15 and sum(sizes) == sum(whole_sizes)  # ... cut into chunks of <= 100
    a, b, s = _weights(whole.model), _weights(chunked.model), start
    assert max(float((a[k] - s[k]).abs().max()) for k in a) > 1e-2  # the steps moved the weights
    assert all(torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-6) for k in a)
    assert chunked.privacy["steps"] == whole.privacy["steps"] == 3
    assert chunked.privacy["epsilon"] == whole.privacy["epsilon"] > 0
    assert chunked.privacy["physical_batch"] == 100 and whole.privacy["physical_batch"] is None
    assert abs(chunked.final["train_loss"] - whole.final["train_loss"]) < 1e-5  # the mean over every chunk


@needs_opacus
def test_a_chunked_private_run_resumes_exactly_and_may_change_its_physical_batch(tmp_path, one_thread) -> None:
    cfg = TrainConfig(**TINY, batch_size=512, epochs=2, dp=True, noise_multiplier=0.8, dp_physical_batch=128)
    straight = fit(cfg, out_dir=tmp_path / "straight", progress=False)
    for name, resumed_with in (("same", 128), ("whole", 0)):
        first = fit(cfg, out_dir=tmp_path / name, progress=False, on_step=lambda s: s.step == 4)  # mid-epoch 2
        assert first.outcome.status == "interrupted" and first.outcome.step == 4
        resumed = fit(cfg.replace(dp_physical_batch=resumed_with), out_dir=tmp_path / name, progress=False)
        assert resumed.outcome.status == "completed" and resumed.privacy["steps"] == 6
        assert resumed.privacy["epsilon"] == straight.privacy["epsilon"]
        a, b = _weights(straight.model), _weights(resumed.model)
        if resumed_with == 128:  # the same run, continued: bit-exact
            assert all(torch.equal(a[k], b[k]) for k in a)
            assert resumed.privacy == straight.privacy
        else:  # whole batches after the interruption: the same steps up to float rounding
            assert all(torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-6) for k in a)


_FOREIGN = """import torch.nn as nn


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        out = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
        out += x  # in place on a hooked module's output: fixup.private must mend it
        return self.relu(out)


def make(num_classes, in_channels):
    return nn.Sequential(nn.Conv2d(in_channels, 4, 3, padding=1), nn.ReLU(), Block(4), Block(4),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, num_classes))
"""


@needs_opacus
def test_an_adapted_model_trains_privately_and_is_adapted_on_noise(tmp_path, monkeypatch, one_thread) -> None:
    import fixup.external
    from fixup.data import load_images

    (tmp_path / "resblocks.py").write_text(_FOREIGN)
    seen = []
    real = fixup.external.adapt
    monkeypatch.setattr(fixup.external, "adapt", lambda model, example, **kw: (seen.append(example),
                                                                                real(model, example, **kw))[1])
    result = fit(TrainConfig(adapt=f"{tmp_path / 'resblocks.py'}:make", dp=True, noise_multiplier=1.0,
                             batch_size=128, max_updates=2, device="cpu"), progress=False)
    assert result.outcome.status == "completed" and result.privacy["steps"] == 2
    assert result.privacy["prepared"]["ready"] and result.privacy["prepared"]["fresh"]  # the in-place add, mended
    first_two, _ = load_images("digits").train.batch(torch.tensor([0, 1]))
    assert len(seen) == 1 and seen[0].shape == first_two.shape
    assert not torch.equal(seen[0], first_two.float())  # not the training images: noise of their shape
    assert abs(float(seen[0].mean())) < 0.5 and 0.5 < float(seen[0].std()) < 1.5


@needs_opacus
def test_a_foreign_batchnorm_model_is_refused_with_the_reason(tmp_path, one_thread) -> None:
    module = tmp_path / "bnmodel.py"
    module.write_text("import torch.nn as nn\n"
                      "def make(num_classes, in_channels):\n"
                      "    return nn.Sequential(nn.Conv2d(in_channels, 4, 3), nn.BatchNorm2d(4), nn.ReLU(),\n"
                      "                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, num_classes))\n")
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(ValueError, match="BatchNorm mixes the examples"):
            fit(TrainConfig(adapt="bnmodel:make", norm="none", dp=True, target_epsilon=8.0, max_updates=1,
                            device="cpu"), progress=False)
    finally:
        sys.path.remove(str(tmp_path))
