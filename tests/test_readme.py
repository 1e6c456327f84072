"""The README's Python examples run as written and give the values their comments state."""

from __future__ import annotations

import ast
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

import fixup
from fixup.report import InitReport

README = Path(__file__).parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
# A comment that states a value: numbers separated by commas, a trailing "..." meaning "truncated here".
STATED = re.compile(r"#\s*(-?\d+(?:\.\d+)?(?:\.\.\.)?(?:\s*,\s*-?\d+(?:\.\d+)?(?:\.\.\.)?)*)\s*$")


def _run(code: str) -> tuple[dict[str, Any], dict[int, Any]]:
    """Run a block; return its namespace and the value of each top-level expression, by line (1-based)."""
    tree = ast.parse(code)
    body: list[ast.stmt] = []
    for stmt in tree.body:
        is_print = (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
                    and isinstance(stmt.value.func, ast.Name) and stmt.value.func.id == "print")
        if isinstance(stmt, ast.Expr) and not is_print:
            target = ast.Subscript(ast.Name("_values", ast.Load()), ast.Constant(stmt.lineno), ast.Store())
            stmt = ast.copy_location(ast.Assign([target], stmt.value), stmt)
        body.append(stmt)
    tree.body = body
    namespace: dict[str, Any] = {"_values": {}}
    exec(compile(ast.fix_missing_locations(tree), str(README), "exec"), namespace)
    return namespace, namespace["_values"]


def _matches(value: Any, stated: str) -> bool:
    """Whether ``value`` is what the README's ``stated`` literal says (``0.136...``: truncated, not rounded)."""
    if stated.endswith("..."):
        digits = stated[:-3]
        places = len(digits.split(".")[1]) if "." in digits else 0
        return math.trunc(float(value) * 10 ** places) == round(float(digits) * 10 ** places)
    if "." in stated:
        return float(value) == pytest.approx(float(stated), rel=1e-9)
    return isinstance(value, int) and value == int(stated)


def _stated_lines(code: str) -> dict[int, list[str]]:
    out = {}
    for i, line in enumerate(code.splitlines(), start=1):
        hit = STATED.search(line)
        if hit:
            out[i] = [s.strip() for s in hit.group(1).split(",")]
    return out


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_example_runs(code: str) -> None:
    _, values = _run(code)
    for line, stated in _stated_lines(code).items():
        assert line in values, f"README line {line!r} states a value but is not an expression"
        got = values[line] if isinstance(values[line], tuple) else (values[line],)
        assert len(got) == len(stated) and all(_matches(v, s) for v, s in zip(got, stated, strict=True)), (
            f"README block line {line}: states {', '.join(stated)}, the code gives {got}")


def test_readme_quick_start_states_its_values() -> None:
    """The quick-start block: resnet110 has 54 branches of m = 2, factor 54^(-1/2) = 0.136..., a JSON round trip."""
    code = next(b for b in BLOCKS if "fixup.fixup_init_(model)" in b)
    stated = _stated_lines(code)
    # The README states these, and they are the paper's: L = 54 for ResNet-110 (3 stages of 18 blocks), m = 2.
    assert ["54", "2", "0.136..."] in stated.values()
    namespace, values = _run(code)
    report = namespace["report"]
    assert (report.num_branches, report.branches[0].m) == (54, 2)
    assert all(b.m == 2 for b in report.branches) and len(report.branches) == 54
    assert report.branches[0].factor == pytest.approx(54 ** -0.5, rel=1e-12)
    assert 0.136 <= report.branches[0].factor < 0.137
    # "JSON-serialisable, round-trips": through text and back to an equal report and an equal dict.
    line = next(i for i, s in enumerate(code.splitlines(), start=1) if "report.to_dict()" in s)
    data = values[line]
    text = json.dumps(data)
    again = InitReport.from_dict(json.loads(text))
    assert type(again) is type(report) and again == report
    assert again.to_dict() == data and json.loads(text) == data
    # "the factor alone"
    line = next(i for i, s in enumerate(code.splitlines(), start=1) if "fixup.branch_scale(54, 2)" in s)
    assert values[line] == pytest.approx(54 ** -0.5, rel=1e-12)
    assert fixup.branch_scale(54, 2) == report.branches[0].factor
