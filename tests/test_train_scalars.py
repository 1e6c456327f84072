"""The method's scalars over training: what the engine records equals the model's own scalars, epoch 0 is the
initialisation, the record survives resume, and the lab reads and plots it."""

from __future__ import annotations

import json
import math

import torch

from fixup.branch import find_branches
from fixup.cli import main as cli_main
from fixup.groups import stream_biases
from fixup.nn import Bias, Gate, Scale
from fixup.train import TrainConfig, fit, read_scalars, scalar_stats
from fixup.train.collapse import stage_of

# ResNet-14: two blocks in each of three stages, so a stage's record has a spread; 12 steps an epoch at batch 128.
SMALL = {"depth": 14, "batch_size": 128, "schedule": "constant"}


def _by(epoch: dict, kind: str) -> dict[str, dict]:
    return {r["stage"]: r for r in epoch["scalars"] if r["kind"] == kind}


def test_recorded_gates_are_the_models_gates_and_start_at_exactly_zero() -> None:
    result = fit(TrainConfig(**SMALL, norm="none", init="skipinit", epochs=1, max_updates=6), progress=False)
    assert [e["epoch"] for e in result.scalars] == [0, 1] and result.scalars[1]["step"] == 6
    start, end = _by(result.scalars[0], "gate"), _by(result.scalars[1], "gate")
    assert {r["kind"] for e in result.scalars for r in e["scalars"]} == {"gate"}  # no Fixup scalar in SkipInit
    for stage in ("layer1", "layer2", "layer3", "all"):
        assert all(start[stage][k] == 0.0 for k in ("mean", "std", "min", "max", "mean_abs"))
    gates: dict[str, list[float]] = {}
    for block, branch in find_branches(result.model):
        assert isinstance(branch.gate, Gate)
        gates.setdefault(stage_of(block), []).append(float(branch.gate.scale.detach().double()))
    gates["all"] = [g for v in list(gates.values()) for g in v]
    assert sorted(end) == sorted(gates)
    for stage, values in gates.items():
        t = torch.tensor(values, dtype=torch.float64)
        rec = end[stage]
        assert rec["count"] == len(values)
        assert rec["min"] == min(values) and rec["max"] == max(values)
        assert math.isclose(rec["mean"], float(t.mean()), rel_tol=1e-12, abs_tol=1e-15)
        assert math.isclose(rec["std"], float(t.std(correction=0)), rel_tol=1e-9, abs_tol=1e-15)
        assert math.isclose(rec["mean_abs"], float(t.abs().mean()), rel_tol=1e-12, abs_tol=1e-15)
    assert end["all"]["mean_abs"] > 0 and end["all"]["std"] > 0  # six steps moved the gates, not all alike


def test_fixup_kinds_are_the_multipliers_biases_and_stream_biases() -> None:
    model = fit(TrainConfig(**SMALL, epochs=1, max_updates=3), progress=False).model
    records = {(r["kind"], r["stage"]): r for r in scalar_stats(model)}
    stream = stream_biases(model)
    scales = [m for m in model.modules() if isinstance(m, Scale)]
    biases = [m for m in model.modules() if isinstance(m, Bias) and all(m is not s for s in stream)]
    assert records["stream_bias", "all"]["count"] == len(stream) == 6
    assert records["scale", "all"]["count"] == len(scales) == 6
    assert records["bias", "all"]["count"] == len(biases) == 3 * 6 + 2  # three per branch, the stem's, the head's
    assert records["bias", "trunk"]["count"] == 2
    values = [float(b.bias.detach().double()) for b in stream]
    assert records["stream_bias", "all"]["max"] == max(values) and records["stream_bias", "all"]["min"] == min(values)
    assert scalar_stats(torch.nn.Linear(3, 2)) == []  # a model without scalars records none


def test_the_record_survives_resume_bit_identical(tmp_path) -> None:
    cfg = TrainConfig(**SMALL, norm="none", init="rezero", epochs=3, hflip="on", crop_padding=1)
    straight = fit(cfg, out_dir=tmp_path / "straight", progress=False)
    stop_at = straight.history[0]["step"] + 5  # in the middle of the second epoch
    first = fit(cfg, out_dir=tmp_path / "resumed", progress=False, on_step=lambda s: s.step == stop_at)
    assert first.outcome.status == "interrupted" and [e["epoch"] for e in first.scalars] == [0, 1]
    resumed = fit(cfg, out_dir=tmp_path / "resumed", progress=False)
    assert resumed.outcome.status == "completed"
    assert [e["epoch"] for e in resumed.scalars] == [0, 1, 2, 3]
    assert resumed.scalars == straight.scalars  # floats compared exactly
    assert resumed.scalars[3]["scalars"] != resumed.scalars[0]["scalars"]  # the gates did move
    # The run folder and the result hold the same records.
    on_disk = [json.loads(line) for line in (tmp_path / "resumed" / "scalars.jsonl").read_text().splitlines()]
    assert on_disk == resumed.scalars
    assert json.loads((tmp_path / "resumed" / "result.json").read_text())["scalars"] == resumed.scalars
    assert read_scalars(tmp_path / "resumed") == resumed.scalars
    assert read_scalars(tmp_path / "resumed" / "result.json") == resumed.scalars
    # A finished run folder returns the same records without training.
    assert fit(cfg, out_dir=tmp_path / "resumed", progress=False).scalars == resumed.scalars


def test_lab_scalars_prints_writes_and_plots(tmp_path, capsys) -> None:
    run = tmp_path / "run"
    fit(TrainConfig(**SMALL, norm="none", init="skipinit", epochs=2, max_updates=14), out_dir=run, progress=False)
    out_json, out_png = tmp_path / "s.json", tmp_path / "s.png"
    assert cli_main(["lab", "scalars", str(run), "--json", str(out_json), "--plot", str(out_png)]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines if line.split()[2:4] == ["gate", "all"]]
    recorded = read_scalars(run)
    assert [int(r[0]) for r in rows] == [0, 1, 2]
    assert [float(r[5]) for r in rows] == [float(f"{_by(e, 'gate')['all']['mean']:.4g}") for e in recorded]
    assert json.loads(out_json.read_text())["scalars"] == recorded
    assert out_png.stat().st_size > 10_000
    assert cli_main(["lab", "scalars", str(tmp_path / "missing")]) == 2
    assert "missing does not exist" in capsys.readouterr().err
    assert cli_main(["lab", "scalars", str(tmp_path)]) == 2  # a folder without a run
    assert "neither scalars.jsonl nor result.json" in capsys.readouterr().err
