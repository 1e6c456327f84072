"""`fixup compare`: one model under several methods and seeds; the table's figures are the runs' own results."""

from __future__ import annotations

import json
import math
import re
import statistics

import pytest

from fixup.cli import main as cli_main
from fixup.studies.compare import CompareConfig, compare

TINY = ["compare", "resnet_cifar", "--depth", "8", "--epochs", "1", "--methods", "fixup,skipinit", "--seeds", "0,1",
        "--jobs", "1"]


def _rows(table: str) -> dict[str, list[str]]:
    """The method rows of the markdown table: method -> its cells."""
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0] not in ("method", "---"):
            rows[cells[0]] = cells[1:]
    return rows


def test_compare_table_equals_the_runs_results_and_reruns_resume(tmp_path, capsys) -> None:
    out = tmp_path / "cmp"
    assert cli_main([*TINY, "--out", str(out), "--json", str(tmp_path / "figures.json")]) == 0
    printed = capsys.readouterr().out
    table = (out / "compare.md").read_text()
    assert table in printed
    rows = _rows(table)
    assert list(rows) == ["fixup", "skipinit"]
    for method, cells in rows.items():
        accs = []
        for seed, text in zip((0, 1), cells):
            # The engine's own result file of that run, not the cell's summary of it.
            run = json.loads((out / "cells" / "compare" / method / "depth=8,model=resnet_cifar" / f"seed{seed}" /
                              "work" / "result.json").read_text())
            assert run["outcome"]["status"] == "completed" and run["config"]["run"]["seed"] == seed
            assert run["config"]["network"]["model"] == "resnet_cifar" and run["config"]["network"]["depth"] == 8
            acc = run["final"]["test_acc"]
            assert text == f"{100 * acc:.1f}"
            accs.append(100 * acc)
        mean, std = statistics.mean(accs), statistics.stdev(accs)
        assert cells[2] == f"{mean:.1f} ± {std:.1f}% (n=2)"
    summary = json.loads((out / "compare.json").read_text())
    assert json.loads((tmp_path / "figures.json").read_text()) == summary
    assert summary["methods"]["skipinit"]["runs"][0]["scalars"][0]["kind"] == "gate"  # each run's final scalars
    assert {r["kind"] for r in summary["methods"]["fixup"]["runs"][0]["scalars"]} == {"scale", "bias", "stream_bias"}
    drawn = json.loads((out / "compare.data.json").read_text())  # what the plot drew: the same accuracies
    for method, cells in rows.items():
        assert [f"{y:.1f}" for y in drawn["methods"][method]["points"]] == cells[:2]
    # A second call trains nothing and writes the same table.
    result = compare(CompareConfig("resnet_cifar", ("fixup", "skipinit"), (0, 1), depth=8, epochs=1), out,
                     plots=False)
    assert result.ran == [] and len(result.resumed) == 4 and result.table == table


def test_failed_runs_are_named_and_left_out_of_the_mean(tmp_path) -> None:
    config = CompareConfig("resnet_cifar", ("fixup",), (0, 1), depth=8, epochs=1,
                           train={"lr": 1e4, "clip": "none", "max_updates": 4})
    result = compare(config, tmp_path / "div", plots=False)
    cells = _rows(result.table)["fixup"]
    assert all(re.fullmatch(r"diverged \(epoch 1, step \d\)", c) for c in cells[:2]), cells
    assert cells[2] == "— (n=0 of 2; diverged 2 of 2)"
    stat = result.summary["methods"]["fixup"]["test_acc"]
    assert stat["mean"] is None and stat["failed"] == {"diverged": 2}
    assert "lr=10000.0" in result.table and not any(math.isfinite(r["test_acc"] or math.nan)
                                                     for r in result.summary["methods"]["fixup"]["runs"])


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"model": "resnt"}, "unknown model 'resnt'"),
    ({"methods": ("fixpu",)}, "unknown method 'fixpu'"),
    ({"seeds": (0, 0)}, "seeds lists a value twice"),
    ({"train": {"seed": 3}}, "seed are compare's own"),
    ({"train": {"nosuch": 1}}, "nosuch"),
    ({"train": {"lr": -1.0}}, "lr must be >= 0"),
])
def test_bad_options_are_refused_before_any_run(tmp_path, kwargs, message) -> None:
    fields = {"model": "resnet_cifar", "methods": ("fixup",), "seeds": (0,), "depth": 8, "epochs": 1, **kwargs}
    with pytest.raises(ValueError, match=re.escape(message)):
        compare(CompareConfig(**fields), tmp_path / "bad")
    assert not (tmp_path / "bad").exists()
