"""benchmarks/adapt_t_fixup.py's rate search: scored on the validation sequences, extended past the grid's edge."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(ROOT / "tests"))
    spec = importlib.util.spec_from_file_location("adapt_t_fixup_benchmark", ROOT / "benchmarks" / "adapt_t_fixup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fake_run(accuracy):
    """A stand-in for ``run``: the accuracy is a function of the rate; records where each run was scored."""
    calls = []

    def run(form, seed, steps, lr, held_out=None, model="gpt2"):
        calls.append((lr, held_out))
        acc = accuracy(lr)
        return {"form": form, "seed": seed, "lr": lr, "status": "completed" if acc is not None else "failed",
                "copy_acc": acc, "test_loss": 1.0 - (acc or 0.0)}
    return run, calls


def _args(lrs, extend=2):
    return argparse.Namespace(lrs=lrs, search_seeds=[0, 1], steps=10, extend=extend, model="gpt2")


def test_an_interior_best_is_chosen_on_the_validation_sequences_only(bench, monkeypatch) -> None:
    run, calls = _fake_run(lambda lr: {0.001: 0.5, 0.003: 0.9, 0.01: None}[lr])
    monkeypatch.setattr(bench, "run", run)
    lr, runs = bench.search_rate("fixup", _args([0.001, 0.003, 0.01]))
    assert lr == 0.003 and len(runs) == 6 and all(r["split"] == "validation" for r in runs)
    assert {held for _, held in calls} == {bench.VALIDATION_SEED} != {bench.TEST_SEED}


def test_a_best_at_the_top_is_extended_at_most_extend_times(bench, monkeypatch) -> None:
    run, calls = _fake_run(lambda lr: min(1.0, lr))  # larger is always better
    monkeypatch.setattr(bench, "run", run)
    lr, _ = bench.search_rate("dyt", _args([0.01, 0.1], extend=2))
    assert sorted({c for c, _ in calls}) == pytest.approx([0.01, 0.1, 1.0, 10.0])
    assert lr == pytest.approx(1.0)  # 1.0 and 10.0 tie at accuracy 1: the lower loss ties too, so the smaller rate


def test_a_best_at_the_bottom_is_extended_downwards_and_ties_go_to_the_lower_loss(bench, monkeypatch) -> None:
    run, calls = _fake_run(lambda lr: 1.0 if lr < 0.002 else 0.2)
    monkeypatch.setattr(bench, "run", run)
    lr, _ = bench.search_rate("t_fixup", _args([0.001, 0.01], extend=1))
    assert sorted({c for c, _ in calls}) == pytest.approx([0.0001, 0.001, 0.01])
    assert lr == pytest.approx(0.0001)  # 0.0001 and 0.001 tie: the smaller rate


def test_no_extension_with_extend_zero(bench, monkeypatch) -> None:
    run, calls = _fake_run(lambda lr: lr)
    monkeypatch.setattr(bench, "run", run)
    assert bench.search_rate("fixup", _args([0.1, 0.2], extend=0))[0] == 0.2 and len(calls) == 4


def test_the_bert_copy_hides_exactly_the_copied_half_and_every_form_trains(bench) -> None:
    import torch

    pytest.importorskip("transformers")
    bench._install_torchvision_shim()  # transformers imports torchvision where it is installed
    ids = bench.batch(3, torch.Generator().manual_seed(0))
    seen = bench.masked(ids)
    assert (seen[:, bench.K + 1:] == bench.MASK).all() and torch.equal(seen[:, :bench.K + 1], ids[:, :bench.K + 1])
    for form in ("layernorm", "fixup", "t_fixup", "dyt_fitted"):
        r = bench.run(form, 0, 2, 1e-3, bench.VALIDATION_SEED, model="bert")
        assert r["status"] == "completed" and 0.0 <= r["copy_acc"] <= 1.0, r
