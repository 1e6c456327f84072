"""A method's own recipe in the engine (fixup.train.recipe): its clipping and warm-up unless set explicitly, and
`fixup train --init METHOD` choosing the method's normalisation by its name alone."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from fixup.cli import main
from fixup.train import TrainConfig, fit
from fixup.train.cli import config_from_args
from fixup.train.optim import lr_factor
from fixup.train.recipe import apply_recipe, config_method

# Two plain SGD steps at lr 1 on a small NF-ResNet: big enough steps that AGC (lambda 0.01) has work to do.
_NF = dict(model="resnet_cifar", depth=8, batch_size=64, max_updates=2, momentum=0.0, weight_decay=0.0, lr=1.0,
           schedule="constant", checkpoint=False, init="nf_resnet")


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_the_method_name_alone_gets_its_clipping_and_trains_exactly_as_the_explicit_flag() -> None:
    auto = fit(TrainConfig(**_NF), progress=False)
    assert auto.recipe["method"] == "nf_resnet" and auto.recipe["clip"] == "agc"
    assert auto.recipe["clip_from"] == "method" and "nf_resnet's recipe" in auto.recipe["notes"][0]
    assert auto.config["optimisation"]["clip"] == "agc" and auto.config["network"]["norm"] == "none"
    explicit = fit(TrainConfig(**_NF, clip="agc"), progress=False)
    assert explicit.recipe["clip_from"] == "explicit"
    a, b = _weights(auto.model), _weights(explicit.model)
    assert all(torch.equal(a[k], b[k]) for k in a)  # clip=auto on nf_resnet is AGC, step for step
    unclipped = _weights(fit(TrainConfig(**_NF, clip="none"), progress=False).model)
    assert any(not torch.equal(a[k], unclipped[k]) for k in a)  # ... and AGC changed the steps


def test_an_explicit_clip_wins_and_the_record_says_it_replaced_the_methods() -> None:
    _, recipe = apply_recipe(TrainConfig(init="nf_resnet", clip="norm").validate())
    assert (recipe.clip, recipe.clip_from) == ("norm", "explicit") and "in place of nf_resnet's recipe (agc)" in \
        recipe.notes[0]


@pytest.mark.parametrize("init", ["", "fixup_paper", "rezero", "skipinit", "batchnorm", "he"])
def test_methods_without_a_clipping_recipe_keep_the_engines_global_norm(init: str) -> None:
    config, recipe = apply_recipe(TrainConfig(init=init).validate())
    assert (config.clip, recipe.clip_from) == ("norm", "default") and "prescribes no clipping" in recipe.notes[0]


def test_the_recipe_is_in_the_run_log_and_the_cli_output(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    code = main(["train", "--init", "nf_resnet", "--depth", "8", "--max-updates", "1", "--batch-size", "64",
                 "--no-progress", "--device", "cpu", "--out-dir", str(out)])
    assert code == 0
    assert "recipe: clip=agc: nf_resnet's recipe" in capsys.readouterr().out
    assert json.loads((out / "run.json").read_text())["recipe"]["clip_from"] == "method"
    assert json.loads((out / "result.json").read_text())["recipe"]["clip"] == "agc"
    assert json.loads((out / "config.json").read_text())["optimisation"]["clip"] == "agc"  # as it ran (resumable)


def test_t_fixup_trains_without_warm_up_unless_one_is_given() -> None:
    from fixup.translation.task import translation_config

    cfg = translation_config("tiny", init="t_fixup")  # the tiny recipe warms up for 100 steps: T-Fixup's does not
    assert (cfg.norm, cfg.warmup_steps, cfg.schedule, cfg.decay_period) == ("none", 0, "inverse_sqrt", 100)
    assert apply_recipe(cfg)[1].warmup_from == "method"
    assert "the inverse square-root decay from the first step, period 100" in apply_recipe(cfg)[1].notes[1]
    # the authors' inverse_sqrt_nowarmup: lr * sqrt(P / (P + t)) from update 0, P the decay period (the others'
    # warm-up length): 1, 1/sqrt(2), 1/sqrt(3) at updates 0, P, 2P, never above the peak
    warm = translation_config("tiny")
    t_fixup = [lr_factor(s, 600, cfg) for s in (0, 50, 100, 200, 599)]
    assert t_fixup == [1.0, pytest.approx(math.sqrt(100 / 150)), pytest.approx(math.sqrt(0.5)),
                       pytest.approx(math.sqrt(1 / 3)), pytest.approx(math.sqrt(100 / 699))]
    assert [lr_factor(s, 600, warm) for s in (0, 99, 399)] == [pytest.approx(0.01), 1.0, pytest.approx(0.5)]
    assert translation_config("tiny", init="t_fixup", decay_period=300).decay_period == 300  # given: kept
    iwslt = translation_config("iwslt", init="t_fixup")
    assert iwslt.decay_period == 4000  # the authors' IWSLT recipe
    assert [lr_factor(s, 10**5, iwslt) for s in (0, 4000, 8000)] == pytest.approx([1.0, 0.7071, 0.5774], abs=1e-4)
    with pytest.raises(ValueError, match="exactly one of warmup_steps > 0"):
        TrainConfig(schedule="inverse_sqrt", warmup_steps=0).validate()
    with pytest.raises(ValueError, match="exactly one of warmup_steps > 0"):
        TrainConfig(schedule="inverse_sqrt", warmup_steps=10, decay_period=10).validate()
    with pytest.raises(ValueError, match="decay_period must be >= 0"):
        TrainConfig(decay_period=-1).validate()
    given = translation_config("tiny", init="t_fixup", warmup_steps=50)
    assert (given.warmup_steps, given.schedule) == (50, "inverse_sqrt")
    recipe = apply_recipe(given)[1]
    assert recipe.warmup_from == "explicit" and "although t_fixup's recipe has no warm-up" in recipe.notes[1]
    assert translation_config("tiny").warmup_steps == 100  # Fixup and LayerNorm keep the recipe's warm-up
    assert translation_config("tiny", norm="layernorm").warmup_steps == 100


def test_dyt_trains_as_the_layernorm_model() -> None:
    """Zhu et al. (2025) train DyT with the LayerNorm model's recipe: only the norm differs."""
    from fixup.translation.task import translation_config

    dyt, ln = translation_config("tiny", init="dyt"), translation_config("tiny", norm="layernorm")
    assert (dyt.norm, dyt.init, config_method(dyt).name) == ("dyt", "xavier", "dyt")
    differ = {k for k in vars(ln) if getattr(ln, k) != getattr(dyt, k)}
    assert differ <= {"norm", "init"}, differ
    (_, recipe), (_, ln_recipe) = apply_recipe(dyt), apply_recipe(ln)
    assert (recipe.method, recipe.clip, recipe.warmup_steps) == ("dyt", ln_recipe.clip, ln_recipe.warmup_steps)


