"""The I/O module (atomic writes, JSON that names its file, output checks) and TrainConfig's sections."""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from fixup._io import RecordLog, atomic_write, check_output_dir, check_output_file, read_json, write_json
from fixup.train import TrainConfig
from fixup.train.checkpoint import CheckpointError, check_compatible
from fixup.train.config import SECTIONS, section_fields

SRC = Path(__file__).resolve().parents[1] / "src"


def test_atomic_write_keeps_the_old_file_on_failure_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    write_json(path, {"x": 1})
    with pytest.raises(RuntimeError), atomic_write(path) as fh:
        fh.write('{"x": 2')  # half written, then the writer dies
        raise RuntimeError("killed")
    assert json.loads(path.read_text()) == {"x": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]
    with atomic_write(path, "wb", previous=tmp_path / "a.prev.json") as fh:
        fh.write(b'{"x": 3}')
    assert read_json(path) == {"x": 3} and read_json(tmp_path / "a.prev.json") == {"x": 1}


def test_read_json_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "cut.json"
    bad.write_text('{"a": "unterminated')
    with pytest.raises(ValueError, match=r"cut\.json is not readable JSON"):
        read_json(bad)
    bad.write_text("[]")
    with pytest.raises(ValueError, match=r"cut\.json holds a JSON list, expected a dict"):
        read_json(bad, expect=dict)
    with pytest.raises(FileNotFoundError, match=r"nothing\.json does not exist"):
        read_json(tmp_path / "nothing.json")



def _append_records(path: str, worker: int, count: int) -> None:
    log = RecordLog(path, ("worker", "i"))
    for i in range(count):
        log.add({"worker": worker, "i": i, "pad": "x" * 5000})  # lines longer than a pipe's atomic write


