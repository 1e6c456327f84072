"""The report: a row for every claim of the paper, verdicts that follow the results, figures, and the plan
of each study (methods, protocol choices) — with a stand-in for the training engine."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from fixup.studies import Store, ablation, depth, make_grid, regularisation, reproduce
from fixup.studies.claims import DIRECTION, NOT_REPRODUCED, NOT_RUN, UNRESOLVED
from fixup.studies.paper import CLAIMS
from fixup.studies.regularisation import best_stable_lr


def _history(acc: float | None, loss: float | None, epochs: int) -> list[dict]:
    return [{"epoch": e + 1, "train_loss": None if loss is None else loss + 0.1 * (epochs - e),
             "test_acc": acc, "train_acc": acc} for e in range(epochs)]


def fake_train(good: bool):
    """A stand-in for the engine: Fixup and BatchNorm learn, He at rate 0.1 diverges, LSUV fails deep."""

    def run(cell, work):
        train = cell.config["train"]
        m, d, s = cell.method, train.get("depth", 20), cell.seed
        diverged = (m == "he" and train["lr"] >= 0.1) or m == "fixup_scale_x10"
        acc = {"fixup": 0.85 if good else 0.12, "batchnorm": 0.88, "groupnorm": 0.86, "he": 0.7,
               "lsuv": 0.1 if d > 10 else 0.7, "sqrt2": 0.11 if d > 10 else 0.7}.get(m, 0.5)
        acc += 0.01 * s
        loss = {"fixup_scale_x0.1": 2.0}.get(m, 0.5 if m != "he" else 0.3 + train["lr"])
        h = [] if diverged else _history(acc, loss, train["epochs"])
        return {"outcome": "diverged" if diverged else "completed", "diverged": diverged, "history": h,
                "test_acc": None if diverged else acc, "train_loss": None if diverged else loss,
                "train_acc": None if diverged else acc}

    return run


@pytest.fixture()
def fake_engine(monkeypatch):
    def use(good: bool = True):
        for mod in (depth, ablation, regularisation):
            monkeypatch.setattr(mod, "train_cell", fake_train(good))
    return use


def test_results_have_a_row_for_every_claim(tmp_path, fake_engine):
    fake_engine(good=True)
    result = reproduce(make_grid("tiny"), tmp_path, studies=["depth", "ablation", "regularisation"])
    assert not result.failed
    data = json.loads(result.results.read_text())
    assert [c["claim"] for c in data["claims"]] == [c.id for c in CLAIMS]
    report = result.report.read_text()
    ran = {"depth", "ablation", "regularisation"}
    for c in CLAIMS:  # report.md: the claims of the studies run (results.json has every one)
        assert (c.statement in report) == (c.study in ran), c.id
    assert f"The paper's {sum(c.study not in ran for c in CLAIMS)} further claims" in report
    verdicts = {c["claim"]: c["verdict"] for c in data["claims"]}
    assert verdicts["depth_fixup_trains_deep"] == DIRECTION  # digits, not the paper's CIFAR-10 at 10,000 layers
    assert verdicts["no_norm_needs_small_rate"] == DIRECTION
    assert verdicts["imagenet_resnet50"] == NOT_RUN and verdicts["translation_iwslt"] == NOT_RUN
    assert verdicts["ablation_zero_branch"] == DIRECTION
    for c in data["claims"]:
        if c["verdict"] != NOT_RUN:
            assert c["ours"] and c["scale"], c
    for figs in data["figures"].values():
        for f in figs:
            assert (tmp_path / f).stat().st_size > 1000
    assert "![depth](figures/depth.png)" in report


def test_verdicts_follow_the_results(tmp_path, fake_engine):
    fake_engine(good=False)  # Fixup at chance: the depth claim must not be reproduced
    result = reproduce(make_grid("tiny"), tmp_path, studies=["depth"])
    rows = {c["claim"]: c for c in json.loads(result.results.read_text())["claims"]}
    assert rows["depth_fixup_trains_deep"]["verdict"] == NOT_REPRODUCED
    assert rows["ablation_zero_branch"]["verdict"] == NOT_RUN and "not part of this run" in rows[
        "ablation_zero_branch"]["why"]


def test_rerun_reuses_every_cell(tmp_path, fake_engine):
    fake_engine()
    first = reproduce(make_grid("tiny"), tmp_path, studies=["regularisation"], plots=False)
    again = reproduce(make_grid("tiny"), tmp_path, studies=["regularisation"], plots=False)
    assert first.cells_run > 0 and again.cells_run == 0 and again.cells_resumed == first.cells_run


def test_depth_plan_holds_every_method_at_the_batchnorm_rate():
    grid = make_grid("full")
    tasks = depth.plan(grid, Store("/nonexistent")).tasks
    assert {t.cell.method for t in tasks} >= {"fixup", "batchnorm", "lsuv", "sqrt2", "he"}
    assert {t.cell.config["train"]["lr"] for t in tasks} == {0.1}
    init = {t.cell.method: t.cell.config["train"]["init"] for t in tasks}
    assert init["fixup"] == "fixup" and init["fixup_paper"] == "fixup_paper"  # our correction beside the paper's
    scaled = {t.cell.method: t.cell.config["train"].get("lr_reference_batch", 0) for t in tasks}
    assert scaled["fixup_batch_scaled"] == 128 and scaled["fixup"] == 0  # the authors' 0.1 x batch / 128
    assert max(t.cell.setting["depth"] for t in tasks) == 10_000
    assert {t.cell.seed for t in tasks} == {0, 1, 2} and all(t.cell.config["train"]["epochs"] == 1 for t in tasks)
    batch = {t.cell.setting["depth"]: t.cell.config["train"]["batch_size"] for t in tasks}
    assert batch[1000] == 128 and batch[10_000] == 64  # the paper's batch sizes (section 4.1)
    quick = depth.plan(make_grid("quick"), Store("/nonexistent")).tasks
    # quick mode stops at 130 layers (beyond 100, where the baselines' claim is made) to keep its 8 minutes
    assert max(t.cell.setting["depth"] for t in quick) > 100 and {t.cell.seed for t in quick} == {0, 1}


def test_regularisation_plan_follows_the_paper(tmp_path):
    grid = make_grid("quick")
    p = regularisation.plan(grid, Store(tmp_path))
    assert p.waiting == len(grid.regularisation.regularisers) * grid.seeds  # He waits for its rate search
    train = {(t.cell.method, t.cell.setting.get("reg")): t.cell.config["train"] for t in p.tasks}
    assert train[("fixup", "mixup")]["mixup_alpha"] == 0.7 and train[("fixup", "mixup")]["scalar_lr_mult"] == 0.1
    assert train[("batchnorm", "mixup")]["mixup_alpha"] == 0.2 and "scalar_lr_mult" not in train[("batchnorm", "mixup")]
    assert "mixup_alpha" not in train[("fixup", "none")] and train[("fixup", "mixup+cutout")]["cutout"] > 0


def test_best_stable_rate_ignores_diverged_runs():
    runs = {0.1: {"diverged": True, "train_loss": None}, 0.03: {"diverged": False, "train_loss": 0.2},
            0.01: {"diverged": False, "train_loss": 0.4}}
    assert best_stable_lr(runs)[0] == 0.03
    assert best_stable_lr({0.1: runs[0.1]})[0] == 0.1


def test_seeds_below_the_minimum_are_refused():
    with pytest.raises(ValueError, match="at least 2 seeds"):
        make_grid("quick", seeds=1)
    with pytest.raises(ValueError, match="at least 3 seeds"):
        make_grid("full", seeds=2)
    with pytest.raises(ValueError, match="--data-dir"):
        make_grid("quick", data="cifar10")


def test_tiny_reproduce_end_to_end(tmp_path, capsys):
    """`fixup reproduce --tiny` trains every study's cells with the real engine and writes the report;
    running it again finds every cell finished and redoes none."""
    from fixup.cli import main

    out = tmp_path / "tiny"
    assert main(["reproduce", "--tiny", "--out", str(out)]) == 0
    data = json.loads((out / "results.json").read_text())
    assert [c["claim"] for c in data["claims"]] == [c.id for c in CLAIMS]
    ran = {c["claim"] for c in data["claims"] if c["verdict"] != NOT_RUN}
    assert {"depth_fixup_trains_deep", "no_norm_needs_small_rate", "cifar10_resnet110", "ablation_zero_branch",
            "theory_fixed_update"} <= ran
    depth_summary = data["studies"]["depth"]["methods"]
    for method in ("fixup", "batchnorm", "he"):  # every seed is a finite accuracy or a failure named by outcome
        cells = depth_summary[method]["14"]["test_acc"]
        assert cells["planned"] == 2 and cells["n"] + sum(cells["failed"].values()) + cells["no_value"] == 2
    assert depth_summary["fixup"]["14"]["test_acc"]["failed"] == {}
    assert (out / "figures" / "depth.png").exists() and (out / "report.md").exists()
    # a finished cell's checkpoints are deleted; its logs stay
    assert not list(out.glob("cells/*/*/*/seed*/work/checkpoint*.pt*"))
    assert list(out.glob("cells/depth/*/*/seed*/work/metrics.jsonl"))
    first = data["timing"]["cells_run"]
    assert main(["reproduce", "--tiny", "--out", str(out), "--no-plots"]) == 0
    again = json.loads((out / "results.json").read_text())["timing"]
    assert again["cells_run"] == 0 and again["cells_resumed"] == first


def _tr_record(method: str, dropout: float, seed: int, bleu: float, nll: float) -> dict:
    return {"study": "translation", "method": method, "setting": {"dropout": dropout}, "seed": seed, "config": {},
            "result": {"diverged": False, "test_bleu": bleu, "valid_nll": nll, "copy_bleu": 1.0,
                       "word_for_word_bleu": 5.0}}


def test_translation_dropout_is_chosen_on_validation_not_test():
    from fixup.studies import translation

    grid = make_grid("quick")
    grid = replace(grid, translation=replace(grid.translation, dropouts=(0.1, 0.3), seeds=2))
    recs = [_tr_record(m, d, s, bleu, nll) for s in (0, 1) for m, d, bleu, nll in (
        ("fixup", 0.1, 40.0, 2.0), ("fixup", 0.3, 30.0 + s, 1.5),  # 0.3: better validation NLL, worse BLEU
        ("layernorm", 0.1, 31.0 + s, 1.4), ("layernorm", 0.3, 35.0, 1.6))]
    summary = translation.summarise(recs, grid)
    assert summary["chosen"]["fixup"]["dropout"] == 0.3 and summary["chosen"]["layernorm"]["dropout"] == 0.1
    row = translation.claims(summary, grid)[0]
    # the claim includes "the same dropout chosen for both": it is not, so the claim does not hold
    assert row.verdict != DIRECTION and "Fixup 0.3, LayerNorm 0.1" in row.ours
    weak = [_tr_record(m, d, s, 0.5, 2.0) for m in ("fixup", "layernorm") for s in (0, 1) for d in (0.1, 0.3)]
    row = translation.claims(translation.summarise(weak, grid), grid)[0]  # below the references: nothing learned
    assert row.verdict == UNRESOLVED and "reference BLEU" in row.why


def test_translation_gap_refutes_the_claim_only_after_the_trained_budget():
    from fixup.studies import translation

    quick = make_grid("quick")
    recs = [_tr_record(m, 0.1, s, bleu + s, 1.0) for s in range(5)
            for m, bleu in (("fixup", 25.0), ("layernorm", 45.0))]
    short = translation.claims(translation.summarise(recs, quick), quick)[0]
    # 300 updates of 1,024 tokens: a 20-point gap says how fast each starts, not how trained systems compare
    assert short.verdict == UNRESOLVED and "300 updates of 1,024 tokens" in short.why
    trained = replace(quick, translation=replace(quick.translation, max_updates=600, max_tokens=2048))
    assert translation.claims(translation.summarise(recs, trained), trained)[0].verdict == NOT_REPRODUCED
    # at the paper's dropouts the recipe's 600 updates are not the plateau: 1,800 are
    recs = [_tr_record(m, 0.3, s, bleu + s, 1.0) for s in range(5)
            for m, bleu in (("fixup", 25.0), ("layernorm", 45.0))]
    for updates, verdict in ((600, UNRESOLVED), (1800, NOT_REPRODUCED)):
        grid = replace(quick, translation=replace(quick.translation, max_updates=updates, max_tokens=2048,
                                                  dropouts=(0.3,)))
        row = translation.claims(translation.summarise(recs, grid), grid)[0]
        assert row.verdict == verdict and (updates == 1800 or "at dropout 0.3" in row.why)


def test_a_match_near_the_generated_tasks_ceiling_resolves_nothing():
    from fixup.studies import translation

    quick = make_grid("quick")
    trained = replace(quick, translation=replace(quick.translation, max_updates=600, max_tokens=2048))

    def row(fixup: float, layernorm: float):
        recs = [_tr_record(m, 0.1, s, bleu + 0.1 * s, 1.0) for s in range(5)
                for m, bleu in (("fixup", fixup), ("layernorm", layernorm))]
        return translation.claims(translation.summarise(recs, trained), trained)[0]

    near = row(98.6, 98.2)  # level, 1.2 BLEU below 100: the ceiling could hide any gap
    assert near.verdict == UNRESOLVED and "1.2 BLEU below the generated task's ceiling" in near.why
    assert "1.2 BLEU below the task's ceiling" in near.ours
    assert row(68.6, 68.2).verdict == DIRECTION  # the same match with room
    assert row(89.5, 89.7).verdict == DIRECTION  # means 89.7 and 89.9: 10.1 below the ceiling, room by the rule
    assert row(89.8, 89.9).verdict == UNRESOLVED  # 9.9 below
    assert row(93.0, 98.0).verdict == NOT_REPRODUCED  # a gap beyond the margin shows even at the ceiling


def test_the_headroom_is_measured_from_the_ceiling_the_cells_recorded():
    from fixup.studies import translation

    quick = make_grid("quick")
    trained = replace(quick, translation=replace(quick.translation, max_updates=600, max_tokens=2048))

    def row(ceiling: float | None):
        recs = [_tr_record(m, 0.1, s, bleu + 0.1 * s, 1.0) for s in range(5)
                for m, bleu in (("fixup", 85.6), ("layernorm", 85.5))]
        for r in recs:
            r["result"]["ceiling_bleu"] = ceiling
        summary = translation.summarise(recs, trained)
        assert summary["ceiling_bleu"] == ceiling
        return translation.claims(summary, trained)[0], translation.markdown(summary, trained)

    match, _ = row(None)  # older cells: read against 100, 14.2 below
    assert match.verdict == DIRECTION
    near, text = row(92.0)  # test words never seen in training cap this task at 92: 6.2 below
    assert near.verdict == UNRESOLVED and "6.2 BLEU below the generated task's ceiling (92)" in near.why
    assert "hard_5k leaves room" in near.why  # on another task, the one with room is named
    on_5k = replace(trained, translation=replace(trained.translation, extra={
        **trained.translation.extra, "synthetic_task": "hard", "synthetic_train": 5000}))
    recs = [_tr_record(m, 0.1, s, 85.5 + 0.1 * s, 1.0) for s in range(5) for m in ("fixup", "layernorm")]
    for r in recs:
        r["result"]["ceiling_bleu"] = 92.0
    from fixup.studies.evidence import Cells

    chosen = translation.summarise(recs, on_5k)["chosen"]
    fx, ln = (Cells.from_dict(chosen[m]["test_bleu"]) for m in ("fixup", "layernorm"))
    there = translation._no_headroom(on_5k, fx, ln, 92.0)
    assert "6.3 BLEU below" in there and "leaves room" not in there  # the task with room does not name itself
    assert "the task's ceiling (every word seen in training translated) 92.00" in text


def test_a_study_keeps_its_finished_cells_checkpoints_when_asked(tmp_path):
    from fixup.cli import main

    out = tmp_path / "kept"
    assert main(["study", "depth", "--tiny", "--out", str(out), "--no-plots", "--keep-finished-checkpoints"]) == 0
    finished = list(out.glob("cells/depth/*/*/seed*/cell_result.json"))
    assert finished and all((f.parent / "work" / "checkpoint.pt").is_file() for f in finished)
