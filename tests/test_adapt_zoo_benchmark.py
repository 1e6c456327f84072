"""benchmarks/adapt_zoo.py's rate search: the held-out part it scores on and the rate it picks."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(ROOT / "tests"))
    spec = importlib.util.spec_from_file_location("adapt_zoo_benchmark", ROOT / "benchmarks" / "adapt_zoo.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_held_out_part_takes_the_fraction_of_every_class_and_leaves_the_test_set(bench) -> None:
    y = torch.arange(10).repeat_interleave(torch.arange(10, 20))  # class c has 10 + c examples
    x = torch.arange(len(y), dtype=torch.float).view(-1, 1)
    xt, yt = torch.zeros(3, 1), torch.zeros(3, dtype=torch.long)
    xa, ya, xb, yb = bench.held_out((x, y, xt, yt), 0.2)
    assert len(ya) + len(yb) == len(y) and set(xa.flatten().tolist()).isdisjoint(xb.flatten().tolist())
    for c in range(10):
        assert int((yb == c).sum()) == round(0.2 * (10 + c))
    again = bench.held_out((x, y, xt, yt), 0.2)
    assert torch.equal(again[2], xb)  # the same split every time: the search's rates are comparable


def test_the_rate_with_the_best_mean_held_out_accuracy_is_chosen_ties_to_the_smaller(bench) -> None:
    rows = [{"model": "m", "form": "adapted", "lr": lr, "acc": acc}
            for lr, acc in [(0.1, 0.8), (0.1, 0.9), (0.3, 0.85), (0.3, 0.85), (1.0, 0.1)]]
    rows += [{"model": "m", "form": "normalised", "lr": lr, "acc": 0.9} for lr in (0.3, 0.1)]
    assert bench.chosen_rates(rows) == {("m", "adapted"): 0.1, ("m", "normalised"): 0.1}
    rows[0]["acc"] = 0.7
    assert bench.chosen_rates(rows)[("m", "adapted")] == 0.3


def test_a_rate_at_the_edge_of_the_grid_is_searched_on_at_most_twice_each_way(bench) -> None:
    def row(form: str, lr: float, acc: float) -> dict[str, object]:
        return {"model": "m", "form": form, "lr": lr, "acc": acc}

    grid = [0.001, 0.003, 0.01]
    search = [row("up", 0.001, 0.5), row("up", 0.003, 0.7), row("up", 0.01, 0.9),
              row("down", 0.001, 0.9), row("down", 0.003, 0.7), row("down", 0.01, 0.5),
              row("inside", 0.001, 0.5), row("inside", 0.003, 0.9), row("inside", 0.01, 0.5)]
    more = bench.edge_rates(search, grid, extend=2)
    assert set(more) == {("m", "up"), ("m", "down")}  # an interior best needs nothing more
    assert more[("m", "up")] == pytest.approx(0.01 * 0.01 / 0.003)
    assert more[("m", "down")] == pytest.approx(0.001 * 0.001 / 0.003)
    search += [row("up", more[("m", "up")], 0.95), row("down", more[("m", "down")], 0.4)]
    more = bench.edge_rates(search, grid, extend=2)
    assert set(more) == {("m", "up")}  # down's best came back inside its rates
    search.append(row("up", more[("m", "up")], 0.97))
    assert bench.edge_rates(search, grid, extend=2) == {}  # two steps beyond the grid: the search stops
    assert bench.edge_rates(search[:9], grid, extend=0) == {}


def test_cells_in_the_run_store_are_read_back_not_trained_again(bench, tmp_path, monkeypatch) -> None:
    from fixup._io import RecordLog

    cell = bench.Cell(bench.OURS, "adapted", 0, steps=2, resnet18_width=4)
    first = bench.run_cells([cell], 1, RecordLog(tmp_path / "runs.jsonl", ("cell",)))
    monkeypatch.setattr(bench, "run_cell", lambda c: pytest.fail(f"trained again: {c}"))
    again = bench.run_cells([bench.replace(cell, threads=2)], 1, RecordLog(tmp_path / "runs.jsonl", ("cell",)))
    assert again == first and first[0]["steps"] == 2  # the thread count does not make another run
    assert bench.cell_key(bench.replace(cell, seed=1)) != bench.cell_key(cell)
