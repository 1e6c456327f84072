"""`fixup lab ...`: every subcommand prints its table, writes JSON and a figure."""

import json

import pytest

from fixup.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


def _run(capsys, tmp_path, *argv):
    out_json, out_png = tmp_path / "out.json", tmp_path / "out.png"
    assert main(["lab", *argv, "--json", str(out_json), "--plot", str(out_png)]) == 0
    assert out_png.stat().st_size > 1000
    return capsys.readouterr().out, json.loads(out_json.read_text())


def test_lab_theory_prints_the_lesson_exactly(capsys, tmp_path):
    out, data = _run(capsys, tmp_path, "theory", "--variance-depths", "1,5", "--draws", "200")
    assert out.splitlines()[:6] == ["fan_in=2, relu_std=1.0000", "fan_in=8, relu_std=0.5000",
                                    "fan_in=32, relu_std=0.2500", "fan_in=18, relu_std=0.3333",
                                    "[-1.0, 1.0]", "[-1.0, 1.0]"]
    assert data["budgets"][2]["aligned_total"] == pytest.approx(0.1)


def test_lab_scalar(capsys, tmp_path):
    out, data = _run(capsys, tmp_path, "scalar", "--depths", "10,1000", "--schemes", "fixup,unscaled,zero", "--m", "3")
    assert "unscaled" in out and len(data["records"]) == 6 and data["config"]["m"] == 3


def test_lab_update(capsys, tmp_path):
    out, data = _run(capsys, tmp_path, "update", "--depths", "8,14", "--methods", "fixup,batchnorm",
                     "--steps", "1,2", "--batch", "4", "--blocks")
    assert "slope" in out and set(data["fits"]) == {"fixup", "batchnorm"}
    fixup_step1 = [r for r in data["records"] if r["method"] == "fixup" and r["step"] == 1]
    assert all(r["block_df_rel_max"] == 0 and r["block_df_rel_argmax"] is None for r in fixup_step1)


def test_lab_probe(capsys, tmp_path):
    out, data = _run(capsys, tmp_path, "probe", "resnet20", "--method", "batchnorm")
    assert "residual shapes: 9 of 9 residual sums match" in out
    assert {r["mode"] for r in data["stats"]} == {"train", "eval"}


def test_lab_coupling(capsys, tmp_path):
    out, data = _run(capsys, tmp_path, "coupling", "resnet20", "--methods", "fixup,batchnorm", "--companions", "3")
    bn_train = next(r for r in data if r["method"] == "batchnorm" and r["mode"] == "train")
    assert bn_train["blocks_rel"] > 0.01 and "batchnorm" in out


def test_lab_rejects_an_unknown_method(capsys):
    assert main(["lab", "coupling", "resnet20", "--methods", "fixpu"]) == 2
    assert "unknown method 'fixpu'" in capsys.readouterr().err