def test_record_log_resumes_skips_a_cut_line_and_takes_appends_from_several_processes(tmp_path: Path) -> None:
    import multiprocessing

    path = tmp_path / "runs.jsonl"
    log = RecordLog(path, ("route", "seed"))
    log.add({"route": "fixup", "seed": 0, "acc": 0.9})
    with path.open("a") as f:
        f.write('{"route": "groupnorm", "se')  # a writer killed mid-line
    again = RecordLog(path, ("route", "seed"))
    assert again.get(route="fixup", seed=0) == {"route": "fixup", "seed": 0, "acc": 0.9}
    assert again.get(route="fixup", seed=1) is None and again.skipped == [2]
    again.add({"route": "groupnorm", "seed": 0, "acc": 0.8})  # starts a fresh line after the cut one
    third = RecordLog(path, ("route", "seed"))
    assert third.get(route="groupnorm", seed=0)["acc"] == 0.8 and third.skipped == [2]
    assert RecordLog(None, ("a",)).add({"a": 1}) == {"a": 1}  # in memory only

    shared = str(tmp_path / "shared.jsonl")
    workers = [multiprocessing.get_context("spawn").Process(target=_append_records, args=(shared, w, 50))
               for w in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    log = RecordLog(shared, ("worker", "i"))
    assert not log.skipped and len(log.records) == 150

def test_output_checks(tmp_path: Path) -> None:
    file = tmp_path / "f"
    file.write_text("x")
    with pytest.raises(ValueError, match="is empty"):
        check_output_dir("")
    with pytest.raises(ValueError, match="existing file, not a folder"):
        check_output_dir(file)
    with pytest.raises(ValueError, match="is a folder"):
        check_output_file(tmp_path)
    # A path under a regular file cannot be created by anyone, root included.
    for path in (file / "sub", file / "a" / "b"):
        with pytest.raises(ValueError, match=re.escape(f"--out-dir {path} cannot be created: {file} is a file")):
            check_output_dir(path)
        with pytest.raises(ValueError, match=re.escape(f"--json {path}.json cannot be created: {file} is a file")):
            check_output_file(path.with_suffix(".json"))
    assert check_output_dir(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    assert check_output_file(tmp_path / "new" / "r.json") == tmp_path / "new" / "r.json"


@contextlib.contextmanager
def _permissions_apply() -> Iterator[None]:
    """Make permission bits bind: as root, take a plain user's real uid, which ``os.access`` checks against."""
    if os.geteuid() != 0:
        yield
        return
    try:
        os.setreuid(65534, 0)  # nobody; the effective uid stays root, so the next line can restore it
    except PermissionError:
        pytest.skip("root without CAP_SETUID cannot take another user's real uid")
    try:
        yield
    finally:
        os.setreuid(0, 0)


def test_output_checks_refuse_a_folder_without_write_permission() -> None:
    import shutil
    import tempfile

    where = Path(tempfile.mkdtemp(prefix="fixup-perm-"))  # outside pytest's root-only folders, so traversable
    try:
        where.chmod(0o755)
        (where / "locked").mkdir(mode=0o555)
        (where / "open").mkdir(mode=0o777)
        (where / "open").chmod(0o777)  # past the umask
        with _permissions_apply():
            assert check_output_dir(where / "open" / "run") == where / "open" / "run"  # the control is accepted
            assert check_output_file(where / "open" / "r.json") == where / "open" / "r.json"
            with pytest.raises(ValueError, match=re.escape(f"{where / 'locked'} is not writable")):
                check_output_dir(where / "locked" / "run")
            with pytest.raises(ValueError, match=re.escape(f"{where / 'locked'} is not writable")):
                check_output_file(where / "locked" / "r.json")
    finally:
        shutil.rmtree(where)


def _imports(module: str) -> set[str]:
    """Modules of fixup that ``module`` imports anywhere in its source (lazy imports included)."""
    path = SRC / (module.replace(".", "/") + ".py")
    if not path.exists():
        path = SRC / module.replace(".", "/") / "__init__.py"
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(max(0, node.level - 1)):
                base = base.rpartition(".")[0]
            target = (f"{base}.{node.module}" if node.module else base) if node.level else (node.module or "")
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module" and node.args \
                and isinstance(node.args[0], ast.Constant):
            found.add(node.args[0].value)
    return found


@pytest.mark.parametrize(("a", "b"), [("fixup._adapt._cli", "fixup.cli"), ("fixup.data.image_formats",
                                                                          "fixup.data.images")])
def test_the_seams_have_no_import_cycle(a: str, b: str) -> None:
    # fixup.cli loads every command module (including fixup._adapt._cli); nothing may import the command line back,
    # and the two image readers share their helpers through fixup.data.augment.
    assert b not in _imports(a)
    assert not any(m == "fixup.cli" for m in _imports("fixup.studies.cli") | _imports("fixup.lab.cli"))


def test_config_is_written_by_section_and_reads_both_layouts(tmp_path: Path) -> None:
    cfg = TrainConfig(depth=8, lr=0.05, image_size=16, label_smoothing=0.1, device="cpu")
    data = cfg.to_dict()
    assert list(data) == list(SECTIONS) == ["network", "data", "images", "optimisation", "regularisation", "privacy",
                                                                                               "run"]
    assert data["images"]["image_size"] == 16 and data["optimisation"]["lr"] == 0.05
    assert "image_size" not in data["data"] and "lr" not in data["images"]
    assert TrainConfig.from_dict(data) == cfg
    flat = {k: v for section in data.values() for k, v in section.items()}  # a config.json from before the sections
    assert TrainConfig.from_dict(flat) == cfg
    assert sum(len(section_fields(s)) for s in SECTIONS) == len(flat)


def test_config_keys_are_checked_per_section() -> None:
    with pytest.raises(ValueError, match=r"unknown option learning_rate in section .images."):
        TrainConfig.from_dict({"images": {"learning_rate": 1}})
    with pytest.raises(ValueError, match=r"unknown option lr in section .data."):
        TrainConfig.from_dict({"data": {"lr": 0.1}})  # a field in the wrong section
    with pytest.raises(ValueError, match="unknown training option"):
        TrainConfig.from_dict({"learning_rate": 0.1})
    with pytest.raises(ValueError, match="must be of type float"):
        TrainConfig.from_dict({"optimisation": {"lr": "0.1"}})  # a hand-edited config.json


def test_resume_compares_old_flat_and_new_sectioned_configs(tmp_path: Path) -> None:
    cfg = TrainConfig(depth=8)
    flat = {k: v for section in cfg.to_dict().values() for k, v in section.items()}
    check_compatible(flat, cfg.to_dict(), tmp_path)  # the same run, written before and after the sections
    with pytest.raises(CheckpointError, match=r"lr: checkpoint 0\.1, now 0\.2"):
        check_compatible(flat, cfg.replace(lr=0.2).to_dict(), tmp_path)
