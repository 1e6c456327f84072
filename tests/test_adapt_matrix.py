"""benchmarks/adapt_matrix.py: the matrix of methods by models read from training files, and its target check."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("adapt_matrix", ROOT / "benchmarks" / "adapt_matrix.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(model: str, form: str, seed: int, acc: float, **options: object) -> dict:
    return {"model": model, "form": form, "seed": seed, "acc": acc, "steps": 150, "lr": 0.1, "scalar_lr_mult": 0.1,
            "clip": "norm", "recipe": "sgd", "adapt_options": options}


def test_gaps_and_seed_floors_are_checked_against_the_normalised_mean(bench, tmp_path) -> None:
    m = "resnet18"
    normalised = [_run(m, "normalised", s, 0.9) for s in range(3)] + [_run(m, "adapted", s, 0.88) for s in range(3)]
    (tmp_path / "adapt_training_clip_norm.json").write_text(json.dumps({"training": {"runs": normalised}}))
    rezero = [_run(m, "adapted", s, a, method="rezero") for s, a in enumerate((0.80, 0.86, 0.85))]
    rezero.append(_run(m, "adapted", 0, 0.99, method="rezero", gate_biases=True))  # another option: not this cell
    rezero.append({**_run(m, "adapted", 1, 0.99, method="rezero"), "lr": 0.3})  # another loop: not this cell
    (tmp_path / "adapt_training_rezero.json").write_text(json.dumps({"training": {"runs": rezero}}))
    store = [{"cell": "{}", **_run(m, "adapted", s, 0.3 if s == 2 else 0.95, method="skipinit")} for s in range(3)]
    (tmp_path / "adapt_training_skipinit.json.runs.jsonl").write_text(
        "\n".join(json.dumps(r) for r in store) + '\n{"cell": "trunc')  # a killed writer's last line is skipped
    row = bench.matrix(results=tmp_path)[m]
    assert row["normalised"]["source"] == "adapt_training_clip_norm.json"
    assert row["fixup"]["gap"] == pytest.approx(-0.02) and row["fixup"]["misses"] == []
    assert row["rezero"]["accs"] == [0.80, 0.86, 0.85] and row["rezero"]["misses"] == ["6.3 points below normalised"]
    assert row["skipinit"]["misses"] == ["16.7 points below normalised", "a seed at 30.0%"]  # both named
    assert "nf_resnet" not in row and "**miss**" in bench.markdown({m: row})
