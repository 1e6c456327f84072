"""Files written atomically and JSON read with errors that name the file: the one place for both.

Every file the project writes (run folders, checkpoints, study stores, ``--json`` outputs) goes
through :func:`atomic_write`: the bytes go to a temporary file beside the target
(``.NAME.<pid>.tmp``), are flushed to disk and renamed over the target, so a crash or a kill
mid-write never leaves a half-written file under the real name. :func:`remove_stale_temporaries`
deletes the temporaries that a killed writer left behind. :func:`read_json` turns every way a JSON
file can be unreadable into one :class:`ValueError` that names the file.

A full disk (or quota, or file-size limit) is always an :class:`OSError` with its errno
(:func:`full_disk_error` finds it), never another library's wrapping of it: torch's serializer
turns a failed ``write`` into ``RuntimeError: [enforce fail at inline_container.cc] unexpected pos``,
so :func:`atomic_write` remembers the first error its file raised and raises that one instead.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, cast

__all__ = ["FULL_DISK", "RecordLog", "atomic_write", "check_output_dir", "check_output_file", "full_disk_error",
           "read_json", "remove_stale_temporaries", "to_json", "write_json", "write_text"]

# The errnos of a write that found no room: the disk is full, the user's quota is spent, or a file would pass
# the process's file-size limit (RLIMIT_FSIZE, with SIGXFSZ ignored).
FULL_DISK = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})

_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.tmp$")


def _temporary(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def full_disk_error(err: BaseException | None) -> OSError | None:
    """The full-disk :class:`OSError` (errno in :data:`FULL_DISK`) that is ``err`` or caused it, else None."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, OSError) and err.errno in FULL_DISK:
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


class _Recording:
    """A file whose first ``write`` error is kept, for a caller that wraps it in another exception."""

    def __init__(self, fh: IO[Any]) -> None:
        self._fh = fh
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return self._fh.write(data)
        except OSError as err:
            self.error = self.error or err
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fh, name)


@contextlib.contextmanager
def atomic_write(path: str | Path, mode: str = "w", *, previous: str | Path | None = None) -> Iterator[IO[Any]]:
    """Open a temporary file beside ``path`` for writing; on success flush it to disk and rename it over ``path``.

    ``mode`` is ``"w"`` (text, UTF-8) or ``"wb"``. On an exception the temporary file is removed and
    ``path`` is left as it was. The parent folder is created when missing. With ``previous``, the
    file being replaced is first renamed to ``previous`` (so the last version stays beside the new one).

    When a write fails and the writer raises something else instead (torch's ``RuntimeError``), the
    write's own :class:`OSError` is raised. A full disk is an :class:`OSError` with the same errno and
    one line that names ``path`` and says that the file there before is unchanged.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write writes whole files: mode must be 'w' or 'wb', got {mode!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(path)
    try:
        with open(tmp, mode, **({"encoding": "utf-8"} if mode == "w" else {})) as raw:
            fh = _Recording(raw)
            try:
                yield cast(IO[Any], fh)
            except Exception as err:
                if fh.error is None or fh.error is err:
                    raise
                raise fh.error from err
            raw.flush()
            os.fsync(raw.fileno())
        if previous is not None and path.exists():
            os.replace(path, previous)
        os.replace(tmp, path)
    except OSError as err:
        if err.errno not in FULL_DISK:
            raise
        kept = f"{path.name} there is unchanged" if path.exists() else "nothing was written"
        fix = "raise the file-size limit (ulimit -f)" if err.errno == errno.EFBIG else "free space on its filesystem"
        raise OSError(err.errno, f"{os.strerror(err.errno)} while writing {path} ({kept}); {fix} or write to "
                      "another folder") from err
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically."""
    with atomic_write(path) as fh:
        fh.write(text)


def to_json(data: Any) -> str:
    """``data`` as indented JSON (non-JSON values as their ``str``), ending in a newline."""
    return json.dumps(data, indent=2, default=str) + "\n"


def write_json(path: str | Path, data: Any) -> None:
    """Write ``data`` as indented JSON to ``path`` atomically (non-JSON values are written as their ``str``)."""
    write_text(path, to_json(data))


