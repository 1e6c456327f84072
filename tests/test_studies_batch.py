"""The batch-size study (issue 36): its plan (equal examples, the rate rule), the rate chosen on validation, each
verdict of its two claims from constructed cell results, BatchNorm at batch 1 as a measured row, a resumed run and
its report."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from fixup.studies import Store, batch, make_grid, reproduce
from fixup.studies.cells import Cell
from fixup.studies.claims import DIRECTION, NOT_REPRODUCED, NOT_RUN, UNRESOLVED
from fixup.studies.evidence import Cells


def _grid(mode: str = "deep", **batch_fields):
    g = make_grid(mode)
    return replace(g, batch=replace(g.batch, **batch_fields)) if batch_fields else g


def test_plan_every_method_batch_rate_and_seed_with_equal_examples():
    grid = _grid("deep")
    g = grid.batch
    tasks = batch.plan(grid, Store("/nonexistent")).tasks
    assert set(g.methods) == {"fixup", "batchnorm", "groupnorm", "skipinit", "nf_resnet"}
    assert g.batch_sizes == (1, 2, 4, 8, 32, 128) and grid.seeds == 3
    assert len(tasks) == len(g.methods) * len(g.batch_sizes) * len(g.lr_factors) * grid.seeds
    assert len({t.cell.key for t in tasks}) == len(tasks)
    for t in tasks:
        train, b = t.cell.config["train"], t.cell.setting["batch"]
        assert train["batch_size"] == b and train["epochs"] == g.epochs  # the same examples at every batch size
        assert train["lr"] == t.cell.setting["lr"] and train["grad_clip"] == 0.0
        assert t.cell.config["val_fraction"] == 0.2
    # the rate rule: 0.1 x sqrt(B / 128) x (1/3, 1, 3)
    assert batch.lr_grid(grid, 128) == [0.0333, 0.1, 0.3]
    assert batch.lr_grid(grid, 2) == [pytest.approx(0.1 * math.sqrt(2 / 128) * f, rel=1e-3) for f in (1 / 3, 1, 3)]
    # a step has a fixed cost: a batch-1 cell costs more than a batch-128 one with the same examples
    cost = {t.cell.setting["batch"]: t.cell.cost for t in tasks}
    assert cost[1] > cost[8] > cost[128]
    assert batch.train_examples(grid) == 1437 - round(1437 * 0.2)


def test_the_study_is_its_own_command_and_out_of_every_reproduce_tier():
    for mode in ("tiny", "quick", "deep", "full"):
        assert "fixup study batch" in make_grid(mode).skipped["batch"]


def _records(cells: dict) -> list[dict]:
    """{(method, batch): {lr: [(val, test) | (val, test, batch_stats) | "diverged" | "failed", ...]}} -> records."""
    out = []
    for (method, b), rates in cells.items():
        for lr, runs in rates.items():
            for seed, run in enumerate(runs):
                if isinstance(run, str):
                    result = {"outcome": run, "reason": f"{run} here", "val_acc": None, "test_acc": None}
                else:
                    result = {"outcome": "completed", "val_acc": run[0], "test_acc": run[1],
                              "test_acc_batch_stats": run[2] if len(run) > 2 else None}
                out.append({"study": "batch", "method": method, "setting": {"batch": b, "lr": lr}, "seed": seed,
                            "config": {}, "result": result})
    return out


def _one_rate_grid(sizes=(1, 32), methods=("fixup", "batchnorm", "groupnorm")):
    return _grid("deep", batch_sizes=sizes, lr_factors=(1.0,), methods=methods)


def test_the_rate_is_chosen_on_validation_and_the_test_figure_is_that_rates():
    grid = _grid("deep", batch_sizes=(8,), methods=("fixup",))
    low, mid, high = batch.lr_grid(grid, 8)
    # the middle rate is best on validation, the high one on test: the study must report the middle one's test
    recs = _records({("fixup", 8): {low: [(0.80, 0.99)] * 3, mid: [(0.90, 0.85), (0.91, 0.86), (0.92, 0.87)],
                                    high: [(0.85, 0.99)] * 3}})
    entry = batch.summarise(recs, grid)["methods"]["fixup"]["8"]
    assert entry["lr"] == mid and not entry["edge"]
    assert Cells.from_dict(entry["test_acc"]).stat.mean == pytest.approx(0.86)
    # a failed seed counts as 0 on validation: two good seeds and a divergence lose to three fair ones
    recs = _records({("fixup", 8): {low: [(0.95, 0.9), (0.95, 0.9), "diverged"], mid: [(0.80, 0.8)] * 3,
                                    high: [(0.1, 0.1)] * 3}})
    entry = batch.summarise(recs, grid)["methods"]["fixup"]["8"]
    assert entry["lr"] == mid and "lr 0.00833 1" in entry["why"]
    # a best rate still at the edge once the search has gone on twice is marked
    below = [float(f"{low / 3:.3g}"), float(f"{low / 9:.3g}")]
    recs = _records({("fixup", 8): {lr: [(0.9 if lr == below[-1] else 0.5, 0.8)] * 3
                                    for lr in (low, mid, high, *below)}})
    entry = batch.summarise(recs, grid)["methods"]["fixup"]["8"]
    assert entry["lr"] == below[-1] and entry["edge"]
    # ties go to the smaller rate; an unfinished rate leaves the choice open
    tie = {low: Cells(3, (0.9, 0.9, 0.9)), mid: Cells(3, (0.9, 0.9, 0.9))}
    assert batch.choose_rate(tie)[0] == low
    assert batch.choose_rate({**tie, high: Cells(3, (0.99,))}) is None
    recs = _records({("fixup", 8): {low: [(0.8, 0.8)] * 3, mid: [(0.9, 0.9)] * 2}})
    entry = batch.summarise(recs, grid)["methods"]["fixup"]["8"]
    assert entry["lr"] is None and "not finished" in entry["why"]


def test_the_search_goes_on_beyond_a_best_rate_at_its_edge():
    grid = _grid("deep")
    low, mid, high = batch.lr_grid(grid, 128)

    def searched(best: float, rates=(low, mid, high)) -> dict:
        return {lr: Cells(3, (0.9 if lr == best else 0.5,) * 3) for lr in rates}

    assert batch.extension(grid, 128, searched(mid)) is None
    assert batch.extension(grid, 128, searched(high)) == 0.9
    assert batch.extension(grid, 128, searched(low)) == 0.0111
    assert batch.extension(grid, 128, searched(0.9, (low, mid, high, 0.9))) == 2.7
    assert batch.extension(grid, 128, searched(2.7, (low, mid, high, 0.9, 2.7))) is None  # twice at most
    assert batch.extension(grid, 128, {**searched(high), mid: Cells(3, (0.5,))}) is None  # a seed not finished
    # a summary made while the search goes on chooses no rate yet
    recs = _records({("fixup", 128): {lr: [(0.9 if lr == high else 0.5, 0.8)] * 3 for lr in (low, mid, high)}})
    entry = batch.summarise(recs, replace(grid, batch=replace(grid.batch, batch_sizes=(128,))))["methods"]["fixup"]
    assert entry["128"]["lr"] is None and "goes on at lr 0.9" in entry["128"]["why"]


def rising_cell(cell: Cell, work) -> dict:
    """Validation accuracy rises with the rate up to 1, then the run diverges."""
    lr = cell.setting["lr"]
    if lr > 1:
        return {"outcome": "diverged", "reason": "nan", "val_acc": None, "test_acc": None}
    return {"outcome": "completed", "val_acc": 0.5 + lr / 4, "test_acc": 0.5 + lr / 4}


def test_a_run_plans_the_extended_rates_once_the_grid_rates_finish(tmp_path, monkeypatch):
    monkeypatch.setattr(batch, "batch_cell", rising_cell)
    grid = _grid("tiny", methods=("fixup",), batch_sizes=(128,), lr_factors=(1 / 3, 1, 3))
    result = reproduce(grid, tmp_path, studies=["batch"], plots=False)
    # 0.0333, 0.1, 0.3, then 0.9 (best at the edge), then 2.7 (diverged): 0.9 is inside, the search stops
    assert result.cells_run == 5 * grid.seeds
    entry = result.outputs["batch"].summary["methods"]["fixup"]["128"]
    assert entry["lr"] == 0.9 and not entry["edge"] and sorted(map(float, entry["searched"])) == [
        0.0333, 0.1, 0.3, 0.9, 2.7]
    # planned again over the finished store (a rerun): every cell once, the extended ones included
    keys = [t.cell.key for t in batch.plan(grid, Store(tmp_path)).tasks]
    assert len(keys) == len(set(keys)) == 5 * grid.seeds


def _verdicts(cells: dict, grid=None) -> dict[str, str]:
    grid = grid or _one_rate_grid()
    summary = batch.summarise(_records(cells), grid)
    return {r.claim: r.verdict for r in batch.claims(summary, grid)}


def _cells(grid, fixup: dict, batchnorm: dict, groupnorm: dict) -> dict:
    out = {}
    for method, by_batch in (("fixup", fixup), ("batchnorm", batchnorm), ("groupnorm", groupnorm)):
        for b, runs in by_batch.items():
            out[(method, b)] = {batch.lr_grid(grid, b)[0]: runs}
    return out


def _acc(*values):
    return [(v, v) for v in values]


def test_batch_independent_claim_gives_each_verdict():
    grid = _one_rate_grid()
    good = {1: _acc(0.90, 0.91, 0.92), 32: _acc(0.93, 0.94, 0.95)}
    # BatchNorm fails at batch 1 (no batch statistics there): it holds
    holds = _cells(grid, good, {1: ["failed"] * 3, 32: _acc(0.95, 0.96, 0.97)}, good)
    assert _verdicts(holds)["batch_independent_trains"] == DIRECTION
    # BatchNorm 10 points lower at batch 1, beyond the interval: it holds
    low = _cells(grid, good, {1: _acc(0.80, 0.81, 0.82), 32: _acc(0.95, 0.96, 0.97)}, good)
    assert _verdicts(low)["batch_independent_trains"] == DIRECTION
    # BatchNorm clearly above Fixup at the smallest batch: refuted
    above = _cells(grid, good, {1: _acc(0.97, 0.975, 0.98), 32: _acc(0.95, 0.96, 0.97)}, good)
    assert _verdicts(above)["batch_independent_trains"] == NOT_REPRODUCED
    # within the seeds' spread everywhere: cannot be resolved
    noisy = _cells(grid, good, {1: _acc(0.85, 0.95, 0.91), 32: _acc(0.90, 0.99, 0.93)}, good)
    assert _verdicts(noisy)["batch_independent_trains"] == UNRESOLVED
    # a Fixup seed that diverged refutes it (it says Fixup trains at every batch size)
    bad = _cells(grid, {**good, 1: [*_acc(0.9, 0.9), "diverged"]}, {1: ["failed"] * 3, 32: good[32]}, good)
    assert _verdicts(bad)["batch_independent_trains"] == NOT_REPRODUCED
    # BatchNorm's batch 32 not finished: not run
    missing = _cells(grid, good, {1: ["failed"] * 3}, good)
    assert _verdicts(missing)["batch_independent_trains"] == NOT_RUN
    # a gap beyond the interval but under a point is not "cannot"
    tight = _cells(grid, {1: _acc(0.900, 0.901, 0.902), 32: good[32]},
                   {1: _acc(0.895, 0.896, 0.897), 32: good[32]}, good)
    assert _verdicts(tight)["batch_independent_trains"] == UNRESOLVED


def test_fixup_against_groupnorm_gives_each_verdict():
    grid = _one_rate_grid()
    fx = {1: _acc(0.900, 0.902, 0.904), 32: _acc(0.950, 0.952, 0.954)}
    bn = {1: _acc(0.8, 0.8, 0.8), 32: _acc(0.95, 0.95, 0.95)}
    # GroupNorm 0.1 point ahead with a 0.5-point interval: on par
    same = _cells(grid, fx, bn, {1: _acc(0.901, 0.903, 0.905), 32: _acc(0.949, 0.951, 0.953)})
    assert _verdicts(same)["fixup_groupnorm_every_batch"] == DIRECTION
    # Fixup far ahead is on par too (the claim is that Fixup is not behind)
    ahead = _cells(grid, fx, bn, {1: _acc(0.80, 0.81, 0.82), 32: _acc(0.949, 0.951, 0.953)})
    assert _verdicts(ahead)["fixup_groupnorm_every_batch"] == DIRECTION
    behind = _cells(grid, fx, bn, {1: _acc(0.95, 0.955, 0.96), 32: _acc(0.949, 0.951, 0.953)})
    assert _verdicts(behind)["fixup_groupnorm_every_batch"] == NOT_REPRODUCED
    noisy = _cells(grid, fx, bn, {1: _acc(0.87, 0.95, 0.91), 32: _acc(0.949, 0.951, 0.953)})
    assert _verdicts(noisy)["fixup_groupnorm_every_batch"] == UNRESOLVED


def test_report_shows_the_rules_the_gap_to_groupnorm_and_where_the_mismatch_starts(tmp_path):
    grid = _one_rate_grid(sizes=(1, 8, 32))
    fx = {b: _acc(0.9, 0.91, 0.92) for b in (1, 8, 32)}
    # BatchNorm with batch statistics stays good; its running statistics lose 20 points at batch 1 and 8
    bn = {b: [(0.7, 0.7, 0.9), (0.71, 0.71, 0.91), (0.72, 0.72, 0.92)] for b in (1, 8)}
    bn[32] = [(0.9, 0.9, 0.9), (0.91, 0.91, 0.905), (0.92, 0.92, 0.915)]
    summary = batch.summarise(_records(_cells(grid, fx, bn, fx)), grid)
    md = batch.markdown(summary, grid)
    assert "sqrt(B / 128)" in md and "validation" in md and "the test set gives that rate's figures only" in md
    assert "the mismatch starts to hurt at batch 8 and below" in md
    assert "| 32 | 91.0 ± 1.0% (n=3) | 90.7 ± 0.8% (n=3) |" in md
    assert "Fixup against GroupNorm" in md and "| 1 | 91.0 ± 1.0% (n=3) | 91.0 ± 1.0% (n=3) | 0.0 points" in md
    [png] = batch.figures(summary, tmp_path)
    drawn = json.loads(png.with_name("batch.data.json").read_text())
    assert [p["batch"] for p in drawn["series"]["batchnorm:test_acc_batch_stats"]] == [1, 8, 32]


def _tiny_cell(method: str, b: int, *, image_size: int = 0, limit: int = 16) -> Cell:
    grid = make_grid("tiny")
    train = batch.image_train(grid, method, 0, model="resnet_cifar", depth=8, lr=0.01, batch_size=b, epochs=1,
                              device="cpu")
    if image_size:
        train["image_size"] = image_size
    return Cell("batch", method, {"batch": b, "lr": 0.01}, 0,
                config={"train": train, "val_fraction": 0.2, "train_limit": limit})


def test_batchnorm_at_batch_1_is_a_measured_row(tmp_path):
    # 8x8 digits: the last stage's maps are 2x2, so batch 1 has 4 values per channel and BatchNorm trains
    r = batch.batch_cell(_tiny_cell("batchnorm", 1), tmp_path / "a")
    assert r["outcome"] == "completed" and r["steps"] == 16 and r["examples"] == 16
    assert 0 <= r["test_acc"] <= 1 and 0 <= r["test_acc_batch_stats"] <= 1 and 0 <= r["val_acc"] <= 1
    # at 4x4 the last stage's maps are 1x1: one value per channel at batch 1, which torch cannot train; the cell
    # records it as an outcome, naming the layer, and trains nothing
    r = batch.batch_cell(_tiny_cell("batchnorm", 1, image_size=4), tmp_path / "b")
    assert r["outcome"] == "failed" and "1x1 maps at batch 1" in r["reason"] and "layer" in r["reason"]
    assert r["test_acc"] is None and not (tmp_path / "b").exists()
    # the same maps at batch 2 train (two values per channel), and a batch-independent method trains at batch 1
    assert batch.batch_cell(_tiny_cell("batchnorm", 2, image_size=4), tmp_path / "c")["outcome"] == "completed"
    r = batch.batch_cell(_tiny_cell("fixup", 1, image_size=4), tmp_path / "d")
    assert r["outcome"] == "completed" and r["test_acc_batch_stats"] is None


def test_the_last_short_batch_decides_batchnorm_at_small_batches(tmp_path):
    # 17 examples at batch 2: the epoch ends in a batch of 1, which on 1x1 maps cannot train
    r = batch.batch_cell(_tiny_cell("batchnorm", 2, image_size=4, limit=17), tmp_path)
    assert r["outcome"] == "failed" and "at batch 1" in r["reason"]


def fake_cell(cell: Cell, work) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    acc = {"fixup": 0.9, "batchnorm": 0.8}[cell.method] + 0.01 * cell.seed
    if cell.method == "batchnorm" and cell.setting["batch"] == 1:
        return {"outcome": "failed", "reason": "BatchNorm needs more than 1 value per channel", "val_acc": None,
                "test_acc": None, "test_acc_batch_stats": None}
    return {"outcome": "completed", "val_acc": acc, "test_acc": acc,
            "test_acc_batch_stats": acc if cell.method == "batchnorm" else None}


def test_a_rerun_resumes_every_cell_and_the_report_has_both_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(batch, "batch_cell", fake_cell)
    grid = make_grid("tiny")
    first = reproduce(grid, tmp_path, studies=["batch"], plots=False)
    assert not first.failed and first.cells_run == 8
    again = reproduce(grid, tmp_path, studies=["batch"], plots=False)
    assert again.cells_run == 0 and again.cells_resumed == 8
    claims = {c["claim"]: c for c in json.loads(again.results.read_text())["claims"]}
    assert claims["batch_independent_trains"]["verdict"] == DIRECTION
    assert claims["fixup_groupnorm_every_batch"]["verdict"] == NOT_RUN  # GroupNorm is not in the tiny grid
    report = again.report.read_text()
    assert "BatchNorm at batch 1: BatchNorm needs more than 1 value per channel" in report
    assert "| BatchNorm | — (n=0 of 2; failed 2 of 2) (lr 0.00884) |" in report


@pytest.mark.slow
def test_fixup_study_batch_tiny_end_to_end(tmp_path):
    """`fixup study batch --tiny` trains its cells with the real engine, BatchNorm at batch 1 included, writes its
    report and figure; a rerun redoes nothing."""
    from fixup.cli import main

    out = tmp_path / "batch"
    assert main(["study", "batch", "--tiny", "--out", str(out), "--jobs", "1"]) == 0
    data = json.loads((out / "results.json").read_text())
    bn1 = data["studies"]["batch"]["methods"]["batchnorm"]["1"]
    assert bn1["test_acc"]["n"] + sum(bn1["test_acc"]["failed"].values()) == 2  # a figure or a named outcome
    assert "## Batch size" in (out / "report.md").read_text() and (out / "figures" / "batch.png").exists()
    assert main(["study", "batch", "--tiny", "--out", str(out), "--no-plots"]) == 0
    assert json.loads((out / "results.json").read_text())["timing"]["cells_run"] == 0


def test_a_signal_during_a_cell_stops_the_whole_run_and_keeps_the_cells_checkpoint(tmp_path, monkeypatch):
    # with --jobs 1 the cell trains in the run's own process, where the engine turns SIGTERM into a clean stop of
    # the cell; the cell must pass the signal on (Interrupted), or the run would go on with the next cell
    import os
    import signal

    import fixup.train
    from fixup._signals import Interrupted

    real = fixup.train.fit

    def signalled_fit(config, **kwargs):
        kwargs["on_step"] = lambda step: os.kill(os.getpid(), signal.SIGTERM) if step.step == 2 else None
        return real(config, **kwargs)

    monkeypatch.setattr(fixup.train, "fit", signalled_fit)
    with pytest.raises(Interrupted) as stopped:
        batch.batch_cell(_tiny_cell("fixup", 2), tmp_path)
    assert stopped.value.name == "SIGTERM"
    assert (tmp_path / "checkpoint.pt").exists()  # the next run resumes the cell from it
