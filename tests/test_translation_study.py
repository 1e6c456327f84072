"""The translation study at its plateau (the deep tier) and its learning curves: the grid entry, the curves over
seeds in the summary, the report's table and figure, and a real cell that returns its curve."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from fixup.studies import make_grid, translation
from fixup.studies.store import Store
from fixup.translation.task import RECIPES, translation_config


def test_the_deep_tier_runs_the_plateau_recipe_with_the_papers_dropout_search_and_five_seeds(tmp_path):
    grid = make_grid("deep")
    g, tiny = grid.translation, RECIPES["tiny"]
    # the tiny recipe trained 3x as long: at the paper's dropouts it has not flattened by its own 600 updates
    assert (g.model, g.max_updates, g.warmup_steps, g.lr) == (tiny["model"], 3 * tiny["max_updates"],
                                                              tiny["warmup_steps"], tiny["lr"])
    assert g.max_tokens == tiny["extra"]["max_tokens"]
    assert g.max_updates * g.max_tokens >= translation.TRAINED_TOKENS_HIGH_DROPOUT
    assert translation._training_limit(grid) == ""  # a gap at this budget can refute the claim
    assert g.dropouts == (0.3, 0.4, 0.5, 0.6) and g.seeds == 5 and {"fixup", "layernorm"} <= set(g.methods)
    assert g.extra["eval_updates"] > 0 and g.extra["bleu_limit"] > 0  # the learning curves are recorded
    tasks = translation.plan(grid, Store(tmp_path)).tasks
    assert len(tasks) == len(g.methods) * 4 * 5
    for t in tasks:
        config = translation_config(**t.cell.config["train"])  # what the cell trains: a valid config
        assert config.extra["eval_updates"] == g.extra["eval_updates"] and config.optimizer == "adamw"
        assert config.dropout == t.cell.setting["dropout"] and config.grad_clip == 0.0
    # the protocol says how the scalars were trained, from the recipe the cells use
    row = translation.claims(translation.summarise([], grid), grid)[0]
    mult = translation_config().scalar_lr_mult
    assert ("full rate" in row.protocol["scalars"]) == (mult == 1) and "adamw" in row.protocol["scalars"]
    assert mult == 1 or f"{mult:g}x the rate" in row.protocol["scalars"]


def _record(method: str, dropout: float, seed: int, curve: list[tuple[int, float, float]], *,
            diverged: bool = False) -> dict:
    result = {"diverged": diverged, "test_bleu": None if diverged else 90.0 + seed, "valid_nll": 1.0 + dropout,
              "copy_bleu": 0.0, "word_for_word_bleu": 4.0,
              "curve": [{"step": s, "valid_nll": nll, "valid_bleu": bleu} for s, nll, bleu in curve]}
    if diverged:
        result["outcome"] = "diverged"
    return {"study": "translation", "method": method, "setting": {"dropout": dropout}, "seed": seed, "config": {},
            "result": result}


@pytest.fixture
def curves_grid():
    grid = make_grid("deep")
    return replace(grid, translation=replace(grid.translation, dropouts=(0.3, 0.5), seeds=3))


def test_curves_are_mean_and_std_over_seeds_at_each_update_for_the_chosen_dropout(curves_grid):
    recs = [_record(m, d, s, [(50, 3.0 - s, 10.0 * s), (100, 2.0 - s / 2, 20.0 + s)]) for m in ("fixup", "layernorm")
            for d in (0.3, 0.5) for s in range(3)]
    recs.append(_record("layernorm", 0.3, 3, [(50, 9.0, 0.0)], diverged=True))  # counted failed, not averaged
    summary = translation.summarise(recs, curves_grid)
    curve = summary["chosen"]["fixup"]["curve"]
    assert summary["chosen"]["fixup"]["dropout"] == 0.3  # lower validation NLL
    assert [p["step"] for p in curve] == [50, 100]
    assert curve[0]["valid_nll"]["values"] == [3.0, 2.0, 1.0] and curve[1]["valid_bleu"]["values"] == [20.0, 21.0, 22.0]
    ln = summary["chosen"]["layernorm"]["curve"][0]["valid_bleu"]
    assert sorted(ln["values"]) == [0.0, 10.0, 20.0] and ln["failed"] == {"diverged": 1}
    text = translation.markdown(summary, curves_grid)
    assert "| updates | Fixup valid BLEU | LayerNorm valid BLEU | Fixup valid NLL | LayerNorm valid NLL |" in text
    assert "| 100 | 21.0 ± 1.0" in text and "every 50 updates" in text and "first 200 sentences" in text


def test_the_curve_figure_draws_what_the_summary_says(curves_grid, tmp_path):
    pytest.importorskip("matplotlib")
    recs = [_record(m, 0.3, s, [(50, 3.0 + s, 5.0 * s), (100, 2.0, 30.0 + 2 * s)]) for m in ("fixup", "layernorm")
            for s in range(3)]
    summary = translation.summarise(recs, replace(curves_grid, translation=replace(curves_grid.translation,
                                                                                   dropouts=(0.3,))))
    paths = translation.figures(summary, tmp_path)
    assert [p.name for p in paths] == ["translation.png", "translation_curves.png"]
    drawn = json.loads((tmp_path / "translation_curves.data.json").read_text())
    fixup_bleu = drawn["series"]["Fixup, dropout 0.3"]["valid_bleu"]
    assert [p["step"] for p in fixup_bleu] == [50, 100]
    assert [p["mean"] for p in fixup_bleu] == pytest.approx([5.0, 32.0]) and fixup_bleu[1]["n"] == 3
    assert fixup_bleu[1]["std"] == pytest.approx(2.0)
    assert drawn["series"]["LayerNorm, dropout 0.3"]["valid_nll"][0]["mean"] == pytest.approx(4.0)


def test_a_cell_returns_its_learning_curve(tmp_path):
    grid = make_grid("tiny")
    g = grid.translation
    grid = replace(grid, device="cpu", translation=replace(g, max_updates=6, extra={**g.extra, "bleu_limit": 5,
                                                                                    "eval_updates": 2}))
    task = next(t for t in translation.plan(grid, Store(tmp_path / "store")).tasks if t.cell.method == "fixup")
    result = translation.run_cell(task.cell, tmp_path / "cell")
    assert [p["step"] for p in result["curve"]] == [2, 4, 6]
    assert all(p["valid_nll"] > 0 and p["valid_bleu"] is not None for p in result["curve"])
    assert result["curve"][-1]["valid_nll"] == pytest.approx(result["valid_nll"])  # the last point is the final one


def test_a_partly_run_search_says_which_side_is_missing_and_takes_no_difference():
    """Early in the deep tier only some cells have finished: the row names the side without a cell and the
    dropout not yet chosen for it, and prints no difference (never ``nan``)."""
    grid = make_grid("deep")
    summary = translation.summarise([_record("fixup", 0.3, 0, [(50, 2.0, 10.0)])], grid)
    row = translation.claims(summary, grid)[0]
    assert "nan" not in row.ours and "no difference: LayerNorm has no finished cell" in row.ours
    assert "not yet chosen for LayerNorm (no finished cell)" in row.ours and "no search" not in row.ours
    assert row.verdict == "not run"
    done = [_record(m, 0.3, s, [(50, 2.0, 10.0)]) for m in ("fixup", "layernorm") for s in range(2)]
    row = translation.claims(translation.summarise(done, grid), grid)[0]
    assert "LayerNorm - Fixup 0.00 ± 3.04 (95%)" in row.ours  # seeds 90 and 91 a side: t(2) * sqrt(2 * 0.5 / 2)
    assert "T-Fixup — (n=0 of 5; not finished 5 of 5): no difference, T-Fixup has no finished cell" in row.ours
    assert "dropout chosen on validation NLL: Fixup 0.3, LayerNorm 0.3" in row.ours


def test_the_hard_task_grid_searches_low_dropouts_with_every_transformer_method(tmp_path):
    grid = make_grid("deep", translation_task="hard")
    g = grid.translation
    assert g.extra["synthetic_task"] == "hard" and g.max_updates == 7200 and g.seeds == 5
    assert g.dropouts == (0.1, 0.2, 0.3) and set(g.methods) == {"fixup", "layernorm", "t_fixup", "dyt"}
    first = translation.plan(grid, Store(tmp_path))
    tasks = first.tasks  # the search on seed 0; seeds 1-4 wait for each method's chosen dropout
    assert len(tasks) == 4 * 3 and {t.cell.seed for t in tasks} == {0} and first.waiting == 4 * 4
    for t in tasks:
        config = translation_config(**t.cell.config["train"])
        assert config.extra["synthetic_task"] == "hard" and config.max_updates == 7200
        assert (config.norm == "dyt") == (t.cell.method == "dyt")
    quick = make_grid("deep").translation  # the quick task's grid is untouched
    assert "synthetic_task" not in quick.extra and quick.dropouts == (0.3, 0.4, 0.5, 0.6)
    assert make_grid("tiny", translation_task="hard").translation.extra["synthetic_task"] == "hard"
    with pytest.raises(ValueError, match="translation_task must be one of quick, hard"):
        make_grid("deep", translation_task="iwslt")


def test_dynamic_tanh_trains_in_its_authors_pre_norm_layout_and_the_others_as_before(tmp_path):
    """DyT stands where a pre-norm Transformer's LayerNorms stand (its authors' layout): built post-norm it does not
    learn this recipe (transformer.POST_NORM_DYT), which the hard_5k grid's first DyT cells showed (2-4 test BLEU)."""
    import warnings

    from fixup import create_model
    from fixup.nn import DyT

    for task in ("hard", "hard_5k"):
        tasks = translation.plan(make_grid("deep", translation_task=task), Store(tmp_path / task)).tasks
        assert {t.cell.method for t in tasks} == {"fixup", "layernorm", "t_fixup", "dyt"}
        for t in tasks:
            config = translation_config(**t.cell.config["train"])
            assert config.extra.get("pre_norm", False) == (t.cell.method == "dyt"), t.cell.key
            if t.cell.method == "dyt":
                with warnings.catch_warnings():
                    warnings.simplefilter("error")  # no warning that the layout is not its authors'
                    model = create_model(config.model, norm=config.norm, src_vocab=32, tgt_vocab=32,
                                         pre_norm=config.extra["pre_norm"])
                assert isinstance(model.encoder_norm, DyT) and isinstance(model.decoder_norm, DyT)
                assert not model.init_report.warnings


