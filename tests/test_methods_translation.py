"""T-Fixup as a further row of the translation study: the same cells, its own recipe (no warm-up), the same rules."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from fixup.studies.grid import make_grid
from fixup.studies.store import Store
from fixup.studies.translation import STUDY, TRAINED_TOKENS_HIGH_DROPOUT, claims, markdown, plan, summarise
from fixup.translation.task import translation_config


def _grid(methods: tuple[str, ...] = ("fixup", "layernorm", "t_fixup"), seeds: int = 2):
    grid = make_grid("tiny")
    return dataclasses.replace(grid, translation=dataclasses.replace(grid.translation, methods=methods, seeds=seeds))


def test_t_fixup_runs_in_the_same_cells_with_its_own_recipe(tmp_path: Path) -> None:
    grid = _grid()
    cells = [t.cell for t in plan(grid, Store(tmp_path)).tasks]
    by_method = {m: [c for c in cells if c.method == m] for m in grid.translation.methods}
    assert {m: len(c) for m, c in by_method.items()} == {"fixup": 2, "layernorm": 2, "t_fixup": 2}
    assert {(c.setting["dropout"], c.seed) for c in by_method["t_fixup"]} == \
        {(c.setting["dropout"], c.seed) for c in by_method["fixup"]}
    configs = {m: translation_config(**c[0].config["train"]) for m, c in by_method.items()}
    assert (configs["t_fixup"].norm, configs["t_fixup"].init) == ("none", "t_fixup")
    # no warm-up; the inverse square-root decay from the first step, with the others' warm-up as its period
    t_fixup = configs["t_fixup"]
    assert (t_fixup.warmup_steps, t_fixup.schedule, t_fixup.decay_period) == (0, "inverse_sqrt",
                                                                             grid.translation.warmup_steps)
    for m in ("fixup", "layernorm"):  # the other rows keep the grid's warm-up and schedule
        assert configs[m].norm == m and configs[m].warmup_steps == grid.translation.warmup_steps
        assert configs[m].schedule == "inverse_sqrt"
    for field in ("model", "max_updates", "lr", "dropout", "seed", "max_tokens"):
        assert getattr(configs["t_fixup"], field, None) == getattr(configs["fixup"], field, None)


def _records(bleu: dict[str, list[float | None]]) -> list[dict]:
    return [{"method": m, "setting": {"dropout": 0.1}, "seed": s,
             "result": {"outcome": "completed" if v is not None else "diverged", "test_bleu": v,
                        "valid_nll": 1.0 if v is not None else None, "copy_bleu": 2.0, "word_for_word_bleu": 4.0}}
            for m, vals in bleu.items() for s, v in enumerate(vals)]


@pytest.mark.parametrize(("t_fixup", "verdict"), [([90.1, 90.3], "within 1 BLEU"), ([80.0, 80.2], "beyond 1 BLEU")])
def test_the_further_row_is_judged_against_layernorm_by_the_claims_rule(t_fixup: list[float], verdict: str) -> None:
    grid = _grid()
    summary = summarise(_records({"fixup": [90.0, 90.2], "layernorm": [90.1, 90.3], "t_fixup": t_fixup}), grid)
    row = claims(summary, grid)[0]
    assert row.claim == "translation_iwslt" and "further row: T-Fixup" in row.ours and verdict in row.ours
    assert "| T-Fixup |" in markdown(summary, grid)


@pytest.mark.parametrize(("level", "decides"), [(95.0, False), (60.0, True)])
def test_a_further_rows_match_near_the_ceiling_is_not_a_match(level: float, decides: bool) -> None:
    grid = _grid()  # a generated task: its ceiling is 100 BLEU; trained past the budget after which it plateaus
    g = grid.translation
    grid = dataclasses.replace(grid, translation=dataclasses.replace(
        g, max_updates=-(-TRAINED_TOKENS_HIGH_DROPOUT // g.max_tokens)))
    bleu = [level, level + 0.2]
    row = claims(summarise(_records({"fixup": bleu, "layernorm": bleu, "t_fixup": bleu}), grid), grid)[0]
    further = row.ours.split("further row: T-Fixup")[1]
    assert "within 1 BLEU" in further and ("cannot decide here" not in further) == decides


def test_a_failed_t_fixup_seed_counts_as_failed_and_a_grid_without_it_has_no_further_row() -> None:
    grid = _grid()
    summary = summarise(_records({"fixup": [90.0, 90.2], "layernorm": [90.1, 90.3], "t_fixup": [90.0, None]}), grid)
    assert summary["table"]["t_fixup"]["0.1"]["runs"][1]["outcome"] == "diverged"
    assert summary["table"]["t_fixup"]["0.1"]["test_bleu"]["n"] == 1
    plain = _grid(("fixup", "layernorm"))
    rows = claims(summarise(_records({"fixup": [90.0, 90.2], "layernorm": [90.1, 90.3]}), plain), plain)
    assert "further row" not in rows[0].ours


def test_the_full_and_deep_grids_run_t_fixup_and_the_quick_one_stays_at_two_rows() -> None:
    assert "t_fixup" in make_grid("full").translation.methods
    assert "t_fixup" in make_grid("deep").translation.methods
    assert make_grid("quick").translation.methods == ("fixup", "layernorm")  # under 8 minutes on 2 cores
    assert STUDY.name == "translation"
