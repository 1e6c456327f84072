"""Full mode on tiny files in the real formats: `fixup reproduce --full --data-dir D` with a CIFAR-10 python
archive and IWSLT-style parallel text, through the CLI, on a test-only grid of 2 cells a study and a few
steps each; and `--full --dry-run`, which lists the cells, their data and GPU hours."""

from __future__ import annotations

import json
import pickle
import tarfile
from dataclasses import replace
from pathlib import Path

import numpy as np

from fixup.cli import main
from fixup.studies import grid as grid_module

TINY_TRANSFORMER = {"d_model": 32, "ffn_dim": 64, "heads": 2, "encoder_layers": 1, "decoder_layers": 1}


def _data_dir(root: Path) -> Path:
    """D/cifar-10-python.tar.gz (the published python archive) and D/iwslt14.de-en/{train,valid,test}.{de,en}."""
    batches = root / "build" / "cifar-10-batches-py"
    batches.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]:
        batch = {b"data": rng.integers(0, 256, (8, 3072), dtype=np.uint8),
                 b"labels": [int(v) for v in rng.integers(0, 10, 8)]}
        (batches / name).write_bytes(pickle.dumps(batch))
    data = root / "D"
    data.mkdir()
    with tarfile.open(data / "cifar-10-python.tar.gz", "w:gz") as tar:
        tar.add(batches, arcname="cifar-10-batches-py")
    text = data / "iwslt14.de-en"
    text.mkdir()
    words = [("haus", "house"), ("katze", "cat"), ("hund", "dog"), ("baum", "tree"), ("rot", "red"), ("blau", "blue")]
    for split, n in (("train", 120), ("valid", 12), ("test", 12)):
        de, en = [], []
        for i in range(n):
            pick = [words[(i * 7 + k * 3) % len(words)] for k in range(2 + i % 4)]
            de.append(" ".join(p[0] for p in pick))
            en.append(" ".join(p[1] for p in pick))
        (text / f"{split}.de").write_text("\n".join(de) + "\n")
        (text / f"{split}.en").write_text("\n".join(en) + "\n")
    return data


def _tiny_full(monkeypatch) -> None:
    real = grid_module.make_grid

    def make_grid(mode, **kwargs):  # test-only: the full grid's data paths, 2 cells a study, a few steps
        g = real(mode, **kwargs)
        assert mode == "full" and g.data == "cifar10" and g.translation.data_dir, "full mode found the data"
        return replace(g, seeds=1,
                       depth=replace(g.depth, depths=(10,), methods=("fixup", "batchnorm"), batch_size=16),
                       translation=replace(g.translation, model="transformer_tiny", dropouts=(0.1,), max_updates=3,
                                           warmup_steps=1, max_tokens=256, beam=1,
                                           extra={**g.translation.extra, "vocab_size": 40, "bleu_limit": 0,
                                                  "model": TINY_TRANSFORMER}))

    monkeypatch.setattr(grid_module, "make_grid", make_grid)


def test_full_mode_runs_end_to_end_on_real_formats(tmp_path, monkeypatch, capsys):
    data = _data_dir(tmp_path)
    _tiny_full(monkeypatch)
    out = tmp_path / "out"
    code = main(["reproduce", "--full", "--data-dir", str(data), "--only", "depth,translation", "--out", str(out),
                 "--yes", "--jobs", "1", "--device", "cpu", "--no-plots"])
    assert code == 0, capsys.readouterr().err
    results = json.loads((out / "results.json").read_text())
    assert results["grid"]["data"] == "cifar10" and results["grid"]["data_dir"].endswith("cifar-10-python.tar.gz")
    assert results["timing"]["cells_run"] == 4
    depth_cells = results["studies"]["depth"]["methods"]
    assert set(depth_cells) == {"fixup", "batchnorm"}
    table = results["studies"]["translation"]["table"]
    assert set(table) == {"fixup", "layernorm"}
    config = json.loads(next((out / "cells" / "translation").rglob("cell_config.json")).read_text())
    assert config["config"]["train"]["data_dir"].endswith("iwslt14.de-en")


def test_full_dry_run_lists_cells_data_and_gpu_hours(tmp_path, capsys):
    data = _data_dir(tmp_path)
    assert main(["reproduce", "--full", "--data-dir", str(data), "--dry-run", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "depth/fixup/depth=10000/seed2" in out and "cifar-10-python.tar.gz" in out and "iwslt14.de-en" in out
    assert "GPU hours; throughput model: assumed" in out and not (tmp_path / "o" / "cells").exists()
