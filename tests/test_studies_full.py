"""Full mode on tiny files in the real formats: `fixup reproduce --full --data-dir D` with a CIFAR-10 python
archive, SVHN's .mat files, an ImageNet-style folder of PNG images and IWSLT-style parallel text, through
the CLI, on a test-only grid of about 2 cells a study or data set and a few steps each; `--full --dry-run`,
which lists the cells, their data and GPU hours; and the rows of a data set that is not there."""

from __future__ import annotations

import json
import pickle
import tarfile
from dataclasses import replace
from pathlib import Path

import numpy as np
from PIL import Image
from scipy.io import savemat

from fixup.cli import main
from fixup.studies import grid as grid_module
from fixup.studies.claims import NOT_RUN
from fixup.studies.report import claim_rows

TINY_TRANSFORMER = {"d_model": 32, "ffn_dim": 64, "heads": 2, "encoder_layers": 1, "decoder_layers": 1}


def _data_dir(root: Path, *, svhn: bool = True, imagenet: bool = True) -> Path:
    """D/cifar-10-python.tar.gz (the published python archive), D/iwslt14.de-en/{train,valid,test}.{de,en},
    D/svhn/{train,test}_32x32.mat and D/imagenet/{train,val}/<class>/*.png (unless left out)."""
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
    if svhn:  # the published cropped-digits format: X (32, 32, 3, N) uint8, y (N, 1) with labels 1..10
        (data / "svhn").mkdir()
        for split, n in (("train", 16), ("test", 8)):
            savemat(data / "svhn" / f"{split}_32x32.mat",
                    {"X": rng.integers(0, 256, (32, 32, 3, n), dtype=np.uint8),
                     "y": rng.integers(1, 11, (n, 1)).astype(np.uint8)})
    if imagenet:  # class folders of images, decoded with Pillow like the folder reader
        for split, n in (("train", 4), ("val", 2)):
            for c in ("n01440764", "n01443537", "n01484850"):
                folder = data / "imagenet" / split / c
                folder.mkdir(parents=True)
                for k in range(n):
                    pixels = rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)
                    Image.fromarray(pixels).save(folder / f"{c}_{k}.png")
    return data


def _tiny_full(monkeypatch) -> None:
    real = grid_module.make_grid

    def make_grid(mode, **kwargs):  # test-only: the full grid's data paths, ~2 cells a study, a few steps
        g = real(mode, **kwargs)
        assert mode == "full" and g.data == "cifar10" and g.translation.data_dir, "full mode found the data"
        return replace(g, seeds=1,
                       depth=replace(g.depth, depths=(10,), methods=("fixup", "batchnorm"), batch_size=16),
                       svhn=replace(g.svhn, depth=10, width=1, epochs=1, batch_size=8, cutout=8),
                       # a narrow ResNet-50/101 (8 planes first) on 16x16 images: the rows the claims compare
                       imagenet=replace(g.imagenet, width=8, image_size=16, epochs=1, batch_size=6, num_workers=0,
                                        resnet50=("xavier", "fixup", "fixup+mixup"),
                                        resnet101=("groupnorm+mixup", "fixup+mixup")),
                       translation=replace(g.translation, model="transformer_tiny", dropouts=(0.1,), max_updates=3,
                                           warmup_steps=1, max_tokens=256, beam=1,
                                           extra={**g.translation.extra, "vocab_size": 40, "bleu_limit": 0,
                                                  "model": TINY_TRANSFORMER}))

    monkeypatch.setattr(grid_module, "make_grid", make_grid)


def _configs(out: Path, study: str) -> list[dict]:
    return [json.loads(f.read_text()) for f in sorted((out / "cells" / study).rglob("cell_config.json"))]


