"""Image data: digits, the CIFAR/SVHN/folder readers on tiny files in each format, augmentation, sharding."""

from __future__ import annotations

import math
import pickle
import tarfile

import numpy as np
import pytest
import torch

from fixup.data import load_images, normalize, random_crop, random_flip, resize_images
from fixup.train import Shard, TrainConfig
from fixup.train.image_task import ImageClassification


def test_digits_split_is_stratified_and_fixed_by_seed() -> None:
    a, b = load_images("digits"), load_images("digits")
    c = load_images("digits", split_seed=1)
    assert len(a.train) + len(a.test) == 1797 and len(a.test) == 360
    assert torch.equal(a.test.labels, b.test.labels) and torch.equal(a.test.images, b.test.images)
    assert not torch.equal(a.test.images, c.test.images)
    counts = torch.bincount(a.test.labels, minlength=10)
    assert counts.min() >= 35 and counts.max() <= 37  # 10% of each class of ~180
    assert a.train.images.shape[1:] == (1, 8, 8) and 0 <= a.train.images.min() and a.train.images.max() <= 1


def test_digits_resize_pad_and_channels() -> None:
    base = load_images("digits")
    padded = load_images("digits", image_size=12, resize="pad", channels=3)
    assert padded.train.images.shape[1:] == (3, 12, 12) and padded.in_channels == 3 and len(padded.mean) == 3
    assert torch.equal(padded.train.images[:, 0, 2:10, 2:10], base.train.images[:, 0])
    assert padded.train.images[:, :, :2].abs().sum() == 0
    assert load_images("digits", image_size=32).train.images.shape[1:] == (1, 32, 32)


def _cifar_batch(n: int, key: bytes, num_classes: int, seed: int) -> tuple[dict, np.ndarray]:
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
    return {b"data": data, key: [int(v) for v in rng.integers(0, num_classes, n)]}, data


def _write_cifar10(root, n: int = 4) -> np.ndarray:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    first = None
    for i, name in enumerate([f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]):
        batch, data = _cifar_batch(n, b"labels", 10, i)
        first = data if first is None else first
        (folder / name).write_bytes(pickle.dumps(batch))
    return first


def test_cifar10_folder_and_archive(tmp_path) -> None:
    first = _write_cifar10(tmp_path / "x")
    data = load_images("cifar10", data_dir=tmp_path / "x")
    assert len(data.train) == 20 and len(data.test) == 4 and data.num_classes == 10 and data.image_size == 32
    x, _ = data.train.batch(torch.tensor([0]))
    # Rows are 1024 red, 1024 green, 1024 blue values, each 32 rows of 32 pixels.
    assert torch.allclose(x[0], torch.from_numpy(first[0].reshape(3, 32, 32)).float() / 255)
    assert load_images("cifar10", data_dir=tmp_path / "x").train.images is data.train.images  # cached
    batch, _ = _cifar_batch(4, b"labels", 10, seed=99)
    (tmp_path / "x" / "cifar-10-batches-py" / "data_batch_1").write_bytes(pickle.dumps(batch))
    changed = load_images("cifar10", data_dir=tmp_path / "x")
    assert torch.equal(changed.train.images[0].flatten(), torch.from_numpy(batch[b"data"][0]))
    data = load_images("cifar10", data_dir=tmp_path / "x")
    archive = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "x" / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    from_tar = load_images("cifar10", data_dir=archive)
    assert torch.equal(from_tar.train.images, data.train.images)
    assert torch.equal(from_tar.test.labels, data.test.labels)


def test_cifar100_reads_fine_labels(tmp_path) -> None:
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    for i, name in enumerate(("train", "test")):
        batch, _ = _cifar_batch(3, b"fine_labels", 100, i)
        batch[b"coarse_labels"] = [0, 0, 0]
        (folder / name).write_bytes(pickle.dumps(batch))
    data = load_images("cifar100", data_dir=tmp_path)
    assert data.num_classes == 100 and len(data.train) == 3
    assert data.train.labels.tolist() == pickle.loads((folder / "train").read_bytes())[b"fine_labels"]


