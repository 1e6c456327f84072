"""Every command's --json holds numbers under names, never formatted lines: each is read back and its figures
found as numbers (issue 17: `fixup lab theory --json` stored the lesson as "fan_in=2, relu_std=1.0000")."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from fixup.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

# A string holding a figure: "x=1.0", "2.5 ± 0.1", "97.2%", "relu_std=1.0000".
FORMATTED = re.compile(r"(=\s*-?\d)|±|(\d\s*%)")


def formatted_strings(data: Any, path: str = "") -> list[str]:
    """Every string in ``data`` that looks like a formatted figure, with where it is."""
    if isinstance(data, dict):
        return [s for k, v in data.items() for s in formatted_strings(v, f"{path}.{k}")]
    if isinstance(data, list):
        return [s for i, v in enumerate(data) for s in formatted_strings(v, f"{path}[{i}]")]
    if isinstance(data, str) and FORMATTED.search(data):
        return [f"{path}: {data!r}"]
    return []


def _json(tmp_path, argv: list[str], allowed: tuple[str, ...] = ()) -> Any:
    out = tmp_path / "out.json"
    assert main([*argv, "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    bad = [s for s in formatted_strings(data) if not s.split(":")[0].endswith(allowed)]
    assert not bad, f"`fixup {' '.join(argv)}` --json holds formatted figures: {bad[:5]}"
    return data


def test_lab_theory_json_holds_the_lesson_and_every_exponent(tmp_path):
    data = _json(tmp_path, ["lab", "theory", "--variance-depths", "1,5", "--draws", "50"])
    assert [r["relu_std"] for r in data["lesson"]["relu_std"]] == pytest.approx([1.0, 0.5, 0.25, 1 / 3])
    assert [r["fan_in"] for r in data["lesson"]["relu_std"]] == [2, 8, 32, 18]
    assert data["lesson"]["row_normalise"][1]["normalised"] == pytest.approx([-1.0, 1.0], abs=1e-5)
    assert {r["m"]: r["exponent"] for r in data["exponents"]} == {2: -0.5, 3: -0.25}
    assert data["budgets"][2]["aligned_total"] == pytest.approx(0.1)


def test_lab_scalar_update_probe_coupling_json(tmp_path):
    data = _json(tmp_path, ["lab", "scalar", "--depths", "10,100", "--schemes", "fixup,unscaled"])
    assert all(isinstance(r["df1_over_eta"], float) for r in data["records"])
    data = _json(tmp_path, ["lab", "update", "--depths", "8,14", "--methods", "fixup", "--steps", "1,2",
                            "--batch", "4"])
    assert isinstance(data["fits"]["fixup"]["df_max@2"]["slope"], float)
    data = _json(tmp_path, ["lab", "probe", "resnet20"])
    assert all(isinstance(r["std"], float) for r in data["stats"])
    data = _json(tmp_path, ["lab", "coupling", "resnet20", "--methods", "fixup", "--companions", "2"])
    assert all(r["output_rel"] == 0 for r in data)


def test_inspect_json(tmp_path):
    data = _json(tmp_path, ["inspect", "resnet110"], allowed=("warnings", "message"))
    report = data["report"]
    assert report["num_branches"] == 54 and report["branches"][0]["m"] == 2
    assert report["branches"][0]["factor"] == pytest.approx(54 ** -0.5) and data["parameters"] == 1_720_138


def test_train_json(tmp_path):
    data = _json(tmp_path, ["train", "--depth", "8", "--epochs", "1", "--no-progress", "--out-dir",
                            str(tmp_path / "run")], allowed=("reason",))
    assert isinstance(data["history"][0]["test_acc"], float) and data["outcome"]["status"] == "completed"


def test_translate_json(tmp_path):
    extra = json.dumps({"synthetic_train": 200, "synthetic_eval": 20, "vocab_size": 150, "bleu_limit": 0,
                        "model": {"d_model": 32, "ffn_dim": 64, "heads": 2, "encoder_layers": 1,
                                  "decoder_layers": 1}})
    data = _json(tmp_path, ["translate", "--out-dir", str(tmp_path / "run"), "--max-updates", "2",
                            "--warmup-steps", "1", "--device", "cpu", "--no-progress", "--beam", "1", "--extra", extra],
                 allowed=("signature", "reason"))
    assert isinstance(data["bleu"]["bleu"], float) and isinstance(data["copy_bleu"], float)


def test_bench_json(tmp_path):
    data = _json(tmp_path, ["bench", "--families", "cifar", "--depth", "8", "--variants", "none", "fixup", "--batch",
                            "2", "--image-size", "8", "--threads", "1", "--warmup", "0", "--reps", "1", "--no-memory",
                            "--no-explain"])
    numbers = [v for r in data["rows"] for v in r.values() if isinstance(v, float)]
    assert numbers, "bench rows hold no numbers"
