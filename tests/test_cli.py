"""The command line: `fixup inspect` and `fixup list`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fixup.cli import main

ROOT = Path(__file__).parents[1]


def test_inspect_prints_the_report_and_writes_json(tmp_path: Path, capsys) -> None:
    out = tmp_path / "r.json"
    assert main(["inspect", "resnet_cifar", "--depth", "56", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "L = 27 residual branches" in text and "classifier zeroed: fc" in text
    data = json.loads(out.read_text())
    assert data["report"]["num_branches"] == 27 and data["options"]["depth"] == 56


def test_inspect_bad_depth_is_a_clear_error(capsys) -> None:
    assert main(["inspect", "resnet_cifar", "--depth", "21"]) == 2
    assert "6n+2" in capsys.readouterr().err


def test_python_dash_m_runs() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-m", "fixup", "list", "resnet1*"], capture_output=True, text=True,
                          check=True, cwd=ROOT, env=env)
    assert "resnet110" in done.stdout.split()
