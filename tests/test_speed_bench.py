"""The benchmark measures what it says: ratios to the floor, allocator peaks, JSON and the CLI."""

from __future__ import annotations

import json

import pytest
import torch

from fixup.bench.families import FAMILIES, build_variant, make_batch
from fixup.bench.memory import model_bytes, peak_step_memory
from fixup.bench.speed import BenchConfig, benchmark
from fixup.bench.tables import format_table
from fixup.cli import main
from fixup.nn import Bias, Scale


def test_cpu_peak_memory_sees_a_temporary_tensor():
    model = torch.nn.Linear(4, 4)

    def step() -> None:
        big = torch.ones(1 << 20)  # 4 MiB, freed at once: only the timeline's peak can see it
        big.add_(1)
        del big

    mem = peak_step_memory(step, model, "cpu")
    assert mem["step_increase_bytes"] >= 4 << 20
    assert mem["peak_bytes"] == mem["model_bytes"] + mem["step_increase_bytes"]
    assert mem["model_bytes"] == model_bytes(model) == 20 * 4


def test_every_variant_starts_from_the_same_weights():
    cifar = FAMILIES["cifar"]
    fixup, bare = build_variant(cifar, "fixup", depth=8), build_variant(cifar, "none", depth=8)
    torch.testing.assert_close(fixup.conv1.weight, bare.conv1.weight)
    torch.testing.assert_close(fixup.layer2[0].conv1.weight, bare.layer2[0].conv1.weight)
    assert not build_variant(cifar, "fixup-plain", depth=8).layer1[0].lean
    bare_t = build_variant(FAMILIES["transformer"], "none")
    assert not any(isinstance(m, (Bias, Scale)) for m in bare_t.modules())  # the bare Transformer: no scalars
    norm_t = build_variant(FAMILIES["transformer"], "norm")
    assert any(isinstance(m, torch.nn.LayerNorm) for m in norm_t.modules())


def test_tiny_benchmark_rows_ratios_memory_and_reasons():
    config = BenchConfig(families=("cifar", "wide"), variants=("none", "fixup", "fixup-plain", "fixup-folded"),
                         threads=(1,), batch=8, depth=8, warmup=0, reps=2)
    result = benchmark(config)
    rows = {(r["family"], r["variant"]): r for r in result["rows"]}
    assert {v for _, v in rows} == {"none", "fixup", "fixup-plain", "fixup-folded"}
    for family in ("cifar", "wide"):
        none, lean, plain = (rows[family, v] for v in ("none", "fixup", "fixup-plain"))
        # every ratio is to this family's floor: peaks exactly, step times within what the medians allow
        for r in (none, lean, plain):
            assert r["peak_ratio"] == pytest.approx(r["peak_bytes"] / none["peak_bytes"], rel=1e-12)
            lo, hi = r["step_ms"]["min"] / none["step_ms"]["max"], r["step_ms"]["max"] / none["step_ms"]["min"]
            assert lo <= r["step_ratio"]["min"] <= r["step_ratio"]["median"] <= r["step_ratio"]["max"] <= hi
        # the straightforward path keeps a new tensor per scalar; the lean path keeps about what the floor keeps
        assert plain["peak_bytes"] > 1.3 * lean["peak_bytes"] and lean["peak_ratio"] < 1.15
        assert "step_ms" not in rows[family, "fixup-folded"]  # forward only
        for r in (none, lean, plain):
            assert r["step_ms"]["min"] <= r["step_ms"]["median"] <= r["step_ms"]["max"]
    for r in result["rows"]:  # every miss comes with the profiler's account of it
        assert bool(r["misses"]) == ("reason" in r)
        if r["misses"]:
            assert "total" in r["reason"] and "aten::" in r["reason"]
    table = format_table(result, markdown=True)
    assert "fixup-plain" in table and "bare network" in table
    json.dumps(result)


def test_ratios_are_medians_of_per_repetition_ratios_to_the_floor(monkeypatch):
    import fixup.bench.speed as bench

    # Known times, so that the ratio is checked against numbers worked out by hand: per repetition the fixup
    # step takes 1.2, 1.5 and 1.1 times the floor's, whose median is 1.2 (the ratio of the medians would be 1.5).
    times = {"none": [10.0, 20.0, 40.0], "fixup": [12.0, 30.0, 44.0]}
    monkeypatch.setattr(bench, "_interleaved",  # runners are keyed "mode/variant"
                        lambda runners, method, reps, warmup, rep_seconds=0.0: {k: times[k.split("/")[1]]
                                                                                for k in runners})
    config = BenchConfig(families=("cifar",), variants=("none", "fixup"), threads=(1,), batch=2, depth=8, warmup=0,
                         reps=3, memory=False, explain=False)
    rows = {r["variant"]: r for r in benchmark(config)["rows"]}
    expected = {"median": 1.2, "min": 1.1, "max": 1.5, "fastest": 12.0 / 10.0}  # fastest: 12 ms over 10 ms
    assert rows["fixup"]["step_ratio"] == pytest.approx(expected)
    assert rows["fixup"]["forward_ratio"] == pytest.approx(expected)
    assert rows["fixup"]["step_ms"] == {"median": 30.0, "min": 12.0, "max": 44.0}
    assert rows["none"]["step_ratio"] == {"median": 1.0, "min": 1.0, "max": 1.0, "fastest": 1.0}
    assert rows["fixup"]["misses"] == (["step"] if 1.2 > bench.STEP_TARGET else [])