@pytest.mark.parametrize(("init", "norm"), [("rezero", "none"), ("skipinit", "none"), ("nf_resnet", "none"),
                                            ("batchnorm", "batchnorm"), ("he", "none"), ("fixup_paper", "fixup"),
                                            ("", "fixup")])
def test_the_method_name_alone_selects_its_normalisation(init: str, norm: str) -> None:
    cfg = TrainConfig(init=init).validate()
    assert cfg.norm == norm
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg  # the saved config reads back as the same run


@pytest.mark.parametrize(("norm", "init", "own"), [("batchnorm", "rezero", "none"), ("fixup", "skipinit", "none"),
                                                   ("none", "fixup", "fixup"), ("groupnorm", "nf_resnet", "none")])
def test_a_norm_that_contradicts_the_method_is_an_error_naming_its_own(norm: str, init: str, own: str) -> None:
    with pytest.raises(ValueError, match=f"init='{init}' is the method '{init}', which has norm='{own}'"):
        TrainConfig(norm=norm, init=init).validate()


def test_cli_init_alone_trains_the_gated_method_and_a_contradiction_exits_2(tmp_path: Path, capsys) -> None:
    args = ["train", "--depth", "8", "--max-updates", "1", "--batch-size", "64", "--no-progress", "--device", "cpu",
            "--no-checkpoint"]
    assert main([*args, "--init", "rezero"]) == 0
    assert main([*args, "--norm", "batchnorm", "--init", "rezero"]) == 2
    assert "norm='none'" in capsys.readouterr().err


def test_init_on_the_command_line_overrides_the_norm_of_a_saved_config(tmp_path: Path) -> None:
    import argparse

    saved = tmp_path / "config.json"
    saved.write_text(json.dumps(TrainConfig(depth=8).validate().to_dict()))  # norm "fixup"
    cfg = config_from_args(argparse.Namespace(config=str(saved), init="rezero"))
    assert (cfg.norm, cfg.init, cfg.depth) == ("none", "rezero", 8)
    kept = config_from_args(argparse.Namespace(config=str(saved), init="fixup_paper"))
    assert (kept.norm, kept.init) == ("fixup", "fixup_paper")


def test_the_gates_rate_is_a_training_option() -> None:
    from fixup.train.optim import build_optimizer

    model = __import__("fixup").create_model("resnet_cifar", depth=8, method="rezero")
    _, groups = build_optimizer(model, TrainConfig(init="rezero", lr=0.1, gate_lr_mult=0.1).validate())
    gates = next(g for g in groups if g["name"] == "gates")
    assert gates["lr"] == pytest.approx(0.01) and gates["count"] == 3
    with pytest.raises(ValueError, match="gate_lr_mult must be >= 0"):
        TrainConfig(gate_lr_mult=-1.0).validate()
