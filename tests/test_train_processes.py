"""The engine across real processes: a killed run resumes bit-exactly; torchrun matches one process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fixup.train.checkpoint import load_checkpoint

SRC = str(Path(__file__).resolve().parents[1] / "src")
ARGS = ["--depth", "8", "--batch-size", "32", "--epochs", "2", "--schedule", "cosine", "--crop-padding", "1",
        "--mixup-alpha", "0.4", "--no-progress"]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}


def _train(out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "fixup", "train", *ARGS, "--out-dir", str(out), *extra],
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _model(out: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(out / "checkpoint.pt")["model"]


def _metrics(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "time_s"} for r in rows]


@pytest.mark.slow  # three processes, each importing torch: about 20 s of CPU
def test_sigterm_then_resume_equals_straight_run(tmp_path) -> None:
    straight, killed = _train(tmp_path / "straight"), _train(tmp_path / "killed")
    deadline = time.monotonic() + 120
    while not (tmp_path / "killed" / "metrics.jsonl").exists():  # the first epoch is done and checkpointed
        assert killed.poll() is None and time.monotonic() < deadline, killed.communicate()[0]
        time.sleep(0.02)
    killed.send_signal(signal.SIGTERM)
    out = killed.communicate(timeout=120)[0]
    assert killed.returncode == 143, out  # interrupted by SIGTERM, mid-way through epoch 2
    state = load_checkpoint(tmp_path / "killed" / "checkpoint.pt")
    assert state["position"]["epoch"] == 1 and state["outcome"]["status"] == "interrupted"
    resumed = _train(tmp_path / "killed")
    assert resumed.wait(timeout=300) == 0 and straight.wait(timeout=300) == 0
    a, b = _model(tmp_path / "straight"), _model(tmp_path / "killed")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert _metrics(tmp_path / "straight") == _metrics(tmp_path / "killed")


@pytest.mark.slow  # torchrun plus three processes: about 25 s of CPU
def test_torchrun_two_processes_match_one(tmp_path) -> None:
    common = ["--depth", "8", "--epochs", "2", "--batch-size", "64", "--drop-last", "--no-progress"]
    one = subprocess.run([sys.executable, "-m", "fixup", "train", *common, "--out-dir", str(tmp_path / "one")],
                         env=_env(), capture_output=True, text=True, timeout=300)
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          "-m", "fixup", "train", *common, "--out-dir", str(tmp_path / "two")],
                         env=_env(), capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-2000:]
    assert two.returncode == 0, two.stderr[-2000:]
    assert two.stdout.count("completed after") == 1  # only rank 0 reports
    a, b = _model(tmp_path / "one"), _model(tmp_path / "two")
    for k in a:
        assert torch.allclose(a[k].float(), b[k].float(), rtol=1e-4, atol=1e-5), k
    for ra, rb in zip(_metrics(tmp_path / "one"), _metrics(tmp_path / "two"), strict=True):
        assert ra.keys() == rb.keys() and ra["step"] == rb["step"]
        assert all(abs(ra[k] - rb[k]) < 1e-4 for k in ra)
