"""Fine-tuning a converted model (issue 37, items 2 and 3): the engine starts from the converted function, and the
transfer benchmark runs.

The engine fine-tunes a model saved by ``fixup.save_converted`` through ``extra["converted"]``
(src/fixup/train/image_task.py); benchmarks/transfer.py compares it with the normalised routes.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fixup
from fixup.train import TrainConfig, fit
from fixup.train.image_task import ImageClassification
from fixup.train.task import Shard

ROOT = Path(__file__).resolve().parent.parent

try:
    import opacus  # noqa: F401

    HAVE_OPACUS = True
except ImportError:
    HAVE_OPACUS = False
needs_opacus = pytest.mark.skipif(not HAVE_OPACUS, reason="opacus is not installed (pip install 'fixup-lab[dp]')")

DIGITS = {"depth": 8, "batch_size": 32, "lr": 0.01, "epochs": 1, "checkpoint": False, "device": "cpu"}


def _trained_like(seed: int = 0) -> nn.Module:
    """A BatchNorm ResNet-8 for digits with statistics, affines and a classifier as training would leave them."""
    torch.manual_seed(seed)
    model = fixup.create_model("resnet_cifar", depth=8, norm="batchnorm", num_classes=10, in_channels=1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.3)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.3)
        model.fc.weight.normal_(0, 0.3)
    return model.eval()


def _saved(tmp_path: Path, model: nn.Module) -> str:
    converted, report = fixup.convert(model, torch.randn(2, 1, 8, 8))
    path = str(tmp_path / "converted.pt")
    fixup.save_converted(path, converted, report)
    return path


@pytest.mark.parametrize("via", ["model", "adapt"])
def test_the_first_fine_tuning_step_starts_from_the_converted_function(via, tmp_path, one_thread) -> None:
    """Step 0's training loss is the normalised model's eval-mode loss on the same batch: nothing re-initialised."""
    original = _trained_like()
    extra = {"extra": {"converted": _saved(tmp_path, original)}, "max_updates": 1, "norm": "none"}
    if via == "adapt":  # the original architecture from a factory instead of the registered model
        (tmp_path / "arch.py").write_text(
            "import fixup\n\ndef build(num_classes=10, in_channels=1):\n    return fixup.create_model("
            "'resnet_cifar', depth=8, norm='batchnorm', num_classes=num_classes, in_channels=in_channels)\n")
        extra["adapt"] = f"{tmp_path / 'arch.py'}:build"
    config = TrainConfig(**DIGITS, **extra)
    losses: list[float] = []
    result = fit(config, progress=False, on_step=lambda info: losses.append(info.loss))
    assert result.outcome == "completed"
    x, y, _ = next(ImageClassification(config).train_batches(0, Shard()))
    with torch.no_grad():
        expected = F.cross_entropy(original(x), y).item()
    assert losses[0] == pytest.approx(expected, rel=1e-5)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in result.model.modules())


@needs_opacus
def test_a_saved_converted_model_fine_tunes_privately(tmp_path, one_thread) -> None:
    """convert takes an eval-mode model and its copy stays in eval mode; the engine trains it under --dp all the
    same (Opacus refuses a model in eval mode)."""
    config = TrainConfig(**DIGITS, extra={"converted": _saved(tmp_path, _trained_like())}, max_updates=2, dp=True,
                         target_epsilon=8.0)
    result = fit(config, progress=False)
    assert result.outcome == "completed"
    assert 0 < result.privacy["epsilon"] <= 8.0 + 1e-6


def test_converted_refuses_a_norm_and_a_missing_file(tmp_path) -> None:
    path = _saved(tmp_path, _trained_like())
    config = TrainConfig(**DIGITS, norm="batchnorm", extra={"converted": path})
    with pytest.raises(ValueError, match="as saved, without normalisation"):
        ImageClassification(config).build_model(config)
    config = TrainConfig(**DIGITS, extra={"converted": str(tmp_path / "missing.pt")})
    with pytest.raises(ValueError, match="no file"):
        ImageClassification(config).build_model(config)
    config = TrainConfig(**{**DIGITS, "depth": 14}, extra={"converted": path})  # another architecture
    with pytest.raises(ValueError, match="does not fit"):
        ImageClassification(config).build_model(config)


def _benchmark():
    spec = importlib.util.spec_from_file_location("transfer_benchmark", ROOT / "benchmarks" / "transfer.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@needs_opacus
def test_the_routes_start_from_the_trained_function_where_they_keep_it(one_thread) -> None:
    """converted and bn_frozen compute the pre-trained model's eval function; groupnorm does not (Opacus's route)."""
    bench = _benchmark()
    torch.manual_seed(0)
    model = _trained_like()
    model.fc = nn.Linear(model.fc.in_features, 5)
    x = torch.randn(16, 1, 8, 8)
    with torch.no_grad():
        ref = model.eval()(x)
        for route, same in (("converted", True), ("bn_frozen", True), ("groupnorm", False)):
            out = bench.route_model(route, model, 8, 0)
            assert out.training  # handed to the engine in train mode
            change = ((out(x) - ref).norm() / ref.norm()).item()  # frozen: train mode computes the eval function
            assert (change < 1e-5) == same, (route, change)


@pytest.mark.slow  # 26 s on 2 cores; the resume test below runs the benchmark's main path in the default run
@needs_opacus
def test_the_transfer_benchmark_smoke_mode_runs(tmp_path, one_thread) -> None:
    bench = _benchmark()
    out = bench.main(["--smoke", "--seeds", "0", "--json", str(tmp_path / "t.json")])
    saved = json.loads((tmp_path / "t.json").read_text())
    assert saved["command"].startswith("PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/transfer.py --smoke")
    cells = {(r["route"], r["setting"]): r for r in out["rows"]}
    assert len(cells) == 15
    assert "per-example gradients are undefined" in cells["bn_train", "dp"]["refused"]
    assert all("test" in r for k, r in cells.items() if k != ("bn_train", "dp"))
    assert "| converted |" in saved["table"]
    pooled = bench.pooled(saved, saved).splitlines()  # a run pooled with itself: each seed once, the lead paired
    assert len(pooled) == 2 + 3 * 4 - 1  # header, separator, 4 routes a setting, no BatchNorm in train mode under dp



@needs_opacus
def test_the_transfer_benchmark_resumes_from_its_run_store(tmp_path, one_thread, monkeypatch) -> None:
    """Each run is appended to the store as it ends; a rerun (or a process given other routes) reads the stored
    runs instead of training them, and a line cut short by a kill is skipped."""
    bench = _benchmark()
    argv = ["--smoke", "--seeds", "0", "--settings", "b32", "--no-variants", "--json", str(tmp_path / "t.json")]
    first = bench.main([*argv, "--routes", "converted"])
    store = tmp_path / "t.json.runs.jsonl"
    assert len(store.read_text().splitlines()) == 1
    with store.open("a") as f:
        f.write('{"arch": "resnet20", "route": "gro')  # a writer killed mid-line
    trained = []
    finetune = bench.finetune
    monkeypatch.setattr(bench, "finetune", lambda route, *a, **k: trained.append(route) or finetune(route, *a, **k))
    monkeypatch.setattr(bench, "_pretrained", lambda *a: pytest.fail("pre-trained again instead of loaded"))
    second = bench.main([*argv, "--routes", "converted", "groupnorm"])
    assert trained == ["groupnorm"]  # the converted run came from the store, not from training
    assert second["runs"][0] == first["runs"][0]
    # the pre-trained model came from the shared cache: the same weights, so the same source accuracy
    assert [f.name for f in (tmp_path / "t.json.runs.jsonl.pretrained").glob("*.pt")] == [
        "resnet20-depth8-steps4-seed0.pt"]
    assert second["runs"][1]["source_test_acc"] == first["runs"][0]["source_test_acc"]
    assert len(store.read_text().splitlines()) == 3  # the cut line stays; the new run follows it
    assert bench.main([*argv, "--routes", "converted", "groupnorm"])["runs"] == second["runs"] and trained == [
        "groupnorm"]
    # a run stopped by a signal is no result: the command ends, saying how to resume, and stores nothing
    monkeypatch.setattr(bench, "finetune",
                        lambda route, *a, **k: {**finetune(route, *a, **k), "outcome": "interrupted"})
    with pytest.raises(SystemExit, match="rerun the command to resume"):
        bench.main([*argv, "--routes", "bn_frozen"])
    assert len(store.read_text().splitlines()) == 3

def test_fine_tuning_a_converted_model_takes_the_measured_recipe_where_the_command_leaves_it() -> None:
    """`fixup train --extra '{"converted": ...}'` without other options fine-tunes by the recipe benchmarks/transfer.py
    measured (no weight decay, cosine, no warm-up, global norm at 1, rate 0.1; 0.03 at tiny batches and under dp);
    every option given explicitly wins, and a run without a converted model keeps the engine's defaults."""
    import argparse

    from fixup.train.cli import config_from_args

    def config(**given):
        return config_from_args(argparse.Namespace(**given))

    converted = {"extra": {"converted": "model.pt"}}
    c = config(**converted)
    assert (c.lr, c.weight_decay, c.schedule, c.warmup_steps) == (0.1, 0.0, "cosine", 0)
    assert (c.clip, c.grad_clip) == ("norm", 1.0)
    assert config(**converted, batch_size=2).lr == 0.03
    private = config(**converted, dp=True, target_epsilon=8.0)
    assert private.lr == 0.03 and private.clip == "auto"  # the per-example clipping replaces the global one
    mine = config(**converted, lr=0.3, schedule="step", weight_decay=1e-4)
    assert (mine.lr, mine.schedule, mine.weight_decay) == (0.3, "step", 1e-4)
    plain = config()
    assert (plain.weight_decay, plain.schedule) == (5e-4, "step")


@needs_opacus
def test_timm_resnet18_routes_keep_its_function_and_add_out_of_place(one_thread) -> None:
    """--arch timm-resnet18: converted and bn_frozen compute the trained model's eval function at 32x32x3, and every
    route that keeps timm's blocks adds the shortcut out of place (Opacus's hooks need it)."""
    from test_adapt_zoo import _needs

    _needs("timm")
    bench = _benchmark()
    model = bench.fresh_model("timm-resnet18", 20, 0)
    with torch.no_grad():  # statistics as training would leave them, not the fresh 0/1
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 2.0)
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        ref = model.eval()(x)
        for route, same in (("converted", True), ("bn_frozen", True), ("groupnorm", False)):
            out = bench.route_model(route, model, 20, 0, "timm-resnet18")
            change = ((out(x) - ref).norm() / ref.norm()).item()
            assert (change < 1e-5) == same, (route, change)
            blocks = [m for m in out.modules() if type(m).__name__.endswith("BasicBlock")]
            assert all(type(b).__name__ == "OutOfPlaceBasicBlock" for b in blocks if route != "converted"), route
            assert not any(getattr(m, "inplace", False) for m in out.modules()) or route == "converted", route
