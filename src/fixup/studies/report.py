"""The report of a ``fixup reproduce`` run: ``report.md`` (claims table, each study's tables and figures)
and ``results.json`` (the same, as data).

Every claim of :data:`fixup.studies.paper.CLAIMS` gets exactly one row, whether or not it ran.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._io import write_json, write_text
from . import paper
from .base import StudyOutput
from .claims import NOT_RUN, ClaimRow
from .grid import Grid
from .runner import format_seconds

__all__ = ["claim_rows", "environment", "write_report"]


def claim_rows(outputs: Mapping[str, StudyOutput], skipped: Mapping[str, str] | None = None) -> list[ClaimRow]:
    """One row per claim of the paper, in the paper's order; claims without a study are ``not run``.

    ``skipped`` gives the reason a study was left out of this run (by the mode), where there is one.
    """
    rows = []
    for c in paper.CLAIMS:
        if c.study is None:
            rows.append(ClaimRow(c.id, "", "", NOT_RUN, c.why_not))
        elif c.study not in outputs:
            why = (skipped or {}).get(c.study, f"the {c.study} study was not part of this run")
            rows.append(ClaimRow(c.id, "", "", NOT_RUN, why))
        else:
            found = [r for r in outputs[c.study].claims if r.claim == c.id]
            rows.append(found[0] if found else ClaimRow(c.id, "", "", NOT_RUN, f"the {c.study} study gave no row"))
    return rows


def environment() -> dict[str, Any]:
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform(),
            "cpu_threads": torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def _data(grid: Grid, outputs: Mapping[str, Any]) -> str:
    """The data and seeds of the studies in ``outputs``: the image studies' and, apart, the translation study's."""
    parts = []
    if not outputs or any(name != "translation" for name in outputs):
        # a study that sets its own seeds says so beside the grid's
        own = {"regularisation": {grid.regularisation.seeds} - {0},
               "ablation": {r.seeds or grid.seeds for r in grid.ablation.at_depth}}
        apart = [f"{name} {' and '.join(map(str, sorted(n)))}" for name, n in own.items()
                 if name in outputs and n and n != {grid.seeds}]
        parts.append(f"{grid.describe_data()}, {grid.seeds} seeds per cell"
                     + (f" ({'; '.join(apart)})" if apart else ""))
    if "translation" in outputs:
        t = grid.translation
        parts.append(f"translation: {t.data_dir or 'the embedded generated task'}, {t.seeds or grid.seeds} seeds "
                     "per cell")
    return "; ".join(parts)


def _threads(n: int) -> str:
    return f"{n} CPU thread{'s' if n != 1 else ''}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def write_report(out: Path, grid: Grid, outputs: Mapping[str, StudyOutput], titles: Mapping[str, str], *,
                 timing: Mapping[str, Any], command: str = "", skipped: Mapping[str, str] | None = None
                 ) -> tuple[Path, Path]:
    """Write ``out/report.md`` and ``out/results.json``; return their paths."""
    from .registry import STUDIES

    rows = claim_rows(outputs, skipped)  # results.json: every claim
    # report.md: every claim for a run of every study its mode runs; a run of chosen studies shows theirs only
    every = all(name in outputs for name in STUDIES if name not in (skipped or {}))
    shown = rows if every else [r for r in rows if paper.claim(r.claim).study in outputs]
    left_out = len(rows) - len(shown)
    env = environment()
    counts = {v: sum(r.verdict == v for r in shown) for v in dict.fromkeys(r.verdict for r in shown)}
    md = [f"# Fixup: the paper's claims, reproduced ({grid.mode} mode)", "",
          f"Data: {_data(grid, outputs)}; every figure is mean ± std over seeds with n. Paper: Zhang, Dauphin & "
          "Ma, *Fixup Initialization: Residual Learning Without Normalization*, "
          "ICLR 2019.", "",
          *([f"Command: `{command}`", ""] if command else []),
          ("Time: no cell run (the report was rewritten from the store's finished cells); "
           if timing.get("report_only") else
           f"Time: {format_seconds(timing.get('seconds'))} for {timing.get('cells_run', 0)} cells run "
           f"({timing.get('cells_resumed', 0)} found finished from an earlier run"
           + ("; this report rewritten from the store since" if timing.get("rewritten") else "") + "); ")
          + (f"{timing['cells_finished']} cells finished in all, {format_seconds(timing['cell_seconds'])} of "
             "cell time (a worker's wall time per cell, summed"
             + (f"; {timing['cells_untimed']} cells have no recorded time" if timing.get("cells_untimed") else "")
             + "); " if timing.get("cells_finished") else "")
          + f"torch {env['torch']}, {env['cuda'] or _threads(env['cpu_threads'])}.", "",
          "## Claims", "",
          "Verdicts: " + ", ".join(f"{n} {v}" for v, n in counts.items()) + ". *Direction reproduced at reduced "
          "scale* means the claimed effect shows, beyond the seeds' spread, on a smaller problem than the "
          "paper's; each row says the rule it was judged by."
          + (f" The paper's {left_out} further claims belong to studies this run did not include (`fixup "
             "reproduce` reports every claim; results.json lists them as not run)." if left_out else ""), "",
          "| claim | paper (source) | ours | scale | verdict |", "|---|---|---|---|---|"]
    for row in shown:
        c = paper.claim(row.claim)
        why = f" ({row.why})" if row.why else ""
        md.append(f"| {_cell(c.statement)} | {_cell(c.paper_text())} ({_cell(c.sources())}) | {_cell(row.ours)} | "
                  f"{_cell(row.scale)} | **{row.verdict}**{_cell(why)} |")
    for name, output in outputs.items():
        md += ["", f"## {titles.get(name, name)}", "", output.markdown]
        for fig in output.figures:
            md += ["", f"![{fig.stem}]({fig.relative_to(out).as_posix()})"]
    md.append("")
    report = out / "report.md"
    write_text(report, "\n".join(md))
    results = out / "results.json"
    write_json(results, {
        "mode": grid.mode, "grid": grid.to_dict(), "command": command, "timing": dict(timing),
        "environment": env, "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "claims": [{**r.to_dict(), "statement": paper.claim(r.claim).statement,
                    "paper": paper.claim(r.claim).paper_text(), "source": paper.claim(r.claim).sources()}
                   for r in rows],
        "studies": {name: o.summary for name, o in outputs.items()},
        "figures": {name: [f.relative_to(out).as_posix() for f in o.figures] for name, o in outputs.items()},
    })
    return report, results
