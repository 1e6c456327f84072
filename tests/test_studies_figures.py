"""Figures show what happened (error bars, n, failed cells marked; the data behind each PNG written beside it),
and a long cell resumes from its last segment, not from step 0."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from fixup.studies import Cell, _common, ablation, depth, make_grid, regularisation

pytest.importorskip("matplotlib")


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


def _data(png: Path) -> dict:
    return json.loads(png.with_name(png.stem + ".data.json").read_text())


def test_depth_figure_marks_failed_cells_with_k_of_n(tmp_path):
    grid = make_grid("quick")
    recs = [{"study": "depth", "method": m, "setting": {"depth": d}, "seed": s, "config": {},
             "result": {"outcome": out, "diverged": out == "diverged", "test_acc": acc if out == "completed" else None}}
            for d in (10, 1000) for s in (0, 1) for m, acc, out in (
                ("fixup", 0.5 + 0.1 * s, "completed"), ("he", 0.7, "completed" if d == 10 else "diverged"),
                ("lsuv", 0.3, "collapsed" if (d, s) == (1000, 1) else "completed"))]
    (png,) = depth.figures(depth.summarise(recs, grid), tmp_path)
    w, h = png_size(png)
    assert (w, h) == (1200, 552)  # 10.0 x 4.6 inches at 120 dpi: the axes and the legend beside them
    series = _data(png)["series"]
    fixup10 = next(p for p in series["fixup"] if p["depth"] == 10)
    assert fixup10["mean"] == pytest.approx(55.0) and fixup10["std"] == pytest.approx(7.07, abs=0.01)
    assert fixup10["n"] == 2
    he1000 = next(p for p in series["he"] if p["depth"] == 1000)
    assert he1000["mean"] is None and he1000["failed"] == {"diverged": 2}
    lsuv1000 = next(p for p in series["lsuv"] if p["depth"] == 1000)
    assert lsuv1000["n"] == 1 and lsuv1000["failed"] == {"collapsed": 1}  # not dropped silently


def test_bar_and_curve_figures_carry_error_bars_n_and_failures(tmp_path):
    grid = make_grid("quick")

    def reg(method, seed, acc, outcome="completed"):
        return {"study": "regularisation", "method": method, "setting": {"reg": "none"}, "seed": seed,
                "config": {"train": {"lr": 0.1}},
                "result": {"outcome": outcome, "test_acc": acc, "train_acc": acc, "train_loss": 0.2}}

    recs = [reg("fixup", 0, 0.96), reg("fixup", 1, None, "diverged"), reg("batchnorm", 0, 0.97),
            reg("batchnorm", 1, 0.95)]
    (png,) = regularisation.figures(regularisation.summarise(recs, grid), tmp_path)
    assert png_size(png) == (864, 552)
    bars = {b["group"]: b for b in _data(png)["bars"]}
    assert bars["Fixup"]["failed"] == {"diverged": 1} and bars["Fixup"]["n"] == 1 and bars["Fixup"]["planned"] == 2
    assert bars["BatchNorm"]["mean"] == pytest.approx(4.0) and bars["BatchNorm"]["std"] == pytest.approx(1.414, 1e-3)

    def abl(method, seed, accs):
        return {"study": "ablation", "method": method, "setting": {"depth": 32}, "seed": seed, "config": {},
                "result": {"outcome": "completed", "test_acc": accs[-1], "train_loss": 0.5,
                           "history": [{"train_loss": 1.0 / (e + 1), "test_acc": a} for e, a in enumerate(accs)]}}

    epochs = grid.ablation.epochs
    recs = [abl("fixup", s, [0.5 + 0.1 * s] + [0.7] * (epochs - 2) + [0.8 + 0.02 * s]) for s in (0, 1)]
    loss_png, acc_png = ablation.figures(ablation.summarise(recs, grid), tmp_path)
    assert png_size(acc_png) == png_size(loss_png) == (816, 528)
    curve = _data(acc_png)["series"]["fixup"]
    assert [p["n"] for p in curve] == [2] * epochs and curve[0]["std"] == pytest.approx(7.07, abs=0.01)
    assert curve[-1]["mean"] == pytest.approx(81.0)


def test_a_long_cell_resumes_from_its_last_segment(tmp_path, monkeypatch):
    """Kill a depth cell after its second segment: the rerun starts from that segment's checkpoint and ends
    with exactly the result of an uninterrupted run."""
    import torch

    from fixup.train import fit as real_fit

    train = {"task": "images", "dataset": "digits", "model": "wide_resnet", "depth": 10, "width": 1,
             "norm": "fixup", "seed": 0, "lr": 0.1, "batch_size": 256, "epochs": 1, "schedule": "constant",
             "device": "cpu", "checkpoint": True}
    cell = Cell("depth", "fixup", {"depth": 10}, 0, config={"train": train})
    torch.set_num_threads(1)
    whole = _common.train_cell(cell, tmp_path / "whole")

    monkeypatch.setattr(_common, "SEGMENT_SECONDS", 0.0)  # a segment per step
    monkeypatch.setattr(_common, "SEGMENT_OVERHEAD", 0.0)
    calls = []

    def dying_fit(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise SystemExit("killed")  # the process dies during its third segment
        return real_fit(*args, **kwargs)

    monkeypatch.setattr("fixup.train.fit", dying_fit)
    with pytest.raises(SystemExit):
        _common.train_cell(cell, tmp_path / "cut")
    state = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)
    assert state["position"]["step"] == 2, "the checkpoint of the last segment is on disk"
    monkeypatch.setattr(_common, "SEGMENT_SECONDS", 1e9)
    steps_run = []

    def counting_fit(config, **kwargs):
        hook = kwargs.pop("on_step")
        return real_fit(config, on_step=lambda info: steps_run.append(info.step) or hook(info), **kwargs)

    monkeypatch.setattr("fixup.train.fit", counting_fit)
    resumed = _common.train_cell(cell, tmp_path / "cut")
    assert steps_run[0] == 3, "the rerun continued after step 2, not from step 0"
    assert resumed["test_acc"] == whole["test_acc"] and resumed["train_loss"] == whole["train_loss"]


def test_segments_last_long_enough_that_checkpoints_cost_little(tmp_path, monkeypatch):
    """A segment lasts SEGMENT_OVERHEAD times the last checkpoint's write and reload: with a huge factor the
    cell checkpoints once, after its first step, and trains the rest in one segment."""
    import torch

    from fixup.train import fit as real_fit

    train = {"task": "images", "dataset": "digits", "model": "resnet_cifar", "depth": 8, "norm": "fixup", "seed": 0,
             "lr": 0.1, "batch_size": 512, "epochs": 1, "device": "cpu", "checkpoint": True}
    monkeypatch.setattr(_common, "SEGMENT_SECONDS", 0.0)
    monkeypatch.setattr(_common, "SEGMENT_OVERHEAD", 1e9)
    calls = []
    monkeypatch.setattr("fixup.train.fit", lambda *a, **k: calls.append(1) or real_fit(*a, **k))
    torch.set_num_threads(1)
    result = _common.train_cell(Cell("depth", "fixup", {"depth": 8}, 0, config={"train": train}), tmp_path)
    assert result["outcome"] == "completed" and len(calls) == 2
    steps = result["history"][-1]["step"]
    assert result["step_loss"]["first_step"] == 1 and len(result["step_loss"]["loss"]) == steps  # every step