def test_the_5k_task_is_the_hard_one_with_fewer_pairs_in_its_own_folder(tmp_path):
    """hard_5k: the hard task's grammar and vocabulary, 5,000 training pairs; its deep grid is the hard one's but for
    the pairs: the same cells by name, each with another config (a store refuses to mix them)."""
    from fixup.cli import build_parser
    from fixup.studies.grid import TRANSLATION_TASKS

    hard, small = (make_grid("deep", translation_task=t).translation for t in ("hard", "hard_5k"))
    assert small.extra == {**hard.extra, "synthetic_train": 5000} and small.max_updates == 7200
    assert replace(small, extra=hard.extra) == hard
    quick = make_grid("quick", translation_task="hard_5k").translation
    assert quick.extra["synthetic_task"] == "hard" and quick.extra["synthetic_train"] == 5000
    assert quick.max_updates == make_grid("quick").translation.max_updates
    cells = [{t.cell.key: t.cell.config for t in translation.plan(make_grid("deep", translation_task=t),
                                                                   Store(tmp_path / t)).tasks}
             for t in ("hard", "hard_5k")]
    assert cells[0].keys() == cells[1].keys()  # the same cells by name, which a store refuses to mix: ...
    assert all(cells[0][k] != cells[1][k] for k in cells[0])  # ... each was made with another config
    study = build_parser()._subparsers._group_actions[0].choices["study"]
    task = next(a for a in study._actions if a.dest == "translation_task")  # the command offers every task
    assert tuple(task.choices) == tuple(TRANSLATION_TASKS)


