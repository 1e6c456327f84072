"""Checkpoints: nothing runs code from a file, nothing damaged passes as good, the last good one is kept."""

from __future__ import annotations

import ast
import builtins
import os
import struct
import warnings
import zipfile
from pathlib import Path

import pytest
import torch

from fixup.cli import main
from fixup.train import CheckpointError, TrainConfig, fit
from fixup.train.checkpoint import (
    CheckpointWarning,
    load_checkpoint,
    previous_path,
    read_state,
    save_checkpoint,
    state_digest,
)
from fixup.train.engine import CHECKPOINT

ROOT = Path(__file__).resolve().parents[1]
CFG = TrainConfig(depth=8, batch_size=128, epochs=2, schedule="cosine", crop_padding=1)  # 12 steps per epoch


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# -- weights_only everywhere --------------------------------------------------------------------------
def _torch_loads(tree: ast.AST) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "load" and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"]


def _weights_only_true(call: ast.Call) -> bool:
    return any(k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True
               for k in call.keywords)


def test_every_torch_load_in_the_tree_is_weights_only() -> None:
    offenders, seen = [], 0
    for folder in ("src", "benchmarks"):  # what users run (tests may unpickle whole modules they made themselves)
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text())
            imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "torch"
                        for a in n.names]
            assert "load" not in imported, f"{path}: call torch.load by that name so that it is checked"
            for call in _torch_loads(tree):
                seen += 1
                if not _weights_only_true(call):
                    offenders.append(f"{path.relative_to(ROOT)}:{call.lineno}")
    assert seen >= 1  # the walk finds the loads (the checkpoint reader)
    assert not offenders, f"torch.load without weights_only=True at {', '.join(offenders)}"


def test_the_walk_catches_an_unsafe_load() -> None:
    calls = _torch_loads(ast.parse("import torch\ntorch.load(p, weights_only=False)\ntorch.load(p)\n"
                                   "torch.load(p, weights_only=True)\n"))
    assert [_weights_only_true(c) for c in calls] == [False, False, True]


