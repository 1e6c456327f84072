"""``fixup inspect --adapt module:factory``: adapt a user's model from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fixup.cli import main

FACTORY = '''
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.fc1, self.fc2 = nn.LayerNorm(16), nn.Linear(16, 32), nn.Linear(32, 16)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


def build():
    return nn.Sequential(nn.Linear(4, 16), Block(), Block(), nn.Linear(16, 3))


def build_with_input():
    return build(), torch.randn(2, 4)
'''


@pytest.fixture
def factory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "user_models.py"
    path.write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    return path


def test_adapt_a_factory_by_module_name(factory: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = factory.parent / "report.json"
    assert main(["inspect", "--adapt", "user_models:build", "--input-shape", "2,4", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "user_models:build adapted to Fixup" in text and "L = 2 residual branches" in text
    report = json.loads(out.read_text())["report"]
    assert [b["zeroed"]["name"] for b in report["branches"]] == ["1.fc2", "2.fc2"]
    assert [c["name"] for c in report["classifier"]] == ["3"]
    assert [n["action"] for n in report["norms_replaced"]] == ["bias", "bias"]  # each before its branch's fc1


def test_a_factory_file_may_return_its_example_input(factory: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "--adapt", f"{factory}:build_with_input"]) == 0
    assert "m=2" in capsys.readouterr().out


def test_a_factory_file_loads_as_an_import_would(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file path loads its module as an import does: dataclasses declared in it work (they look their module up
    in sys.modules), and it imports the files beside it."""
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "helpers.py").write_text("WIDTH = 16\n")
    extra = ("\n\n@dataclass\nclass Config:\n    width: int = WIDTH\n\n\n"
             "def build_from_config():\n    assert Config().width == 16\n    return build()\n")
    (folder / "zoo.py").write_text("from __future__ import annotations\nfrom dataclasses import dataclass\n"
                                   "from helpers import WIDTH\n" + FACTORY + extra)
    assert main(["inspect", "--adapt", f"{folder / 'zoo.py'}:build_from_config", "--input-shape", "2,4"]) == 0
    assert "L = 2 residual branches" in capsys.readouterr().out


def test_errors_say_what_to_give(factory: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "--adapt", "user_models:build"]) == 2
    assert "--input-shape" in capsys.readouterr().err
    assert main(["inspect", "--adapt", "user_models"]) == 2
    assert "module:factory" in capsys.readouterr().err
    assert main(["inspect", "--adapt", "no_such_module:build", "--input-shape", "2,4"]) == 2
    assert "cannot import 'no_such_module'" in capsys.readouterr().err
    assert main(["inspect"]) == 2
    assert "registered model name" in capsys.readouterr().err


def test_method_and_trunk_are_adapt_s(factory: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = factory.parent / "report.json"
    assert main(["inspect", "--adapt", "user_models:build", "--input-shape", "2,4", "--method", "rezero",
                 "--trunk", "fan_in", "--json", str(out)]) == 0
    assert "user_models:build adapted to rezero (trunk fan_in)" in capsys.readouterr().out
    saved = json.loads(out.read_text())
    assert (saved["method"], saved["trunk"]) == ("rezero", "fan_in")
    assert saved["report"]["method"] == "rezero" and saved["report"]["trunk_rule"] == "fan_in"
    assert all(b["gate"] for b in saved["report"]["branches"])


def test_method_and_trunk_errors_name_what_works(factory: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # T-Fixup scales attention and feed-forward sub-blocks; this model has feed-forward blocks only
    assert main(["inspect", "--adapt", "user_models:build", "--input-shape", "2,4", "--method", "t_fixup"]) == 2
    assert "found no attention sub-block in Sequential" in capsys.readouterr().err
    # the NF form applies to convolutional branches; this model's are linear layers
    assert main(["inspect", "--adapt", "user_models:build", "--input-shape", "2,4", "--method", "nf_resnet"]) == 2
    assert "NF-ResNets standardise convolutions" in capsys.readouterr().err
    assert main(["inspect", "--adapt", "user_models:build", "--input-shape", "2,4", "--trunk", "he"]) == 2
    assert "trunk must be one of ('lsuv', 'fan_in', 'none'), got 'he'" in capsys.readouterr().err
    assert main(["inspect", "resnet20", "--method", "rezero", "--trunk", "none"]) == 2
    assert "--method 'rezero' and --trunk 'none' apply only to a model adapted with --adapt" in capsys.readouterr().err
    # Checked before the factory runs: its model is never built.
    assert main(["inspect", "--adapt", "no_such_module:build", "--method", "rezer"]) == 2
    assert "--method: fixup.adapt applies the methods" in capsys.readouterr().err


def test_adapt_options_reach_adapt_and_are_checked_before_the_model_is_built(
        factory: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "--adapt", "user_models:build", "--input-shape", "2,4", "--adapt-options",
                 '{"rescale": 2}']) == 0
    assert "factor x2" in capsys.readouterr().out
    assert main(["inspect", "--adapt", "no_such_module:build", "--method", "skipinit", "--adapt-options",
                 '{"rescale": 2}']) == 2
    assert "--adapt-options: rescale= sets a factor" in capsys.readouterr().err  # refused before the import
    assert main(["inspect", "--adapt", "user_models:build", "--adapt-options", '{"trunk": "none"}']) == 2
    assert "give --method, --trunk or --lenient instead" in capsys.readouterr().err
    assert main(["inspect", "resnet20", "--adapt-options", '{"rescale": 2}']) == 2
    assert "--adapt-options {'rescale': 2} applies only to a model adapted with --adapt" in capsys.readouterr().err
