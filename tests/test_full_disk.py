"""A disk that fills while a checkpoint is written: one line and exit 2 from `train`, `translate` and the study
runner (which stops instead of recording a cell bug), the previous checkpoint intact, and the run resumes from it.

torch's serializer turns a failed write into ``RuntimeError: [enforce fail at inline_container.cc] unexpected
pos``; these tests fill the disk in the middle of ``torch.save``: with a fake file that runs out of room after
1,000 bytes (the RuntimeError path, every time), and with a real file-size limit in a subprocess (RLIMIT_FSIZE,
SIGXFSZ ignored, so that the kernel's short write and EFBIG reach torch; there, whether the RuntimeError or the
OSError of closing the file comes out last depends on what Python's buffer still holds).
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import fixup._io as fio
from fixup._io import atomic_write, full_disk_error
from fixup.cli import main
from fixup.studies import Cell, Store, Task, _common, run_tasks
from fixup.train.checkpoint import load_checkpoint, save_checkpoint

TRAIN = ["train", "--depth", "8", "--batch-size", "256", "--epochs", "2", "--no-progress", "--device", "cpu"]
TRANSLATE_EXTRA = ('{"synthetic_train": 200, "synthetic_eval": 20, "vocab_size": 150, "bleu_limit": 0, "model": '
                   '{"d_model": 32, "ffn_dim": 64, "heads": 2, "encoder_layers": 1, "decoder_layers": 1}}')


class _Full:
    """A binary file with ``room`` bytes left on its disk: a write past them writes what fits, then ENOSPC."""

    def __init__(self, fh: Any, room: int) -> None:
        self._fh, self.room = fh, room

    def write(self, data: Any) -> int:
        data = memoryview(data).cast("B")
        n = min(self.room, data.nbytes)
        self._fh.write(data[:n])
        self.room -= n
        if n < data.nbytes:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return n

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fh, name)

    def __enter__(self) -> _Full:
        return self

    def __exit__(self, *exc: object) -> None:
        self._fh.close()


@pytest.fixture
def disk_fills_on(monkeypatch):
    """``disk_fills_on(n)``: the n-th checkpoint written from now on meets a full disk 1,000 bytes in (mid
    ``torch.save``); returns the list of checkpoint files opened, to check that the n-th was reached.
    ``disk_fills_on(None)``: room again."""
    opened: list[str] = []

    def arm(n: int | None) -> list[str]:
        opened.clear()
        if n is None:
            monkeypatch.delattr(fio, "open", raising=False)
            return opened

        def fake_open(file: Any, mode: str = "r", **kwargs: Any) -> Any:
            fh = open(file, mode, **kwargs)
            if mode == "wb" and ".pt." in Path(file).name:
                opened.append(Path(file).name)
                if len(opened) == n:
                    return _Full(fh, 1000)
            return fh

        monkeypatch.setattr(fio, "open", fake_open, raising=False)
        return opened

    return arm


def _one_line(err: str) -> str:
    assert "Traceback" not in err and "RuntimeError" not in err and "inline_container" not in err, err
    lines = [line for line in err.splitlines() if line.strip() and "Warning" not in line]
    assert len(lines) == 1, err
    return lines[0]


def _temporaries(folder: Path) -> list[Path]:
    return list(folder.rglob(".*.tmp"))


def test_atomic_write_raises_the_write_error_that_torch_wraps(tmp_path: Path, disk_fills_on) -> None:
    target = tmp_path / "state.pt"
    save_checkpoint(target, {"w": torch.arange(10_000.0)})
    before = target.read_bytes()
    disk_fills_on(1)
    with pytest.raises(OSError) as caught:
        save_checkpoint(target, {"w": torch.zeros(10_000)})
    assert caught.value.errno == errno.ENOSPC
    assert isinstance(caught.value.__cause__, OSError)  # the write's own error, raised in place of torch's
    assert str(target) in str(caught.value) and "state.pt there is unchanged" in str(caught.value)
    assert target.read_bytes() == before and not _temporaries(tmp_path)
    assert torch.equal(torch.load(target, weights_only=True)["w"], torch.arange(10_000.0))


def test_other_errors_inside_atomic_write_are_left_alone(tmp_path: Path) -> None:
    with pytest.raises(KeyError):
        with atomic_write(tmp_path / "x.txt") as fh:
            fh.write("some text")
            raise KeyError("not a disk error")
    assert not (tmp_path / "x.txt").exists() and not _temporaries(tmp_path)


def test_full_disk_error_follows_the_chain() -> None:
    inner = OSError(errno.EDQUOT, "Disk quota exceeded")
    try:
        try:
            raise inner
        except OSError as err:
            raise RuntimeError("unexpected pos 496 vs 466") from err
    except RuntimeError as wrapped:
        assert full_disk_error(wrapped) is inner
    assert full_disk_error(OSError(errno.EACCES, "Permission denied")) is None
    assert full_disk_error(RuntimeError("no cause")) is None


def test_train_second_checkpoint_on_a_full_disk_is_one_line_and_resumes(tmp_path: Path, disk_fills_on, capsys,
                                                                         one_thread) -> None:
    out = tmp_path / "run"
    opened = disk_fills_on(2)  # epoch 1's checkpoint is written, epoch 2's meets the full disk
    assert main([*TRAIN, "--out-dir", str(out)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert len(opened) == 2
    assert line.startswith("fixup train: error: [Errno 28] No space left on device while writing ")
    assert str(out / "checkpoint.pt") in line and "checkpoint.pt there is unchanged" in line
    assert load_checkpoint(out / "checkpoint.pt")["position"]["epoch"] == 1  # the previous one, intact
    assert not _temporaries(out)
    disk_fills_on(None)  # room again
    assert main([*TRAIN, "--out-dir", str(out)]) == 0
    assert load_checkpoint(out / "checkpoint.pt")["position"]["epoch"] == 2


_LIMITED = """
import os, resource, signal, sys
import fixup.train.engine as engine
from fixup.cli import main