def test_on_the_hard_task_the_plateau_is_read_from_each_systems_curve():
    """No budget is known for the hard task: a claim system whose greedy validation BLEU still rose by more than a
    point over the last quarter of its updates is not trained, and the verdict says so; flat curves are judged."""
    grid = make_grid("deep", translation_task="hard")
    grid = replace(grid, translation=replace(grid.translation, dropouts=(0.1,), seeds=3))
    flat = [(1800, 2.0, 55.0), (5400, 1.5, 60.0), (7200, 1.5, 60.5)]
    rising = [(1800, 2.0, 40.0), (5400, 1.5, 50.0), (7200, 1.4, 53.0)]
    done = [_record("fixup", 0.1, s, flat) for s in range(3)]
    row = translation.claims(translation.summarise(done + [_record("layernorm", 0.1, s, rising) for s in range(3)],
                                                   grid), grid)[0]
    assert "LayerNorm's greedy validation BLEU still rose 3.0 from update 5,400 to 7,200" in row.why
    assert "per doubling" not in row.why  # two points in the second half: too few to fit a pace
    assert "Fixup's greedy" not in row.why and row.verdict == "cannot be resolved at this scale"
    assert "BLEU below the task's ceiling" in row.ours  # _record's test BLEU: 90-92, so 8.0 below
    row = translation.claims(translation.summarise(done + [_record("layernorm", 0.1, s, flat) for s in range(3)],
                                                   grid), grid)[0]
    assert "still rose" not in row.why and "plateau" not in row.why