def test_cifar_broken_files_are_clear_errors(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match=r"does not exist; expected cifar-10-python\.tar\.gz"):
        load_images("cifar10", data_dir=tmp_path / "nowhere")
    _write_cifar10(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").write_bytes(b"\x80\x04garbage")
    with pytest.raises(ValueError, match="data_batch_3 is not a readable CIFAR batch"):
        load_images("cifar10", data_dir=tmp_path)
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").write_bytes(pickle.dumps({b"data": np.zeros((2, 5), np.uint8),
                                                                                  b"labels": [0, 1]}))
    with pytest.raises(ValueError, match="rows of 3072 values"):
        load_images("cifar10", data_dir=tmp_path)
    (tmp_path / "cifar-10-batches-py" / "test_batch").unlink()
    with pytest.raises(FileNotFoundError, match="lacks test_batch"):
        load_images("cifar10", data_dir=tmp_path)
    bad_tar = tmp_path / "broken.tar.gz"
    bad_tar.write_bytes(b"not a tar file")
    with pytest.raises(ValueError, match=r"broken\.tar\.gz is not a readable tar archive"):
        load_images("cifar10", data_dir=bad_tar)
    with pytest.raises(ValueError, match="pass data_dir"):
        load_images("cifar10")


def test_cifar_reader_refuses_foreign_pickles(tmp_path) -> None:
    _write_cifar10(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "data_batch_1").write_bytes(pickle.dumps({b"data": tarfile.TarInfo()}))
    with pytest.raises(ValueError, match=r"unexpected object tarfile\.TarInfo"):
        load_images("cifar10", data_dir=tmp_path)


def test_svhn_mat_files(tmp_path) -> None:
    from scipy.io import savemat

    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (32, 32, 3, 5), dtype=np.uint8)
    savemat(tmp_path / "train_32x32.mat", {"X": x, "y": np.array([[10], [1], [2], [3], [9]], dtype=np.uint8)})
    savemat(tmp_path / "test_32x32.mat", {"X": x[..., :2], "y": np.array([[4], [10]], dtype=np.uint8)})
    data = load_images("svhn", data_dir=tmp_path)
    assert data.train.labels.tolist() == [0, 1, 2, 3, 9] and data.test.labels.tolist() == [4, 0]
    assert torch.equal(data.train.images[1], torch.from_numpy(x[..., 1]).permute(2, 0, 1))
    (tmp_path / "test_32x32.mat").write_bytes(b"MATLAB 5.0 MAT-file, broken")
    with pytest.raises(ValueError, match=r"test_32x32\.mat is not a readable MATLAB file"):
        load_images("svhn", data_dir=tmp_path)
    savemat(tmp_path / "test_32x32.mat", {"X": x[..., :2]})
    with pytest.raises(ValueError, match=r"must hold X \(32, 32, 3, N\) and y"):
        load_images("svhn", data_dir=tmp_path)
    (tmp_path / "train_32x32.mat").unlink()
    with pytest.raises(FileNotFoundError, match=r"train_32x32\.mat does not exist"):
        load_images("svhn", data_dir=tmp_path)


def _write_folder(root) -> None:
    from PIL import Image

    for split, n in (("train", 3), ("val", 1)):
        for k, cls in enumerate(("cat", "dog")):
            (root / split / cls).mkdir(parents=True)
            for i in range(n):
                Image.new("RGB", (10 + i, 7), (40 * k, 100, 200)).save(root / split / cls / f"{i}.png")


def test_image_folder(tmp_path) -> None:
    _write_folder(tmp_path)
    data = load_images("folder", data_dir=tmp_path, image_size=8)
    assert data.classes == ["cat", "dog"] and len(data.train) == 6 and len(data.test) == 2
    x, y = data.train[4]
    assert x.shape == (3, 8, 8) and int(y) == 1
    assert torch.allclose(x[:, 3, 3], torch.tensor([40, 100, 200]) / 255, atol=1 / 255)
    task = ImageClassification(TrainConfig(dataset="folder", data_dir=str(tmp_path), image_size=8, batch_size=4,
                                           num_workers=1))
    batches = list(task.train_batches(0, Shard()))
    assert [b[0].shape for b in batches] == [(4, 3, 8, 8), (2, 3, 8, 8)]
    (tmp_path / "train" / "dog" / "1.png").write_bytes(b"not an image")
    with pytest.raises(ValueError, match=r"cannot decode image .*dog/1\.png"):
        _ = load_images("folder", data_dir=tmp_path, image_size=8).train[4]
    (tmp_path / "val").rename(tmp_path / "elsewhere")
    with pytest.raises(FileNotFoundError, match="lacks a train/ and a val/"):
        load_images("folder", data_dir=tmp_path)


def test_image_folder_size_comes_from_its_images_unless_asked(tmp_path) -> None:
    _write_folder(tmp_path)  # images of 10x7 to 12x7 pixels
    data = load_images("folder", data_dir=tmp_path)
    assert data.image_size == 10 and data.train[0][0].shape == (3, 10, 10)  # not silently 224
    assert load_images("folder", data_dir=tmp_path, image_size=16).train[0][0].shape == (3, 16, 16)


