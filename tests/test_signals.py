"""SIGINT and SIGTERM end every long command the same way: one line, what was kept, the command to resume, 130/143.

Each test sets its own handlers (the fixture below), so the file passes when the suite runs as a
background job, which inherits SIGINT ignored.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fixup._signals import Interrupted, signals_raise
from fixup.cli import main
from fixup.train import engine

SRC = str(Path(__file__).resolve().parents[1] / "src")
TRAIN = ["train", "--depth", "8", "--batch-size", "128", "--epochs", "1", "--no-progress"]


@pytest.fixture
def default_signals():
    """SIGINT raises KeyboardInterrupt and SIGTERM terminates, whatever this process inherited."""
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    for s, h in old.items():
        signal.signal(s, h)


def _send_at_step(monkeypatch, signum: int, step: int) -> None:
    """Send ``signum`` to this process right after optimiser step ``step``."""
    update = engine._Run._update

    def patched(self, loss, **kwargs):
        update(self, loss, **kwargs)
        if self.step + 1 == step:
            os.kill(os.getpid(), signum)

    monkeypatch.setattr(engine._Run, "_update", patched)


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_train_stops_after_the_step_says_what_it_kept_and_resumes(signum, code, default_signals, monkeypatch,
                                                                  tmp_path, capsys) -> None:
    out = tmp_path / "run"
    argv = [*TRAIN, "--out-dir", str(out)]
    _send_at_step(monkeypatch, signum, 3)
    assert main(argv) == code
    captured = capsys.readouterr()
    line = _one_line(captured.err)
    name = signal.Signals(signum).name
    assert line.startswith(f"fixup train: interrupted by {name}; stopped after step 3; checkpoint of epoch 1, step 3 "
                           f"kept in {out / 'checkpoint.pt'}")
    assert line.endswith("to resume run: fixup " + " ".join(argv))
    assert "completed" not in captured.out  # no result is printed for a run that did not end
    monkeypatch.undo()
    assert main(argv) == 0
    assert "completed after 1 epoch(s), 12 steps" in capsys.readouterr().out
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers are put back


def test_train_without_out_dir_says_nothing_was_kept(default_signals, monkeypatch, capsys) -> None:
    _send_at_step(monkeypatch, signal.SIGINT, 2)
    assert main(TRAIN) == 130
    assert "nothing was kept (give --out-dir to make runs resumable)" in _one_line(capsys.readouterr().err)


def test_a_signal_during_start_up_is_one_line_too(default_signals, monkeypatch, tmp_path, capsys) -> None:
    create = engine.create_task

    def slow_start(config):  # the signal arrives while the data set is being loaded
        os.kill(os.getpid(), signal.SIGINT)
        return create(config)

    monkeypatch.setattr(engine, "create_task", slow_start)
    assert main([*TRAIN, "--out-dir", str(tmp_path / "run")]) == 130
    line = _one_line(capsys.readouterr().err)
    assert "interrupted by SIGINT" in line and "is as it was before this run" in line
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


def test_a_second_signal_aborts_at_once(default_signals, monkeypatch, tmp_path, capsys) -> None:
    update = engine._Run._update

    def twice(self, loss, **kwargs):
        update(self, loss, **kwargs)
        if self.step == 1:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(engine._Run, "_update", twice)
    assert main([*TRAIN, "--out-dir", str(tmp_path)]) == 130
    assert "a second signal: aborted without writing a checkpoint" in _one_line(capsys.readouterr().err)


def test_translate_stops_before_decoding(default_signals, monkeypatch, tmp_path, capsys) -> None:
    extra = '{"synthetic_train": 200, "synthetic_eval": 20, "vocab_size": 150, "bleu_limit": 0}'
    argv = ["translate", "--out-dir", str(tmp_path / "run"), "--max-updates", "6", "--warmup-steps", "1",
            "--device", "cpu", "--no-progress", "--extra", extra]
    _send_at_step(monkeypatch, signal.SIGTERM, 2)
    assert main(argv) == 143
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("fixup translate: interrupted by SIGTERM; stopped after step 2; checkpoint kept in")
    assert not (tmp_path / "run" / "test.hyp").exists()  # nothing was decoded


def test_ignored_signals_stay_ignored() -> None:
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as in a background job
    try:
        with signals_raise():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        with engine._stop_on_signals() as requested:
            os.kill(os.getpid(), signal.SIGINT)
            assert requested == []
    finally:
        signal.signal(signal.SIGINT, old)


def test_the_engine_test_passes_in_a_background_job(tmp_path) -> None:
    from test_train_engine import test_sigint_stops_after_the_step_and_resumes

    old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # what a background job inherits
    try:
        test_sigint_stops_after_the_step_and_resumes(tmp_path)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, old)


def test_interrupted_exit_codes() -> None:
    assert Interrupted(signal.SIGINT).exit_code == 130 and Interrupted(signal.SIGTERM).exit_code == 143
    assert Interrupted.from_name("SIGTERM", kept="x").kept == "x"
    assert isinstance(Interrupted(), KeyboardInterrupt)


def test_reproduce_on_ctrl_c_stops_its_workers_and_says_how_to_resume(tmp_path) -> None:
    out = tmp_path / "study"
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    argv = ["reproduce", "--tiny", "--only", "depth", "--jobs", "2", "--no-plots", "--out", str(out)]
    proc = subprocess.Popen([sys.executable, "-m", "fixup", *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=lambda: signal.signal(signal.SIGINT,
                                                                                                  signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not list(out.glob("cells/*/*/*/seed*/work")):  # a cell has started
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    lines = [line for line in err.splitlines() if "interrupted by" in line]
    assert len(lines) == 1 and "finished cell(s) kept in" in lines[0], err
    assert lines[0].endswith("to resume run: fixup " + " ".join(argv))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_survives_pickling_as_a_worker_sends_it_back(signum) -> None:
    import pickle

    back = pickle.loads(pickle.dumps(Interrupted(signum, kept="a checkpoint")))
    assert isinstance(back, Interrupted) and isinstance(back, KeyboardInterrupt)
    assert (back.signum, back.kept, back.exit_code) == (signum, "a checkpoint", 128 + signum)