def test_a_further_row_short_of_its_plateau_decides_nothing_as_the_claims_own_row_does():
    """The claim's rule whole for a further row (T-Fixup) too: where its greedy validation BLEU (or LayerNorm's)
    still rises over the last quarter, its difference from LayerNorm is given and decides nothing."""
    grid = make_grid("deep", translation_task="hard")
    grid = replace(grid, translation=replace(grid.translation, dropouts=(0.1,), seeds=3))
    flat = [(1800, 2.0, 55.0), (5400, 1.5, 60.0), (7200, 1.5, 60.5)]
    rising = [(1800, 2.0, 40.0), (5400, 1.5, 50.0), (7200, 1.4, 53.0)]

    def further_row(t_fixup: list, layernorm: list) -> str:
        records = [_record(m, 0.1, s, curve) for m, curve in (("fixup", flat), ("layernorm", layernorm),
                                                                ("t_fixup", t_fixup)) for s in range(3)]
        for r in records:  # 60-62 BLEU: far below the ceiling, so that only the plateau can stop a verdict
            r["result"]["test_bleu"] -= 30
        return translation.claims(translation.summarise(records, grid), grid)[0].ours.split("further row: T-Fixup")[1]

    text = further_row(rising, flat)
    assert "cannot decide here: T-Fixup's greedy validation BLEU still rose 3.0 from update 5,400" in text
    assert "LayerNorm's greedy" not in text
    assert "cannot decide here: LayerNorm's greedy validation BLEU still rose 3.0" in further_row(flat, rising)
    assert "cannot decide here" not in further_row(flat, flat) and "by the same rule" in further_row(flat, flat)


def test_a_cell_trains_on_the_hard_task(tmp_path):
    grid = make_grid("tiny", translation_task="hard")
    grid = replace(grid, device="cpu", translation=replace(grid.translation, max_updates=2))
    task = next(t for t in translation.plan(grid, Store(tmp_path / "store")).tasks if t.cell.method == "fixup")
    result = translation.run_cell(task.cell, tmp_path / "cell")
    assert result["test_bleu"] is not None and result["word_for_word_bleu"] is not None
    assert 0 < result["ceiling_bleu"] <= 100  # the task's own ceiling, recorded with the cell
    from fixup.data.synthetic_translation import synthetic_task

    written = json.loads((tmp_path / "cell" / "data" / "task.json").read_text())["config"]  # what the cell generated
    assert written["nouns"] == synthetic_task("hard").nouns != synthetic_task("quick").nouns


