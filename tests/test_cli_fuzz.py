"""Bad input to every command ends in one line on stderr and exit code 2, never a traceback, before any work.

Each case calls ``fixup.cli.main`` in-process (from an empty working folder, so that nothing a case
writes can hide) with one wrong value: wrong type, zero, negative, NaN, infinite, empty, huge,
nonexistent or unwritable. The one line must say what is wrong: the option and its value, derived from
the case (:func:`expected_in`). The broken pipe (``fixup list | head``) runs in a real process.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from fixup.cli import main
from fixup.train.config import TrainConfig

SRC = str(Path(__file__).resolve().parents[1] / "src")
FILE = "@file"  # replaced by an existing regular file
DIR = "@dir"  # replaced by an existing folder
UNDER_FILE = "@file/sub"  # cannot be created: its parent is a file
MISSING = "@missing"  # does not exist
BAD_JSON = "@badjson"  # a truncated JSON file
LIST_JSON = "@listjson"  # a JSON file holding a list
UNKNOWN_KEY = "@unknownkey"  # a config.json with an unknown option
WRONG_TYPE = "@wrongtype"  # a config.json with "lr": "fast"


# -- training options, generated from TrainConfig -------------------------------------------------------
_POSITIVE = ("batch_size", "eval_batch_size", "epochs", "eval_every")
_NONNEG = ("lr", "weight_decay", "grad_clip", "warmup_steps", "max_updates", "max_loss", "mixup_alpha", "cutout",
           "num_workers", "lr_reference_batch", "momentum", "dropout", "depth", "width", "keep_checkpoints",
           "checkpoint_segments", "image_size", "seed", "split_seed")


def _train_field_cases() -> list[list[str]]:
    hints = typing.get_type_hints(TrainConfig)
    cases = []
    for f in dataclasses.fields(TrainConfig):
        flag, tp = "--" + f.name.replace("_", "-"), hints[f.name]
        if tp is int:
            cases += [[flag, "abc"], [flag, "1.5"]]
        if tp is float:
            cases += [[flag, "abc"], [flag, "nan"], [flag, "inf"], [flag, "-inf"]]
        if f.name in _POSITIVE:
            cases += [[flag, "0"], [flag, "-3"]]
        if f.name in _NONNEG:
            cases.append([flag, "-1"])
        if tp is str and f.name in ("optimizer", "schedule", "precision", "hflip", "resize", "device"):
            cases += [[flag, "nosuch"], [flag, ""]]
    return [["train", *c] for c in cases]


TRAIN = _train_field_cases() + [["train", *c] for c in [
    ["--out-dir", FILE], ["--out-dir", ""], ["--out-dir", UNDER_FILE], ["--json", DIR], ["--json", ""],
    ["--json", UNDER_FILE], ["--config", MISSING], ["--config", DIR], ["--config", BAD_JSON], ["--config", LIST_JSON],
    ["--config", UNKNOWN_KEY], ["--config", WRONG_TYPE], ["--device", "cuda"], ["--device", "cuda:7"],
    ["--device", "mps"], ["--gamma", "0"], ["--gamma", "-1"], ["--eps", "0"], ["--channels", "5"],
    ["--channels", "2"], ["--extra", "[1]"], ["--extra", "{bad"], ["--extra", '"text"'], ["--extra", ""],
    ["--betas", "1", "2"], ["--betas", "0.9"], ["--betas", "nan", "0.9"], ["--milestones", "0.8", "0.2"],
    ["--milestones", "1.5"], ["--milestones", "nan"], ["--test-fraction", "0"], ["--test-fraction", "1"],
    ["--label-smoothing", "1"], ["--dropout", "1"], ["--drop-path", "1"], ["--drop-path", "-0.5"],
    ["--head-dropout", "1"], ["--head-dropout", "-0.1"], ["--seed", str(2**40)], ["--crop-padding", "-2"],
    ["--scalar-weight-decay", "-2"], ["--scalar-lr-mult", "-1"], ["--nesterov", "--optimizer", "adam"],
    ["--schedule", "inverse_sqrt"], ["--learning-rate", "0.1"], ["--image-size", "-1"], ["--depth", "21"],
    ["--norm", "nosuch"], ["--model", "nosuch"], ["--init", "nosuch"], ["--dataset", "nosuch"],
    ["--dataset", "cifar10"], ["--dataset", "cifar10", "--data-dir", MISSING], ["--dataset", "svhn", "--data-dir", DIR],
    ["--dataset", "folder", "--data-dir", FILE], ["--dataset", "folder", "--data-dir", DIR], ["--task", "nosuch"],
    ["--resume", "yes"], ["--epochs"],
]]

TRANSLATE = [["translate", *c] for c in [
    ["--beam", "0"], ["--beam", "-1"], ["--beam", "x"], ["--lenpen", "nan"], ["--lenpen", "inf"], ["--lenpen", "-1"],
    ["--average-last", "-1"], ["--max-tokens", "0"], ["--vocab-size", "0"], ["--vocab-size", "x"],
    ["--synthetic-train", "0"], ["--bleu-limit", "-1"], ["--recipe", "nosuch"], ["--lr", "nan"], ["--lr", "inf"],
    ["--device", "nosuch"], ["--device", "cuda"], ["--out-dir", FILE], ["--out-dir", ""], ["--json", DIR],
    ["--extra", "[1]"], ["--extra", '{"nosuch": 1}'], ["--image-size", "32"], ["--warmup-steps", "0"],
    ["--max-updates", "-1"], ["--src-suffix", "de", "--data-dir", MISSING],
]]

STUDIES = [c for name in ("reproduce", "study depth") for c in [[*name.split(), *o] for o in [
    ["--device", "nosuch"], ["--device", "cuda"], ["--data", "cifar10"], ["--data", "cifar10", "--data-dir", MISSING],
    ["--data", "nosuch"], ["--jobs", "-1"], ["--jobs", "x"], ["--seeds", "0"], ["--seeds", "1"], ["--seeds", "x"],
    ["--image-size", "-1"], ["--out", ""], ["--out", FILE], ["--out", UNDER_FILE], ["--quick", "--full"],
]]] + [["reproduce", "--only", "nosuch"], ["study", "nosuch"], ["study"]]

BENCH = [["bench", *c] for c in [
    ["--depth", "21"], ["--depth", "0"], ["--depth", "-2"], ["--depth", "x"], ["--batch", "0"], ["--batch", "-1"],
    ["--image-size", "0"], ["--image-size", "-1"], ["--warmup", "-1"], ["--reps", "0"], ["--device", "nosuch"],
    ["--device", "cuda"], ["--variants", "nosuch"], ["--variants", "fixup"], ["--families", "nosuch"],
    ["--modes", "nosuch"], ["--threads", "0"], ["--threads", "-1"], ["--seed", "x"], ["--json", DIR],
]] + [["bench-deep", *c] for c in [
    ["--batch", "0"], ["--batch", "-1"], ["--steps", "0"], ["--steps", "-1"], ["--segments", "-1"],
    ["--segments", "x"], ["--segments", "1.5"], ["--timeout", "0"], ["--timeout", "-1"], ["--timeout", "nan"],
    ["--timeout", "inf"], ["--depths", "21"], ["--depths", "x"], ["--json", DIR],
]]

LAB = [["lab", *c] for c in [
    ["theory", "--draws", "0"], ["theory", "--draws", "-1"], ["theory", "--draws", "x"], ["theory", "--m", "1"],
    ["theory", "--m", "0"], ["theory", "--eta", "0"], ["theory", "--eta", "nan"], ["theory", "--eta", "inf"],
    ["theory", "--depths", "0"], ["theory", "--depths", "x"], ["theory", "--depths", ""],
    ["theory", "--variance-depths", "-5"], ["theory", "--json", DIR], ["theory", "--plot", UNDER_FILE],
    ["scalar", "--depths", "0"], ["scalar", "--m", "1"], ["scalar", "--eta", "nan"], ["scalar", "--x", "inf"],
    ["scalar", "--y", "nan"], ["scalar", "--draw", "nosuch"], ["scalar", "--updates", "x"],
    ["update", "--batch", "0"], ["update", "--size", "0"], ["update", "--batch", "0", "--size", "0"],
    ["update", "--num-classes", "0"], ["update", "--depths", "21"], ["update", "--steps", "0"],
    ["update", "--lr", "nan"], ["update", "--lr", "-1"], ["update", "--scalar-lr", "-1"],
    ["update", "--model", "nosuch"], ["update", "--methods", "nosuch", "--depths", "8"],
    ["probe"], ["probe", "nosuch"], ["probe", "resnet20", "--batch", "0"], ["probe", "resnet20", "--batch", "-1"],
    ["probe", "resnet20", "--size", "0"], ["probe", "resnet20", "--num-classes", "0"],
    ["probe", "resnet20", "--depth", "-1"], ["probe", "resnet20", "--lr", "nan"],
    ["probe", "resnet20", "--sym-steps", "-1"], ["probe", "resnet20", "--method", "nosuch"],
    ["coupling", "resnet20", "--companions", "-1"], ["coupling", "resnet20", "--companions", "0"],
    ["coupling", "resnet20", "--companions", "x"], ["coupling", "resnet20", "--size", "0"],
    ["coupling", "resnet20", "--num-classes", "0"], ["coupling", "resnet20", "--methods", "nosuch"],
    ["coupling", "nosuch"], ["stream", "resnet20", "--batch", "1"], ["stream", "resnet20", "--steps", "0"],
    ["stream", "resnet20", "--lr", "nan"], ["stream", "resnet20", "--scalar-lr-mult", "-1"], ["stream", "nosuch"],
    ["nosuch"], [],
]]

INSPECT = [["inspect", *c] for c in [
    [], ["nosuch"], ["resnet20", "--norm", "nosuch"], ["resnet20", "--init", "nosuch"],
    ["resnet_cifar", "--depth", "21"], ["resnet_cifar", "--depth", "0"], ["resnet_cifar", "--depth", "-1"],
    ["resnet_cifar", "--depth", "x"], ["resnet_cifar", "--depth", str(10**15)], ["wide_resnet", "--width", "0"],
    ["resnet20", "--num-classes", "0"], ["resnet20", "--num-classes", "-1"], ["resnet20", "--json", DIR],
    ["resnet20", "--json", UNDER_FILE], ["--adapt", "nocolon"], ["--adapt", "nosuchmodule_xyz:f"],
    ["--adapt", "missing.py:f"], ["--adapt", "os:getcwd"], ["--adapt", "os:getcwd", "--method", "nosuch"],
    ["--adapt", "os:getcwd", "--method", "nf_resnet"], ["--adapt", "os:getcwd", "--trunk", "nosuch"],
    ["resnet20", "--method", "rezero"], ["resnet20", "--trunk", "none"],
]] + [["list", "a", "b"], ["nosuch"], [], ["--nosuch"]]

CASES = TRAIN + TRANSLATE + STUDIES + BENCH + LAB + INSPECT

# -- what each error line must say, derived from the case ---------------------------------------------------
# An option's error names the option (as --flag or as its field name) and carries its bad value; a path is
# named in full; a word value ('nosuch', 'cuda:7', '[1]') is quoted, or stands beside the option's name. These cases say
# something the rule cannot derive, each for the reason given:
OVERRIDES: dict[tuple[str, ...], str] = {
    ("train", "--config", UNKNOWN_KEY): "learning_rate",  # the unknown key inside the file
    ("train", "--config", WRONG_TYPE): "got 'fast'",  # the bad value inside the file
    ("train", "--betas", "0.9"): "--betas: expected 2 arguments",  # one value where two belong
    ("train", "--nesterov", "--optimizer", "adam"): "nesterov=True needs optimizer='sgd'",  # the clash, both named
    ("translate", "--extra", '{"nosuch": 1}'): "nosuch",  # the unknown key inside the JSON
    ("study",): "required: name",  # a missing positional argument, named
    ("lab",): "required: lab_command",
    ("lab", "probe"): "required: model",
    ("inspect",): "give a registered model name",
    (): "required: COMMAND",
    ("--nosuch",): "unknown option --nosuch",  # named, where argparse would ask for the missing command
    ("train", "--resume", "yes"): "unrecognized arguments: yes",  # a switch given a value
}
_NUMBER = re.compile(r"(?<![\w.])-?(?:\d+(?:\.\d+)?(?:e[+-]?\d+)?|nan|inf)(?!\w)")


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _word(text: str) -> re.Pattern:
    return re.compile(rf"(?<![\w-]){re.escape(text)}(?![\w-])")


def _names_option(message: str, flag: str, value: str | None) -> bool:
    """Whether ``message`` names ``flag`` with its bad ``value`` (None: the flag took no value)."""
    named = _word(flag).search(message) or _word(flag[2:].replace("-", "_")).search(message)
    if value is None:  # a switch, or an option missing its value
        return bool(named)
    if value == "-inf":  # argparse reads "-inf" as an option: the flag is left without its value
        return bool(named) and "expected one argument" in message
    if value == "":
        return bool(named) and ("''" in message or "is empty" in message)
    number = _number(value)
    if number is not None:  # a number is too common to stand alone: the option and the number
        found = [_number(t) for t in _NUMBER.findall(message)]
        return bool(named) and any(f == number or (math.isnan(number) and f is not None and math.isnan(f))
                                   for f in found)
    if Path(value).is_absolute():  # a placed path: distinctive on its own
        return value in message
    # a word: quoted as a value, or beside the option's name
    return f"'{value}'" in message or bool(named and _word(value).search(message))


def expected_in(case: list[str], message: str, place) -> bool:
    """Whether the error ``message`` (after "error:") says what is wrong with ``case``."""
    if tuple(case) in OVERRIDES:
        return OVERRIDES[tuple(case)] in message
    options = [(i, t) for i, t in enumerate(case) if t.startswith("--")]
    if not options:  # a bad positional value: named in quotes or as a word
        return bool(_word(case[-1]).search(message))
    for i, flag in options:
        value = case[i + 1] if i + 1 < len(case) and not case[i + 1].startswith("--") else None
        if _names_option(message, flag, place(value) if value is not None else None):
            return True
    return False


def _place(arg: str, where: Path) -> str:
    files = {FILE: where / "a_file", DIR: where / "a_folder", UNDER_FILE: where / "a_file" / "sub",
             MISSING: where / "missing", BAD_JSON: where / "bad.json", LIST_JSON: where / "list.json",
             UNKNOWN_KEY: where / "unknown.json", WRONG_TYPE: where / "wrongtype.json"}
    return str(files.get(arg, arg))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("inputs")
    (where / "a_file").write_text("x")
    (where / "a_folder").mkdir()
    (where / "bad.json").write_text('{"lr": 0.1, "depth": ')
    (where / "list.json").write_text("[]")
    (where / "unknown.json").write_text('{"learning_rate": 0.1}')
    (where / "wrongtype.json").write_text('{"optimisation": {"lr": "fast"}}')
    return where


def test_there_are_enough_cases_over_every_command() -> None:
    assert len(CASES) >= 150
    commands = {c[0] for c in CASES if c}
    assert commands >= {"train", "translate", "reproduce", "study", "bench", "bench-deep", "lab", "inspect", "list"}


@pytest.mark.parametrize("argv", CASES, ids=[" ".join(c) or "(none)" for c in CASES])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], inputs: Path, tmp_path: Path, monkeypatch,
                                          capsys) -> None:
    monkeypatch.chdir(tmp_path)  # defaults such as runs/... land here, where the test sees them
    case, argv = argv, [_place(a, inputs) for a in argv]
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's usage errors
        code = exit_.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err + out
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, f"exit {code}; stderr: {err[-500:]}"
    assert len(lines) == 1 and "error:" in lines[0], err
    message = lines[0].split("error:", 1)[1]  # the program's name before it would match any case's command
    assert expected_in(case, message, lambda a: _place(a, inputs)), f"the error does not say what is wrong: {err}"
    assert list(tmp_path.iterdir()) == [], "a refused command wrote files"


def test_the_expected_substrings_reject_an_unrelated_error(inputs: Path) -> None:
    # Any ValueError raised anywhere used to pass: now a line that names nothing of the case fails every case.
    unrelated = " could not convert string to float: 'q' (ValueError in fixup.data)"
    assert not [c for c in CASES if expected_in(c, unrelated, lambda a: _place(a, inputs))]
    # and naming the option is not enough where the value is what was wrong
    assert not expected_in(["train", "--lr", "nan"], " lr must be >= 0, got -1.0", str)
    assert expected_in(["train", "--lr", "nan"], " lr must be a finite number, got nan", str)


def test_a_closed_pipe_is_exit_141_without_a_traceback(tmp_path: Path) -> None:
    read, write = os.pipe()
    os.close(read)  # the reader (`head`) has gone before fixup writes
    try:
        done = subprocess.run([sys.executable, "-m", "fixup", "list"], stdout=write, stderr=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": SRC}, timeout=120, check=False)
    finally:
        os.close(write)
    assert done.returncode == 141, done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr


def test_documented_exit_codes(capsys) -> None:
    with pytest.raises(SystemExit) as version:
        main(["--version"])
    assert version.value.code == 0
    with pytest.raises(SystemExit) as helped:
        main(["lab", "theory", "--help"])
    assert helped.value.code == 0 and "Traceback" not in capsys.readouterr().err