# -- malicious files ------------------------------------------------------------------------------------
class _Payload:
    """Unpickling this calls open(marker, "w"): code from the file would create the marker."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return builtins.open, (self.marker, "w")


def _evil_checkpoint(path: Path, marker: Path) -> Path:
    model = {"w": torch.zeros(2), "payload": _Payload(marker)}
    torch.save({"format": "fixup-train-checkpoint/2", "model": model, "optimizer": {}, "scheduler": {}, "rng": {},
                "config": {}, "position": {}}, path)
    return path


def _run_folder_with(tmp_path: Path, marker: Path) -> Path:
    out = tmp_path / "run"
    out.mkdir()
    _evil_checkpoint(out / CHECKPOINT, marker)
    return out


def _average(tmp_path: Path, marker: Path) -> None:
    from fixup.translation.averaging import average_checkpoints

    average_checkpoints([_evil_checkpoint(tmp_path / "checkpoint_step1.pt", marker)])


def _decode(tmp_path: Path, marker: Path) -> None:
    from fixup.translation.run import load_for_decoding

    load_for_decoding(_run_folder_with(tmp_path, marker))


def _resume(tmp_path: Path, marker: Path) -> None:
    fit(CFG, out_dir=_run_folder_with(tmp_path, marker), progress=False)


def _cli_train(tmp_path: Path, marker: Path) -> None:
    code = main(["train", "--depth", "8", "--epochs", "1", "--no-progress",
                 "--out-dir", str(_run_folder_with(tmp_path, marker))])
    assert code == 2
    raise CheckpointError("the command refused it")  # the CLI turned the error into exit code 2


def _cifar(tmp_path: Path, marker: Path) -> None:
    import pickle

    from fixup.data.image_formats import read_cifar

    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        (folder / name).write_bytes(pickle.dumps({b"data": _Payload(marker), b"labels": [0]}))
    read_cifar(tmp_path, "cifar10")


PATHS = {"load_checkpoint": lambda t, m: load_checkpoint(_evil_checkpoint(t / "c.pt", m)),
         "read_state": lambda t, m: read_state(_evil_checkpoint(t / "c.pt", m)),
         "average_checkpoints": _average, "load_for_decoding": _decode, "fit resume": _resume,
         "fixup train --out-dir": _cli_train, "read_cifar": _cifar}


@pytest.mark.parametrize("loader", list(PATHS))
def test_a_malicious_file_is_refused_and_never_run(loader: str, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    with pytest.raises((CheckpointError, ValueError)):
        PATHS[loader](tmp_path, marker)
    assert not marker.exists(), f"{loader} ran code from the file"


def test_the_payload_would_run_under_a_plain_load(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    torch.load(_evil_checkpoint(tmp_path / "c.pt", marker), weights_only=False)["model"]["payload"].close()
    assert marker.exists()  # the payload is real: what the tests above refuse would have run


# -- digests, bit flips and the previous good checkpoint ---------------------------------------------
def _tensor_data_offset(path: Path) -> int:
    """Byte offset of the middle of the largest tensor's data inside a torch zip checkpoint."""
    with zipfile.ZipFile(path) as zf:
        info = max((i for i in zf.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    with open(path, "rb") as fh:
        fh.seek(info.header_offset)
        header = fh.read(30)
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    return info.header_offset + 30 + name_len + extra_len + info.file_size // 2


def _flip(path: Path, nbytes: int) -> None:
    data = bytearray(path.read_bytes())
    at = _tensor_data_offset(path)
    if nbytes == 0:
        data[at] ^= 0x01  # one bit
    else:
        data[at:at + nbytes] = bytes(b ^ 0xFF for b in data[at:at + nbytes])
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("nbytes", [0, 16])
def test_a_flipped_bit_is_detected(tmp_path: Path, nbytes: int) -> None:
    path = tmp_path / "c.pt"
    save_checkpoint(path, {"model": {"w": torch.randn(1000)}, "optimizer": {}, "scheduler": {}, "rng": {},
                           "config": {}, "position": {}})
    assert load_checkpoint(path)["model"]["w"].shape == (1000,)
    _flip(path, nbytes)
    torch.load(path, weights_only=True)  # the file still unpickles: only the digest sees the change
    with pytest.raises(CheckpointError, match=r"c\.pt is damaged: its contents do not match their SHA-256 digest"):
        load_checkpoint(path)


def test_digest_covers_values_dtypes_and_structure() -> None:
    base = {"a": torch.zeros(3), "b": [1, 2.0, "x"], "c": None}
    d = state_digest(base)
    assert state_digest({**base, "sha256": "ignored"}) == d
    for changed in ({**base, "a": torch.zeros(3, dtype=torch.float64)}, {**base, "a": torch.zeros(1, 3)},
                    {**base, "b": [1, 2, "x"]}, {**base, "b": (1, 2.0, "x")}, {**base, "c": 0}):
        assert state_digest(changed) != d


def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_good_one(tmp_path: Path) -> None:
    straight = fit(CFG, progress=False)
    out = tmp_path / "run"
    first = fit(CFG, out_dir=out, progress=False, on_step=lambda s: s.step == 17)  # mid-way through epoch 2
    assert first.outcome == "interrupted"
    prev = previous_path(out / CHECKPOINT)
    assert load_checkpoint(prev)["position"] == {"epoch": 1, "batch": 0, "step": 12}  # end of epoch 1, kept
    _flip(out / CHECKPOINT, 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = fit(CFG, out_dir=out, progress=False)
    notes = [str(w.message) for w in caught if issubclass(w.category, CheckpointWarning)]
    assert len(notes) == 1 and "checkpoint.pt is damaged" in notes[0] and "checkpoint.prev.pt" in notes[0]
    assert "\n" not in notes[0]
    assert (out / "checkpoint.pt.bad").exists()
    assert resumed.outcome == "completed"
    a, b = _weights(straight.model), _weights(resumed.model)
    assert all(torch.equal(a[k], b[k]) for k in a)  # resuming from the previous checkpoint is still exact


def test_the_cli_names_the_damaged_checkpoint_in_one_line(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    args = ["train", "--depth", "8", "--batch-size", "128", "--epochs", "2", "--no-progress", "--out-dir", str(out)]
    fit(TrainConfig(depth=8, batch_size=128, epochs=2), out_dir=out, progress=False, on_step=lambda s: s.step == 15)
    _flip(out / CHECKPOINT, 0)
    assert main(args) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if "CheckpointWarning" in line]
    assert len(err) == 1 and str(out / CHECKPOINT) in err[0] and "resumed from the previous good" in err[0]


def test_no_good_checkpoint_is_an_error_and_files_stay(tmp_path: Path) -> None:
    out = tmp_path / "run"
    fit(CFG, out_dir=out, progress=False, on_step=lambda s: s.step == 15)
    _flip(out / CHECKPOINT, 0)
    _flip(previous_path(out / CHECKPOINT), 0)
    before = {p.name: p.read_bytes() for p in out.glob("checkpoint*")}
    with pytest.raises(CheckpointError, match=r"checkpoint\.pt is damaged"):
        fit(CFG, out_dir=out, progress=False)
    assert {p.name: p.read_bytes() for p in out.glob("checkpoint*")} == before


def test_stale_temporaries_are_removed_at_start(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    dead = out / ".checkpoint.pt.999999999.tmp"  # no such process
    mine = out / f".checkpoint.pt.{os.getpid()}.tmp"  # this process writes one file at a time: stale too
    alive = out / f".checkpoint.pt.{os.getppid()}.tmp"  # a running writer's file is left alone
    for p in (dead, mine, alive):
        p.write_bytes(b"half a checkpoint")
    fit(TrainConfig(depth=8, batch_size=256, epochs=1), out_dir=out, progress=False)
    assert not dead.exists() and not mine.exists() and alive.exists()
    assert sorted(p.name for p in out.glob(".*.tmp")) == [alive.name]


def _edit(path: Path, change) -> None:
    state = load_checkpoint(path)
    change(state)
    save_checkpoint(path, {k: v for k, v in state.items() if k not in ("format", "sha256")})


# Each edit, and what the one-line error must say: the edited field, and the bad value or key where there is one.
EDITS = {
    "position is text": (lambda s: s["position"].update(step="x"), ("'position' field", "'x'")),
    "position beyond the run": (lambda s: s["position"].update(step=10**9), ("'position' field", "1000000000")),
    "model tensor reshaped": (
        lambda s: s["model"].update({k: v.flatten() for k, v in list(s["model"].items())[:1]}),
        ("'model' field", "size mismatch for conv1.weight")),
    "rng state missing": (lambda s: s["rng"].pop("numpy"), ("'rng' field", "'numpy'")),
    "optimizer state is a list": (lambda s: s.update(optimizer=[]), ("'optimizer' field",)),
    "config is a list": (lambda s: s.update(config=[1]), ("no readable config",)),
}


@pytest.fixture(scope="module")
def interrupted_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("edits") / "run"
    fit(TrainConfig(depth=8, batch_size=256, epochs=2), out_dir=out, progress=False, on_step=lambda s: s.step == 7)
    previous_path(out / CHECKPOINT).unlink()
    return out


@pytest.mark.parametrize("edit", list(EDITS))
def test_hand_edited_checkpoint_fields_are_one_line_errors(edit: str, interrupted_run: Path, tmp_path: Path,
                                                           capsys) -> None:
    import shutil

    out = tmp_path / "run"
    shutil.copytree(interrupted_run, out)
    change, expected = EDITS[edit]
    _edit(out / CHECKPOINT, change)
    code = main(["train", "--depth", "8", "--batch-size", "256", "--epochs", "2", "--no-progress",
                 "--out-dir", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and err.startswith(f"fixup train: error: checkpoint {out / CHECKPOINT} ")
    for text in expected:
        assert text in err, f"{edit}: {text!r} not in {err!r}"


def test_checkpoints_without_a_digest_from_the_first_format_still_load(tmp_path: Path) -> None:
    path = tmp_path / "old.pt"
    torch.save({"format": "fixup-train-checkpoint/1", "model": {}, "optimizer": {}, "scheduler": {}, "rng": {},
                "config": {}, "position": {}}, path)
    assert load_checkpoint(path)["format"] == "fixup-train-checkpoint/1"
    torch.save({"format": "fixup-train-checkpoint/2", "model": {}, "optimizer": {}, "scheduler": {}, "rng": {},
                "config": {}, "position": {}}, path)
    with pytest.raises(CheckpointError, match="has no sha256 digest"):
        load_checkpoint(path)
