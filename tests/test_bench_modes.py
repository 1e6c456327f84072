"""``fixup bench`` across execution modes: eager, torch.compile and bfloat16 autocast side by side, interleaved."""

from __future__ import annotations

import json

import pytest
import torch

import fixup.bench.speed as bench
from fixup.bench.families import FAMILIES, build_variant, loss_fn, make_batch
from fixup.bench.speed import BenchConfig, _Runner, benchmark, mode_parts
from fixup.bench.tables import format_modes
from fixup.cli import main


def test_mode_parts_and_cli_shorthands():
    assert mode_parts("eager") == (False, None)
    assert mode_parts("compile-bf16") == (True, torch.bfloat16)
    with pytest.raises(ValueError, match="unknown mode 'fp8'"):
        mode_parts("fp8")
    assert bench._modes(["eager"], compile=False, bf16=True) == ("eager", "bf16")
    assert bench._modes(["eager"], compile=True, bf16=True) == ("eager", "compile", "bf16", "compile-bf16")
    assert bench._modes(["bf16"], compile=False, bf16=False) == ("bf16",)


@pytest.mark.parametrize("family", ["cifar", "transformer"])
def test_bf16_steps_keep_float32_state_and_the_scalars_small_updates(family):
    """Autocast casts each operation's inputs, never the parameters: the master weights (the zero-initialised
    layers and the scalars among them), their gradients and the momentum stay float32, and the scalars' small
    updates (most far below bf16's spacing of 2^-7 near a multiplier's 1) follow float32's."""
    fam = FAMILIES[family]
    inputs, target = make_batch(fam, 8)
    moves = {}
    for mode in ("eager", "bf16"):
        model = build_variant(fam, "fixup", depth=8)
        runner = _Runner(model, inputs, target, loss_fn(fam), mode, torch.device("cpu"))
        runner.opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        scalars = {n: p for n, p in model.named_parameters() if p.numel() == 1}
        before = {n: p.detach().clone() for n, p in scalars.items()}
        for _ in range(4):  # the branches' scalars get a gradient once the zero-initialised layers have moved
            runner.step()
        for n, p in model.named_parameters():
            assert p.dtype == torch.float32, n
            assert p.grad is None or p.grad.dtype == torch.float32, n
            assert runner.opt.state[p]["momentum_buffer"].dtype == torch.float32, n
        moves[mode] = torch.cat([(p.detach() - before[n]).reshape(1) for n, p in scalars.items()])
        with runner._autocast():  # the layers did run in bf16 under the bf16 mode
            assert model(*inputs).dtype == (torch.bfloat16 if mode == "bf16" else torch.float32)
    fp32, bf16 = moves["eager"], moves["bf16"]
    assert (fp32 != 0).float().mean() > 0.8 and (bf16 != 0).float().mean() > 0.8  # the scalars moved
    assert (fp32.abs() < 2**-8).float().mean() > 0.5  # most by less than half bf16's spacing near 1
    assert (bf16 - fp32).norm() < 0.1 * fp32.norm(), (bf16, fp32)  # and as float32 moves them


def test_modes_interleaved_in_one_run_with_per_mode_floors(monkeypatch):
    # Known times: per repetition, bf16 halves every eager time and fixup takes 1.2, 1.5, 1.1 x the floor.
    eager = {"none": [10.0, 20.0, 40.0], "fixup": [12.0, 30.0, 44.0]}
    times = {f"eager/{v}": t for v, t in eager.items()} | {f"bf16/{v}": [x / 2 for x in t] for v, t in eager.items()}
    seen = []

    def fake(runners, method, reps, warmup, rep_seconds=0.0):
        seen.append(set(runners))
        return {k: times[k] for k in runners}

    monkeypatch.setattr(bench, "_interleaved", fake)
    config = BenchConfig(families=("cifar",), variants=("none", "fixup"), modes=("eager", "bf16"), threads=(1,),
                         batch=2, depth=8, warmup=0, reps=3, memory=False, explain=False)
    result = benchmark(config)
    assert seen[0] == set(times)  # both modes timed in the same interleaved repetitions
    rows = {(r["mode"], r["variant"]): r for r in result["rows"]}
    for mode in ("eager", "bf16"):
        assert rows[mode, "fixup"]["step_ratio"] == pytest.approx({"median": 1.2, "min": 1.1, "max": 1.5,
                                                                   "fastest": 1.2})
        assert rows[mode, "none"]["step_ratio"]["fastest"] == 1.0
    assert rows["eager", "fixup"]["mode_ratio"] is None
    assert rows["bf16", "fixup"]["mode_ratio"] == pytest.approx({"median": 0.5, "min": 0.5, "max": 0.5,
                                                                 "fastest": 0.5})
    table = format_modes(result)
    assert "bf16 x eager" in table and "0.50" in table


@pytest.mark.slow  # 24 s on 2 cores (bf16 on a CPU); bf16 training is tested in the default run (test_train_engine)
def test_cli_bench_bf16_side_by_side(tmp_path):
    path = tmp_path / "bench.json"
    code = main(["bench", "--families", "cifar", "transformer", "--depth", "8", "--variants", "none", "fixup", "norm",
                 "--batch", "2", "--threads", "1", "--warmup", "0", "--reps", "1", "--bf16", "--no-explain",
                 "--json", str(path)])
    assert code == 0
    data = json.loads(path.read_text())
    cells = {(r["family"], r["mode"], r["label"]) for r in data["rows"]}
    assert cells == {(f, m, v) for f, norm in (("cifar", "batchnorm"), ("transformer", "layernorm"))
                     for m in ("eager", "bf16") for v in ("none", "fixup", norm)}
    for r in data["rows"]:
        assert r["peak_bytes"] > 0 and (r["mode_ratio"] is None) == (r["mode"] == "eager")


@pytest.mark.slow  # compiles 2 variants x train/eval, forward and backward: minutes on a loaded 2-core machine
def test_compiled_bf16_mode_compiles_each_variant():
    import torch._dynamo.utils as dutils

    dutils.counters.clear()
    config = BenchConfig(families=("cifar",), variants=("none", "fixup"), modes=("compile-bf16",),
                         threads=(1,), batch=2, depth=8, warmup=1, reps=1, memory=False, explain=False)
    result = benchmark(config)
    assert {(r["mode"], r["variant"]) for r in result["rows"]} == {("compile-bf16", v) for v in ("none", "fixup")}
    # every variant and train/eval is its own graph: none ran eager
    assert dutils.counters["stats"]["unique_graphs"] >= 4


def test_steps_only_drops_forward_timing_and_forward_only_variants():
    config = BenchConfig(families=("cifar",), variants=("none", "fixup", "fixup-folded"), threads=(1,), batch=2,
                         depth=8, warmup=0, reps=1, memory=False, explain=False, forward=False)
    rows = benchmark(config)["rows"]
    assert [r["variant"] for r in rows] == ["none", "fixup"]
    assert all("step_ms" in r and "forward_ms" not in r for r in rows)
    with pytest.raises(ValueError, match="nothing to train"):
        BenchConfig(variants=("none", "fixup-folded"), forward=False)