def test_a_search_on_seed_0_plans_the_other_seeds_at_each_methods_chosen_dropout(tmp_path):
    """search_seeds=1: every dropout on seed 0, then seeds 1.. at the dropout of lowest validation NLL, per method;
    a method whose search has not finished keeps its other seeds waiting, and the summary chooses as the plan did."""
    grid = make_grid("deep", translation_task="hard")
    grid = replace(grid, translation=replace(grid.translation, methods=("fixup", "layernorm"), seeds=3))
    store = Store(tmp_path)
    nll = {("fixup", 0.1): 2.0, ("fixup", 0.2): 1.5, ("fixup", 0.3): 1.8, ("layernorm", 0.1): 1.0,
           ("layernorm", 0.2): None, ("layernorm", 0.3): 1.2}  # LayerNorm at 0.2 diverged
    for task in translation.plan(grid, store).tasks:
        c = task.cell
        if c.method == "layernorm" and c.setting["dropout"] == 0.3:
            continue  # LayerNorm's search has not finished
        v = nll[c.method, c.setting["dropout"]]
        store.start(c)
        store.finish(c, {"outcome": "completed" if v else "diverged", "diverged": v is None, "valid_nll": v,
                         "test_bleu": 50.0 if v else None, "copy_bleu": 0.0, "word_for_word_bleu": 3.0}, 1.0)
    p = translation.plan(grid, store)
    todo = [(t.cell.method, t.cell.setting["dropout"], t.cell.seed) for t in p.tasks if not store.load(t.cell)]
    assert todo == [("layernorm", 0.3, 0), ("fixup", 0.2, 1), ("fixup", 0.2, 2)] and p.waiting == 2
    c = next(t.cell for t in p.tasks if t.cell.method == "layernorm" and t.cell.setting["dropout"] == 0.3)
    store.start(c)
    store.finish(c, {"outcome": "completed", "diverged": False, "valid_nll": 1.2, "test_bleu": 50.0,
                     "copy_bleu": 0.0, "word_for_word_bleu": 3.0}, 1.0)
    p = translation.plan(grid, store)
    assert p.waiting == 0 and [(t.cell.method, t.cell.setting["dropout"]) for t in p.tasks if t.cell.seed > 0] == \
        [("fixup", 0.2), ("layernorm", 0.1)] * 2
    summary = translation.summarise(store.records("translation"), grid)
    assert {m: e["dropout"] for m, e in summary["chosen"].items()} == {"fixup": 0.2, "layernorm": 0.1}
    assert summary["table"]["fixup"]["0.1"]["test_bleu"]["planned"] == 1  # an unchosen dropout: its search seed
    assert summary["table"]["fixup"]["0.2"]["test_bleu"]["planned"] == 3
    assert "dropout chosen on validation NLL of seed 0 (the other seeds at the chosen dropout)" in \
        translation.claims(summary, grid)[0].ours


def test_a_rising_curve_names_its_pace_per_doubling_of_updates():
    """A curve growing like log(updates) rises by the same amount over every last quarter; the verdict names that
    pace (BLEU per doubling, fitted over the second half), which a longer budget would keep adding."""
    grid = make_grid("deep", translation_task="hard")
    grid = replace(grid, translation=replace(grid.translation, dropouts=(0.1,), seeds=3))
    steps = range(300, 7201, 300)
    log_like = [(s, 1.0, 10.0 + 8.0 * math.log2(s)) for s in steps]  # 8 BLEU per doubling, exactly
    flat = [(s, 1.0, 60.0) for s in steps]
    records = [_record("fixup", 0.1, s, flat) for s in range(3)] + [_record("layernorm", 0.1, s, log_like)
                                                                     for s in range(3)]
    row = translation.claims(translation.summarise(records, grid), grid)[0]
    assert "LayerNorm's greedy validation BLEU still rose 3.3 from update 5,400 to 7,200, 8.0 per doubling" in row.why
    assert row.verdict == "cannot be resolved at this scale"
