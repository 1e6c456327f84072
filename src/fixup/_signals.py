"""How every long command ends on SIGINT (Ctrl-C) and SIGTERM: one mechanism for all of them.

The command line turns both signals into :class:`Interrupted` from the moment it starts
(:func:`signals_raise`), so start-up, data loading and the work itself end the same way. The training
engine narrows this while it trains: it finishes the current step and writes a checkpoint first (see
:mod:`fixup.train.engine`). A command that kept something fills in :attr:`Interrupted.kept`; the
command line then prints one line, what was kept and the exact command that resumes, and exits with
``128 + signal number`` as shells do: 130 for SIGINT, 143 for SIGTERM. A signal that was ignored
when the command started (a background job started by a non-interactive shell ignores SIGINT)
stays ignored.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["SIGNALS", "Interrupted", "signals_raise"]

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A command stopped by SIGINT or SIGTERM; ``kept`` says what it kept (filled in by the command)."""

    def __init__(self, signum: int = signal.SIGINT, kept: str = "") -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum, self.kept = int(signum), kept

    def __reduce__(self) -> tuple[type[Interrupted], tuple[int, str]]:
        # Pickled by its signal's number: a study's worker sends it back to the run that stopped it, and
        # the default (the exception's args, the signal's name) would not unpickle, breaking the worker pool.
        return type(self), (self.signum, self.kept)

    @classmethod
    def from_name(cls, name: str, kept: str = "") -> Interrupted:
        """From a signal's name (``"SIGINT"``, ``"SIGTERM"``); anything else counts as SIGINT."""
        return cls(getattr(signal, name, signal.SIGINT) if name in ("SIGINT", "SIGTERM") else signal.SIGINT, kept)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """128 + the signal's number: 130 for SIGINT, 143 for SIGTERM."""
        return 128 + self.signum


def _raise(signum: int, _frame: Any) -> None:
    raise Interrupted(signum)


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """Inside, SIGINT and SIGTERM raise :class:`Interrupted` (main thread only; ignored signals stay ignored)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in SIGNALS}
    for s, handler in previous.items():
        if handler is not signal.SIG_IGN:
            signal.signal(s, _raise)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