real = engine.save_checkpoint

def save_then_limit(path, *args, **kwargs):  # after the first checkpoint, files may grow to half its size
    real(path, *args, **kwargs)
    resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(path) // 2, resource.RLIM_INFINITY))

engine.save_checkpoint = save_then_limit
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the kernel then returns a short write and EFBIG
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_FSIZE is POSIX")
def test_train_under_a_real_file_size_limit_is_one_line(tmp_path: Path, capsys, one_thread) -> None:
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", _LIMITED, *TRAIN, "--out-dir", str(out)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stderr
    line = _one_line(proc.stderr)
    assert line.startswith("fixup train: error: [Errno 27] File too large while writing "), line
    assert "checkpoint.pt there is unchanged" in line and "ulimit -f" in line
    assert load_checkpoint(out / "checkpoint.pt")["position"]["epoch"] == 1
    assert main([*TRAIN, "--out-dir", str(out)]) == 0
    capsys.readouterr()


def test_translate_second_checkpoint_on_a_full_disk_is_one_line(tmp_path: Path, disk_fills_on, capsys,
                                                                one_thread) -> None:
    out = tmp_path / "run"
    argv = ["translate", "--out-dir", str(out), "--max-tokens", "512", "--epochs", "2", "--warmup-steps", "1",
            "--device", "cpu", "--no-progress", "--beam", "1", "--extra", TRANSLATE_EXTRA]  # 13 updates an epoch
    opened = disk_fills_on(2)
    assert main(argv) == 2
    line = _one_line(capsys.readouterr().err)
    assert len(opened) == 2
    assert line.startswith("fixup translate: error: [Errno 28] No space left on device while writing "), line
    assert not _temporaries(out) and not (out / "test.hyp").exists()  # stopped before decoding
    assert load_checkpoint(out / "checkpoint.pt")["position"]["epoch"] == 1
    disk_fills_on(None)
    assert main(argv) == 0


def _depth_cell(seed: int) -> Task:
    train = {"task": "images", "dataset": "digits", "model": "wide_resnet", "depth": 10, "width": 1,
             "norm": "fixup", "seed": seed, "lr": 0.1, "batch_size": 256, "epochs": 1, "schedule": "constant",
             "device": "cpu", "checkpoint": True}
    return Task(Cell("depth", "fixup", {"depth": 10}, seed, config={"train": train}), _common.train_cell)


def test_a_study_stops_on_a_full_disk_instead_of_recording_a_cell_bug(tmp_path: Path, disk_fills_on,
                                                                      monkeypatch, one_thread) -> None:
    monkeypatch.setattr(_common, "SEGMENT_SECONDS", 0.0)  # a checkpoint after every step
    monkeypatch.setattr(_common, "SEGMENT_OVERHEAD", 0.0)
    tasks = [_depth_cell(0), _depth_cell(1)]
    root = tmp_path / "store"
    opened = disk_fills_on(2)
    with pytest.raises(OSError) as caught:
        run_tasks(tasks, root, jobs=1)
    assert caught.value.errno == errno.ENOSPC and len(opened) == 2
    assert not list(root.rglob("cell_error.json"))  # not recorded as the cell's bug
    store = Store(root)
    assert not any(store.is_done(t.cell) for t in tasks)
    assert len(list(root.rglob("checkpoint.pt"))) == 1  # the second cell never started
    disk_fills_on(None)
    summary = run_tasks(tasks, root, jobs=1)
    assert not summary.failed and all(store.is_done(t.cell) for t in tasks)


def wrapped_full_disk_cell(cell: Cell, work: Path) -> dict:
    """A cell whose disk is full, as torch reports it (the write's OSError wrapped in a RuntimeError)."""
    if cell.setting["x"] == 0:
        try:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError as err:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0") from err
    return {"value": 1}


def test_parallel_workers_stop_the_study_on_a_full_disk_too(tmp_path: Path) -> None:
    tasks = [Task(Cell("fake", "m", {"x": x}, 0), wrapped_full_disk_cell) for x in range(2)]
    with pytest.raises(OSError) as caught:
        run_tasks(tasks, tmp_path / "store", jobs=2)
    assert caught.value.errno == errno.ENOSPC
    assert not list((tmp_path / "store").rglob("cell_error.json"))
