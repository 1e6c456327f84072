"""benchmarks/private_training.py builds its runs' configurations as it documents: the private runs, the non-private
control at the same budget, TrainConfig overrides for every run, and the routes of timm's ResNet-18 through adapt."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from fixup.train import TrainConfig

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("private_training_benchmark", ROOT / "benchmarks" /
                                                  "private_training.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


OPTS = {"image_size": 0, "channels": 0, "batch_size": 256, "epochs": 20, "momentum": 0.9, "delta": 1e-5,
        "device": "cpu", "dp_physical_batch": 0, "max_updates": 0, "max_grad_norm": 0.3}


def test_a_private_run_spends_its_epsilon_at_its_bound(bench) -> None:
    config = TrainConfig.from_dict(bench.config_for("resnet20", "fixup", 8.0, 1, 0.5, OPTS))
    assert config.dp and config.target_epsilon == 8.0 and config.max_grad_norm == 0.3 and config.seed == 1


def test_the_control_is_the_same_run_without_privacy(bench) -> None:
    private = bench.config_for("resnet20", "groupnorm", 8.0, 0, 0.5, OPTS)
    control = bench.config_for("resnet20", "groupnorm", math.inf, 0, 0.5, OPTS)
    config = TrainConfig.from_dict(control)
    assert not config.dp and (config.clip, config.grad_clip) == ("auto", 1.0)  # the engine's default clipping
    shared = {k: v for k, v in private.items() if k in control}
    assert shared == {k: control[k] for k in shared}  # budget, schedule, rate, seed and model as the private run's
    assert {k for k in private if k not in control} == {"dp", "target_epsilon", "delta", "max_grad_norm",
                                                        "accountant"}


def test_overrides_reach_every_run_and_unknown_fields_are_refused(bench) -> None:
    overrides = bench.parse_overrides(["scalar_lr_mult=1", "schedule=constant", "weight_decay=5e-4"])
    assert overrides == {"scalar_lr_mult": 1, "schedule": "constant", "weight_decay": 5e-4}
    config = TrainConfig.from_dict(bench.config_for("resnet20", "fixup", 8.0, 0, 0.5, {**OPTS,
                                                                                        "overrides": overrides}))
    assert (config.scalar_lr_mult, config.schedule, config.weight_decay) == (1, "constant", 5e-4)
    for bad in (["scalar_lr_mult"], ["no_such_field=1"]):
        with pytest.raises(ValueError, match="TrainConfig field"):
            bench.parse_overrides(bad)


def test_timm_resnet18_takes_every_normalisation_free_route_through_adapt(bench) -> None:
    for route in ("fixup", "skipinit", "rezero", "nf_resnet"):
        config = bench.config_for("timm-resnet18", route, 8.0, 0, 0.5, OPTS)
        assert config["adapt"].endswith("private_training.py:timm_resnet18")
        assert (config["norm"], config["init"]) == (("fixup", "") if route == "fixup" else ("", route))


def test_stored_runs_are_read_back_in_order_and_not_trained_again(bench, tmp_path) -> None:
    from fixup._io import RecordLog

    specs = [{"arch": "resnet20", "route": r, "epsilon": 8.0, "seed": s, "lr": 0.2, "opts": OPTS, "threads": 1}
             for r in ("fixup", "groupnorm") for s in (0, 1)]
    log = RecordLog(tmp_path / "runs.jsonl", bench.RUN_KEYS)
    for i, spec in enumerate(reversed(specs)):  # stored in another order than asked
        log.add({**bench.run_key(spec), "acc": i})
    again = RecordLog(tmp_path / "runs.jsonl", bench.RUN_KEYS)
    rows = bench.run_all(specs, 1, again)  # every run found: nothing is trained (no worker could run these)
    assert [(r["route"], r["seed"], r["acc"]) for r in rows] == [("fixup", 0, 3), ("fixup", 1, 2),
                                                                 ("groupnorm", 0, 1), ("groupnorm", 1, 0)]
    # the device and the physical batch do not make another run; the bound, the split and the budget do
    same = {**specs[0], "opts": {**OPTS, "device": "cuda", "dp_physical_batch": 32}}
    assert bench.run_key(same) == bench.run_key(specs[0])
    for other in ({**specs[0], "max_grad_norm": 1.0}, {**specs[0], "val_fraction": 0.2},
                  {**specs[0], "opts": {**OPTS, "epochs": 10}}):
        assert again.get(**bench.run_key(other)) is None