def read_json(path: str | Path, *, expect: type | tuple[type, ...] | None = None, what: str = "JSON file") -> Any:
    """The JSON value in ``path``; a missing, unreadable or malformed file is an error naming it.

    ``expect`` (e.g. ``dict``) also refuses a file whose top-level value has another type.
    Raises :class:`FileNotFoundError` for a missing file and :class:`ValueError` for the rest.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{what} {path} does not exist")
    if path.is_dir():
        raise ValueError(f"{what} {path} is a folder, not a file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{what} {path} is not readable JSON ({err})") from err
    if expect is not None and not isinstance(data, expect):
        names = " or ".join(t.__name__ for t in (expect if isinstance(expect, tuple) else (expect,)))
        raise ValueError(f"{what} {path} holds a JSON {type(data).__name__}, expected a {names}")
    return data


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # our own temporaries from before are stale by definition: we write one file at a time
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def remove_stale_temporaries(folder: str | Path) -> list[Path]:
    """Delete ``.NAME.<pid>.tmp`` files in ``folder`` whose writing process no longer runs; return them."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed = []
    for entry in folder.iterdir():
        m = _TEMPORARY.match(entry.name)
        if m and entry.is_file() and not _alive(int(m.group("pid"))):
            entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_output_dir(path: str | Path, option: str = "--out-dir") -> Path:
    """Refuse, before any work, a folder that cannot be created or written: empty, a file, or not writable."""
    if str(path).strip() == "":
        raise ValueError(f"{option} is empty; give a folder name (it is created when missing)")
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{option} {path} is an existing file, not a folder; give a folder name")
    base = _nearest_existing(path)
    if not base.is_dir():
        raise ValueError(f"{option} {path} cannot be created: {base} is a file, not a folder")
    if not os.access(base, os.W_OK | os.X_OK):
        raise ValueError(f"{option} {path}: {base} is not writable; choose a folder you can write to")
    return path


def check_output_file(path: str | Path, option: str = "--json") -> Path:
    """Refuse, before any work, an output file that cannot be written: empty, a folder, or in a read-only place."""
    if str(path).strip() == "":
        raise ValueError(f"{option} is empty; give a file name")
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{option} {path} is a folder; give a file name")
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"{option} {path} is not writable")
    base = _nearest_existing(path.parent)
    if not base.is_dir():
        raise ValueError(f"{option} {path} cannot be created: {base} is a file, not a folder")
    if not os.access(base, os.W_OK | os.X_OK):
        raise ValueError(f"{option} {path}: {base} is not writable; choose a place you can write to")
    return path


def json_object(text: str) -> dict[str, Any]:
    """An option's JSON object (``--extra '{"key": 1}'``); anything else is a usage error."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not valid JSON ({err}): {text!r}; give an object such as "
                                         "'{\"key\": 1}'") from err
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"key\": 1}}', got {text!r}")
    return value


class RecordLog:
    """Finished runs of a long benchmark, one JSON object a line, each appended as it ends (flushed to disk under an
    exclusive lock), so that a stopped command resumes and several processes can share one grid.

    A record is found again by its values of ``keys`` (a missing key reads as ""): :meth:`get` returns the stored
    record, or ``None`` for a run still to train. A line cut short by a killed writer is skipped (its number is in
    :attr:`skipped`), and the next append starts on a fresh line. ``path=None`` keeps the records in memory only.
    """

    def __init__(self, path: str | Path | None, keys: tuple[str, ...]) -> None:
        self.path = None if path is None else Path(path)
        self.keys = keys
        self.records: dict[tuple[Any, ...], dict[str, Any]] = {}
        self.skipped: list[int] = []
        if self.path is not None and self.path.exists():
            for number, line in enumerate(self.path.read_text().splitlines(), 1):
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    self.skipped.append(number)
                    continue
                if isinstance(record, dict):
                    self.records[self.key(record)] = record

    @classmethod
    def beside(cls, json_path: str | None, keys: tuple[str, ...], path: str | None = None) -> RecordLog:
        """A benchmark's store: ``path`` when given (its ``--runs``), else ``JSON.runs.jsonl`` beside its ``--json``
        output, else in memory only."""
        return cls(path if path is not None else (f"{json_path}.runs.jsonl" if json_path else None), keys)

    @property
    def notes(self) -> list[str]:
        """One line for each line of the file that was skipped, for the command to show."""
        return [f"{self.path}:{n}: an unfinished line (a killed writer?), skipped" for n in self.skipped]

    def key(self, record: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(record.get(k, "") for k in self.keys)

    def get(self, **key: Any) -> dict[str, Any] | None:
        return self.records.get(self.key(key))

    def add(self, record: dict[str, Any]) -> dict[str, Any]:
        """Store ``record`` (JSON-serialisable) and return it."""
        line = json.dumps(record).encode() + b"\n"
        self.records[self.key(record)] = record
        if self.path is not None:
            import fcntl

            with open(self.path, "ab+") as f:
                fcntl.flock(f, fcntl.LOCK_EX)
                end = f.seek(0, os.SEEK_END)
                cut = end > 0 and f.seek(end - 1) >= 0 and f.read(1) != b"\n"  # a killed writer's last line
                f.write((b"\n" if cut else b"") + line)
                f.flush()
                os.fsync(f.fileno())
        return record
