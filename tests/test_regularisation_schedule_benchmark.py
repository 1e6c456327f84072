"""benchmarks/regularisation_schedule.py's rule for where the training loss flattens, which the deep tier's
regularisation schedule is stated from."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("regularisation_schedule", ROOT / "benchmarks" /
                                                  "regularisation_schedule.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_loss_flattens_at_its_first_arrival_near_its_lowest_value_whatever_comes_after():
    flat = _bench().flattening_epoch
    # within 1.5 x 0.001 + 0.01 = 0.0115 first at epoch 4; the later spike to 0.2 does not move it
    assert flat([1.5, 0.3, 0.05, 0.011, 0.002, 0.2, 0.001], within=1.5, floor=0.01) == 4
    assert flat([2.0, 1.0, 0.5], within=1.0, floor=0.0) == 3  # still falling: the last epoch
    assert flat([0.5, 0.5, 0.5], within=1.0, floor=0.0) == 1