def test_config_rejects_unknown_names_and_missing_floor():
    with pytest.raises(ValueError, match="unknown variant"):
        BenchConfig(variants=("none", "groupnorm"))
    with pytest.raises(ValueError, match="unknown family"):
        BenchConfig(families=("vgg",))
    with pytest.raises(ValueError, match="floor"):
        BenchConfig(variants=("fixup",))


def test_cli_bench_writes_json_and_keeps_profiler_logs_away(tmp_path, capfd):
    path = tmp_path / "bench.json"
    code = main(["bench", "--families", "cifar", "--depth", "8", "--variants", "none", "fixup", "--batch", "2",
                 "--threads", "1", "--warmup", "0", "--reps", "1", "--json", str(path)])
    assert code == 0
    data = json.loads(path.read_text())
    assert [r["variant"] for r in data["rows"]] == ["none", "fixup"]
    out, err = capfd.readouterr()  # file-descriptor level: the profiler's C++ log lines would show here
    assert "step ms" in out
    assert "USDT" not in err and "profiler_start" not in err


@pytest.mark.slow  # a fresh interpreter importing torch: ~10-20 s on a busy machine
def test_deep_case_runs_in_a_fresh_process_and_reports_its_peak():
    from fixup.bench.deep import DeepCase, auto_segments, run_case_in_subprocess

    assert auto_segments(9998) == 71  # sqrt(4998 blocks)
    row = run_case_in_subprocess(DeepCase(depth=14, batch=2, segments=2, steps=2, image_size=8), timeout_s=120)
    assert "error" not in row, row
    assert row["segments"] == 2 and len(row["step_s"]) == 2
    assert row["peak_rss_bytes"] > 50 * 2**20  # an interpreter with torch loaded
    assert row["parameters"] == sum(p.numel() for p in build_variant(FAMILIES["cifar"], "fixup", depth=14).parameters())


def test_deep_sweep_refuses_depths_that_are_not_6n_plus_2():
    from fixup.bench.deep import sweep

    with pytest.raises(ValueError, match="6n\\+2"):
        sweep([10000])


def test_width_overrides_each_family_and_is_recorded():
    bottleneck = FAMILIES["bottleneck"]
    model = build_variant(bottleneck, "fixup", width=8)
    assert model.conv1.out_channels == 8  # the first stage's planes
    assert build_variant(bottleneck, "fixup").conv1.out_channels == bottleneck.kwargs["width"]
    config = BenchConfig(families=("cifar",), variants=("none", "fixup"), threads=(1,), batch=2, depth=8, width=4,
                         warmup=0, reps=1, memory=False, forward=False, explain=False)
    result = benchmark(config)
    assert result["families"]["cifar"]["options"] == {"depth": 8, "width": 4}
    transformer = build_variant(FAMILIES["transformer"], "fixup", width=64)
    assert transformer.cfg.d_model == 64 and transformer.cfg.ffn_dim == 128
    with pytest.raises(ValueError, match="width must be >= 1"):
        BenchConfig(width=0)


@pytest.mark.parametrize("family", ["cifar", "transformer"])
def test_biased_variant_is_the_bare_network_with_zero_layer_biases(family):
    """The floor of a network with layer biases: the bare network's function and weights, a zero bias in every
    convolution and linear layer, no scalar; its step computes each bias's gradient (a full reduction)."""
    fam = FAMILIES[family]
    bare, biased = build_variant(fam, "none"), build_variant(fam, "biased")
    layers = [m for m in biased.modules() if type(m) in (torch.nn.Conv2d, torch.nn.Linear)]
    assert layers and all(m.bias is not None and not m.bias.any() for m in layers)
    assert not any(isinstance(m, (Bias, Scale)) for m in biased.modules())
    inputs, _ = make_batch(fam, 2)
    bare.eval()
    biased.eval()
    with torch.no_grad():
        torch.testing.assert_close(biased(*inputs), bare(*inputs))
    biased(*inputs).float().square().sum().backward()
    assert all(m.bias.grad is not None for m in layers)


def test_a_repetition_repeats_short_calls_the_same_number_of_times_for_every_variant(monkeypatch):
    import fixup.bench.speed as bench

    class Fake:
        device = torch.device("cpu")

        def __init__(self, seconds):
            self.seconds, self.calls = seconds, 0

        def step(self):
            self.calls += 1
            clock[0] += self.seconds

    clock = [0.0]
    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock[0])
    runners = {"eager/none": Fake(0.010), "eager/fixup": Fake(0.012)}
    times = bench._interleaved(runners, "step", reps=3, warmup=1, rep_seconds=0.1)
    # the fastest call (10 ms) sets the count: 10 calls a repetition for both, timed per call
    assert times == {"eager/none": [pytest.approx(10.0)] * 3, "eager/fixup": [pytest.approx(12.0)] * 3}
    assert [r.calls for r in runners.values()] == [1 + 1 + 30, 1 + 1 + 30]  # warm-up, calibration, 3 x 10
    once = bench._interleaved(runners, "step", reps=2, warmup=0, rep_seconds=0.0)
    assert once == {"eager/none": [pytest.approx(10.0)] * 2, "eager/fixup": [pytest.approx(12.0)] * 2}
    tiny = Fake(1e-5)
    bench._interleaved({"eager/none": tiny}, "step", reps=1, warmup=0, rep_seconds=1.0)
    assert tiny.calls == 1 + bench.MAX_CALLS  # calibration, then capped