def test_an_empty_class_folder_is_an_error_naming_it(tmp_path) -> None:
    _write_folder(tmp_path)
    (tmp_path / "train" / "emu").mkdir()
    with pytest.raises(ValueError, match=r"class folder\(s\) .*train/emu hold no image files"):
        load_images("folder", data_dir=tmp_path)


def test_random_crop_takes_a_window_of_the_padded_image() -> None:
    x = torch.arange(2 * 3 * 6 * 6, dtype=torch.float32).view(2, 3, 6, 6) + 1
    out = random_crop(x, 2, torch.Generator().manual_seed(0))
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    for b in range(2):
        windows = [(dy, dx) for dy in range(5) for dx in range(5)
                   if torch.equal(padded[b, :, dy:dy + 6, dx:dx + 6], out[b])]
        assert len(windows) == 1
    again = random_crop(x, 2, torch.Generator().manual_seed(0))
    assert torch.equal(out, again)
    flipped = random_flip(x, torch.Generator().manual_seed(0), p=1.0)
    assert torch.equal(flipped, x.flip(3))
    expected = torch.tensor([1.0, 3.0]).view(1, 2, 1, 1)
    assert torch.allclose(normalize(torch.ones(1, 2, 1, 1), (0.5, 0.25), (0.5, 0.25)), expected)
    assert resize_images(x, 12).shape == (2, 3, 12, 12)


def test_epoch_stream_is_deterministic_and_shards_cover_the_global_batch() -> None:
    cfg = TrainConfig(batch_size=64, crop_padding=0)
    task = ImageClassification(cfg)
    one = list(task.train_batches(0, Shard()))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(one, task.train_batches(0, Shard())))
    assert not torch.equal(one[0][1], next(iter(task.train_batches(1, Shard())))[1])
    r0, r1 = task.train_batches(0, Shard(0, 2)), task.train_batches(0, Shard(1, 2))
    for (x, y, _), (x0, y0, _), (x1, y1, _) in list(zip(one, r0, r1))[:-1]:
        assert x0.shape[0] == x1.shape[0] == 32
        key = lambda xs: sorted(map(tuple, xs.flatten(1).tolist()))  # noqa: E731
        assert key(torch.cat([x0, x1])) == key(x)
        assert sorted(torch.cat([y0, y1]).tolist()) == sorted(y.tolist())


def test_training_on_a_cifar_fixture_runs_every_augmentation(tmp_path) -> None:
    from fixup.train import fit

    _write_cifar10(tmp_path, n=8)
    cfg = TrainConfig(dataset="cifar10", data_dir=str(tmp_path), depth=8, width=4, epochs=1, batch_size=16,
                      cutout=8, mixup_alpha=0.7, scalar_lr_mult=0.1)
    result = fit(cfg, out_dir=tmp_path / "run", progress=False)
    assert result.outcome == "completed" and result.final["step"] == 3
    assert result.task["crop_padding"] == 4 and result.task["hflip"] is True  # CIFAR's defaults, as logged
    assert {g["name"]: g["lr"] for g in result.param_groups} == pytest.approx(
        {"weights": 0.1, "scalars": 0.01, "stream_biases": 0.01 / 3})  # ResNet-8: three stream biases share 0.01


def _first_batch(root, **augment) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, ImageClassification]:
    cfg = TrainConfig(dataset="cifar10", data_dir=str(root), batch_size=16, **augment)
    task = ImageClassification(cfg)
    return (*next(iter(task.train_batches(0, Shard()))), task)


def _window(img: torch.Tensor, fill: torch.Tensor, pad: int, dy: int, dx: int) -> torch.Tensor:
    """``img`` on a ``fill``-valued canvas padded by ``pad``, cut back to its size at offset (dy, dx)."""
    c, h, w = img.shape
    canvas = fill[:, None, None].expand(c, h + 2 * pad, w + 2 * pad).clone()
    canvas[:, pad:pad + h, pad:pad + w] = img
    return canvas[:, dy:dy + h, dx:dx + w]