def test_full_mode_runs_end_to_end_on_real_formats(tmp_path, monkeypatch, capsys):
    data = _data_dir(tmp_path)
    _tiny_full(monkeypatch)
    out = tmp_path / "out"
    code = main(["reproduce", "--full", "--data-dir", str(data), "--only", "depth,paper_data,translation", "--out",
                 str(out), "--yes", "--jobs", "1", "--device", "cpu", "--no-plots"])
    assert code == 0, capsys.readouterr().err
    results = json.loads((out / "results.json").read_text())
    assert results["grid"]["data"] == "cifar10" and results["grid"]["data_dir"].endswith("cifar-10-python.tar.gz")
    assert results["timing"]["cells_run"] == 4 + 2 + 5 + 1 and results["timing"]["cells_failed"] == 0  # + T-Fixup
    depth_cells = results["studies"]["depth"]["methods"]
    assert set(depth_cells) == {"fixup", "batchnorm"}
    for config in _configs(out, "depth"):
        assert config["config"]["train"]["data_dir"].endswith("cifar-10-python.tar.gz")
    table = results["studies"]["translation"]["table"]
    assert set(table) == {"fixup", "layernorm", "t_fixup"}  # T-Fixup's further row, on the real-format files
    config = json.loads(next((out / "cells" / "translation").rglob("cell_config.json")).read_text())
    assert config["config"]["train"]["data_dir"].endswith("iwslt14.de-en")

    summary = results["studies"]["paper_data"]
    assert set(summary["svhn"]) == {"fixup", "batchnorm"}
    assert set(summary["imagenet"]["resnet-50"]) == {"xavier", "fixup", "fixup+mixup"}
    assert set(summary["imagenet"]["resnet-101"]) == {"groupnorm+mixup", "fixup+mixup"}
    trains = [c["config"]["train"] for c in _configs(out, "paper_data")]
    svhn = [t for t in trains if t["dataset"] == "svhn"]
    imagenet = [t for t in trains if t["dataset"] == "folder"]
    assert len(svhn) == 2 and len(imagenet) == 5
    assert all(t["data_dir"] == str(data / "svhn") and t["model"] == "wide_resnet" and t["cutout"] == 8
               and t["mixup_alpha"] > 0 for t in svhn)
    assert all(t["data_dir"] == str(data / "imagenet") and t["model"] == "resnet_imagenet" and t["image_size"] == 16
               for t in imagenet)
    assert sorted(t["depth"] for t in imagenet) == [50, 50, 50, 101, 101]
    assert {t["lr"] for t in imagenet if t["init"] == "xavier"} == {0.01}

    claims = {c["claim"]: c for c in results["claims"]}
    for claim in ("svhn_wrn", "imagenet_resnet50", "imagenet_resnet101"):
        row = claims[claim]
        assert row["verdict"] != NOT_RUN and "(n=1)" in row["ours"], row
        assert "n=1 seeds" in row["scale"] and "epochs" in row["scale"], row
    assert "Wide-ResNet-10 width 1 (wide_resnet)" in claims["svhn_wrn"]["scale"]
    assert "svhn" in claims["svhn_wrn"]["scale"]
    assert "ResNet-50 width 8 (resnet_imagenet), not the paper's ResNet-50" in claims["imagenet_resnet50"]["scale"]
    assert "ResNet-101 width 8" in claims["imagenet_resnet101"]["scale"]
    assert "imagenet at 16x16" in claims["imagenet_resnet101"]["scale"]


def test_rows_of_a_missing_data_set_say_which_folder(tmp_path, capsys):
    data = _data_dir(tmp_path, svhn=False, imagenet=False)
    out = tmp_path / "out"
    assert main(["reproduce", "--full", "--data-dir", str(data), "--only", "paper_data", "--out", str(out), "--yes",
                 "--jobs", "1", "--device", "cpu", "--no-plots"]) == 0, capsys.readouterr().err
    results = json.loads((out / "results.json").read_text())
    assert results["timing"]["cells_run"] == 0 and not (out / "cells").exists()
    claims = {c["claim"]: c for c in results["claims"]}
    assert claims["svhn_wrn"]["verdict"] == NOT_RUN and "has no svhn/" in claims["svhn_wrn"]["why"]
    for claim in ("imagenet_resnet50", "imagenet_resnet101"):
        assert claims[claim]["verdict"] == NOT_RUN and "has no imagenet/" in claims[claim]["why"]
        assert str(data) in claims[claim]["why"]


def test_quick_and_tiny_leave_svhn_and_imagenet_to_full_mode():
    for mode in ("quick", "tiny"):
        grid = grid_module.make_grid(mode)
        assert "paper_data" in grid.skipped and grid.svhn.data_dir is None and grid.imagenet.data_dir is None
        rows = {r.claim: r for r in claim_rows({}, grid.skipped)}
        assert all(rows[c].verdict == NOT_RUN and "full mode only" in rows[c].why
                   for c in ("svhn_wrn", "imagenet_resnet50", "imagenet_resnet101"))


def test_full_dry_run_lists_cells_data_and_gpu_hours(tmp_path, capsys):
    data = _data_dir(tmp_path)
    assert main(["reproduce", "--full", "--data-dir", str(data), "--dry-run", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "depth/fixup/depth=10000/seed2" in out and "cifar-10-python.tar.gz" in out and "iwslt14.de-en" in out
    assert "GPU hours; throughput model: assumed" in out and not (tmp_path / "o" / "cells").exists()
    lines = out.splitlines()
    svhn = [line for line in lines if "paper_data/" in line and "data=svhn" in line]
    imagenet = [line for line in lines if "paper_data/" in line and "data=imagenet" in line]
    assert len(svhn) == 2 * 3 and all(str(data / "svhn") in line for line in svhn)
    assert len(imagenet) == (6 + 4) * 3 and all(str(data / "imagenet") in line for line in imagenet)
    assert any("paper_data/xavier/data=imagenet,net=resnet-50,reg=mixup/seed0" in line for line in imagenet)

    def hours(line: str) -> float:
        return float(line.split("GPU h")[0].split()[-1])

    # a ResNet-50 ImageNet cell (1.28M images at 224x224, 90 epochs) is days of GPU time; ResNet-101 about twice
    r50 = [hours(line) for line in imagenet if "resnet-50" in line]
    r101 = [hours(line) for line in imagenet if "resnet-101" in line]
    assert 50 < min(r50) and 1.8 * max(r50) < min(r101) < 2.2 * max(r50)
    assert max(hours(line) for line in svhn) < min(r50)
