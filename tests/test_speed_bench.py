"""The benchmark measures what it says: ratios to the floor, allocator peaks, JSON and the CLI."""

from __future__ import annotations

import json

import pytest
import torch

from fixup.bench import BenchConfig, benchmark, build_variant, format_table
from fixup.cli import main
from fixup.memory import model_bytes, peak_step_memory


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
    fixup, bare = build_variant("fixup", 8), build_variant("none", 8)
    torch.testing.assert_close(fixup.conv1.weight, bare.conv1.weight)
    torch.testing.assert_close(fixup.layer2[0].conv1.weight, bare.layer2[0].conv1.weight)
    assert not build_variant("fixup-plain", 8).layer1[0].lean


def test_tiny_benchmark_rows_ratios_and_memory_order():
    config = BenchConfig(depths=(8,), variants=("none", "fixup", "fixup-plain"), batch=16, image_size=32,
                         warmup=0, reps=2)
    result = benchmark(config)
    rows = {r["variant"]: r for r in result["rows"]}
    assert set(rows) == {"none", "fixup", "fixup-plain"}
    assert rows["none"]["step_ratio"]["median"] == 1.0 and rows["none"]["peak_ratio"] == 1.0
    # the straightforward path keeps a new tensor per scalar; the lean path keeps about what the floor keeps
    assert rows["fixup-plain"]["peak_bytes"] > 1.5 * rows["fixup"]["peak_bytes"]
    assert rows["fixup"]["peak_ratio"] < 1.25
    assert all(r["step_ms"]["min"] <= r["step_ms"]["median"] <= r["step_ms"]["max"] for r in rows.values())
    table = format_table(result)
    assert "fixup-plain" in table and "ratio to norm=none" in table
    json.dumps(result)


def test_config_rejects_unknown_variants_and_missing_floor():
    with pytest.raises(ValueError, match="unknown variant"):
        BenchConfig(variants=("none", "layernorm"))
    with pytest.raises(ValueError, match="floor"):
        BenchConfig(variants=("fixup",))


def test_cli_bench_writes_json(tmp_path, capsys):
    path = tmp_path / "bench.json"
    code = main(["bench", "--depths", "8", "--variants", "none", "fixup", "--batch", "2", "--image-size", "8",
                 "--warmup", "0", "--reps", "1", "--no-memory", "--json", str(path)])
    assert code == 0
    data = json.loads(path.read_text())
    assert [r["variant"] for r in data["rows"]] == ["none", "fixup"]
    assert "step ms" in capsys.readouterr().out


@pytest.mark.slow  # a fresh interpreter importing torch: ~10-20 s on a busy machine
def test_deep_case_runs_in_a_fresh_process_and_reports_its_peak():
    from fixup.bench_deep import DeepCase, auto_segments, run_case_in_subprocess

    assert auto_segments(9998) == 71  # sqrt(4998 blocks)
    row = run_case_in_subprocess(DeepCase(depth=14, batch=2, segments=2, steps=2, image_size=8), timeout_s=120)
    assert "error" not in row, row
    assert row["segments"] == 2 and len(row["step_s"]) == 2
    assert row["peak_rss_bytes"] > 50 * 2**20  # an interpreter with torch loaded
    assert row["parameters"] == sum(p.numel() for p in build_variant("fixup", 14).parameters())


def test_deep_sweep_refuses_depths_that_are_not_6n_plus_2():
    from fixup.bench_deep import sweep

    with pytest.raises(ValueError, match="6n\\+2"):
        sweep([10000])