def test_cifar_crop_flip_cutout_and_mixup_each_change_the_batch_as_they_should(tmp_path) -> None:
    # One generator per epoch draws crop, then flip, then Cutout, then Mixup for each batch, so the first batch of
    # each configuration is the previous configuration's first batch with one more augmentation applied.
    _write_cifar10(tmp_path, n=8)
    raw, y, _, task = _first_batch(tmp_path, crop_padding=0, hflip="off")
    mean, std = torch.tensor(task.data.mean), torch.tensor(task.data.std)
    black = -mean / std  # the zero padding, normalised
    cropped, y_crop, _, _ = _first_batch(tmp_path, crop_padding=4, hflip="off")
    assert torch.equal(y_crop, y)
    offsets = []
    for r, c in zip(raw, cropped, strict=True):  # each image is its original shifted within 4 pixels, padded black
        found = [(dy, dx) for dy in range(9) for dx in range(9)
                 if torch.allclose(_window(r, black, 4, dy, dx), c, atol=1e-6)]
        assert found, "a cropped image is no shift of its original"
        offsets.append(found[0])
    assert len(set(offsets)) > 1 and any(o != (4, 4) for o in offsets)
    flipped, _, _, _ = _first_batch(tmp_path, crop_padding=4, hflip="on")
    mirrored = [torch.equal(f, c.flip(2)) and not torch.equal(f, c) for f, c in zip(flipped, cropped, strict=True)]
    assert all(m or torch.equal(f, c) for m, f, c in zip(mirrored, flipped, cropped, strict=True))
    assert 0 < sum(mirrored) < len(mirrored)  # some mirrored left-right, the others untouched
    cut, _, _, _ = _first_batch(tmp_path, crop_padding=4, hflip="on", cutout=8)
    full_squares = 0
    for k, f in zip(cut, flipped, strict=True):
        changed = (k != f).any(0)  # (H, W)
        assert (k[:, changed] == 0).all() and torch.equal(k[:, ~changed], f[:, ~changed])  # only zeroes written
        zeroed = (k == 0).all(0) & ((f != 0).any(0) | changed)
        rows, cols = zeroed.any(1).nonzero().flatten(), zeroed.any(0).nonzero().flatten()
        # one axis-aligned square of side 8, clipped where it meets the border
        assert 1 <= len(rows) <= 8 and 1 <= len(cols) <= 8
        assert zeroed[rows.min():rows.max() + 1, cols.min():cols.max() + 1].all()
        assert zeroed.sum() == len(rows) * len(cols) and rows.max() - rows.min() + 1 == len(rows)
        full_squares += int(len(rows) == len(cols) == 8)
    assert full_squares > 0
    mixed, y_mix, targets, _ = _first_batch(tmp_path, crop_padding=4, hflip="on", cutout=8, mixup_alpha=0.7)
    onehot = torch.nn.functional.one_hot(y, 10).float()
    # Mixup's lam, read from a row whose two labels differ: its own label carries exactly lam.
    two = [i for i in range(len(y)) if targets[i].max() < 1]
    assert two, "no image was mixed with a partner of another class"
    lam = targets[two[0], y[two[0]]].item()
    assert 0 < lam < 1
    partners = []
    for i, m in enumerate(mixed):  # each image is lam * itself + (1 - lam) * one partner, one lam for the batch
        hits = [j for j in range(len(cut)) if torch.allclose(m, lam * cut[i] + (1 - lam) * cut[j], atol=1e-5)]
        assert hits, f"image {i} is no mixture of the cut-out batch with lam {lam}"
        partners.append(hits[0])
        torch.testing.assert_close(targets[i], lam * onehot[i] + (1 - lam) * onehot[hits[0]])
    assert sorted(partners) == list(range(len(cut))) and partners != list(range(len(cut)))  # a permutation
    assert torch.equal(y_mix, targets.argmax(1))


def test_split_validation_holds_out_a_stratified_fixed_part_of_the_training_set_only() -> None:
    from fixup.data import split_validation

    data = load_images("digits")
    parts = split_validation(data, 0.2, seed=0)
    n = len(data.train)
    assert len(parts.train) + len(parts.test) == n and len(parts.test) == math.ceil(0.2 * n)  # scikit-learn rounds up
    # stratified: every class keeps about its share in the validation part
    counts = torch.bincount(parts.test.labels, minlength=10).float() / len(parts.test)
    assert torch.allclose(counts, torch.bincount(data.train.labels, minlength=10).float() / n, atol=0.02)
    # disjoint, drawn from the training set, and fixed by the seed
    rows = {tuple(x.flatten().tolist()) for x in parts.train.images} & {tuple(x.flatten().tolist())
                                                                        for x in parts.test.images}
    assert len(rows) < 5  # digits holds a few duplicate images; the parts share no index
    again = split_validation(data, 0.2, seed=0)
    assert torch.equal(again.test.labels, parts.test.labels) and torch.equal(again.test.images, parts.test.images)
    assert not torch.equal(split_validation(data, 0.2, seed=1).test.images, parts.test.images)
    assert split_validation(data, 0.2, seed=0, limit=100).train.labels.shape == (100,)
    with pytest.raises(ValueError, match="fraction"):
        split_validation(data, 1.5)
