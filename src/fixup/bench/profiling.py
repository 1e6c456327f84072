"""Where the time (and memory) goes: per-operator profiles of one call, and their difference.

The benchmark names the reason for every cell that misses a target with :func:`explain`: it profiles
one training step (or forward pass) of the Fixup variant and of the bare network with ``torch.profiler``
and lists the operators whose self time (or self memory) grows most. :func:`quiet_profiler` keeps the
profiler's own log lines (``USDT: ... profiler_start``, written by the C++ library straight to the
process's standard error) away from users, and passes anything else written meanwhile through.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["explain", "op_profile", "quiet_profiler"]

# The profiler's trace lines: "USDT:2026-12-01 06:17:00 14908:14908 SyncActivityProfilerHandler.cpp:52] ..."
_PROFILER_LOG = re.compile(r"^USDT:\S+ \S+ \d+:\d+ \w+\.cpp:\d+\] ")


@contextlib.contextmanager
def quiet_profiler() -> Iterator[None]:
    """Hold back the profiler's start/stop log lines that the C++ library writes to file descriptor 2.

    Standard error is redirected to a temporary file for the duration; on exit every line that is not
    one of the profiler's trace lines is written back, so warnings and errors still reach the user.
    """
    fd = 2  # the C++ library writes to the process's descriptor 2, whatever sys.stderr is
    try:
        sys.stderr.flush()
        saved = os.dup(fd)
    except (AttributeError, OSError, ValueError):  # no descriptor 2 to hold back
        yield
        return
    with tempfile.TemporaryFile(mode="w+b") as held:
        os.dup2(held.fileno(), fd)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, fd)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held.read().decode(errors="replace").splitlines(keepends=True)
                    if not _PROFILER_LOG.match(line)]
            if kept:
                os.write(fd, "".join(kept).encode())


def op_profile(fn: Callable[[], Any]) -> dict[str, dict[str, float]]:
    """Run ``fn`` once under ``torch.profiler``; per operator: self CPU ms, calls and self CPU memory bytes."""
    from torch.profiler import ProfilerActivity, profile

    with quiet_profiler(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return {e.key: {"ms": e.self_cpu_time_total / 1e3, "calls": float(e.count),
                    "bytes": float(e.self_cpu_memory_usage)} for e in prof.key_averages()}


def explain(candidate: dict[str, dict[str, float]], floor: dict[str, dict[str, float]], what: str = "ms",
            top: int = 3) -> str:
    """The ``top`` operators whose ``what`` ("ms" or "bytes") grows most from ``floor`` to ``candidate``,
    e.g. ``"aten::add_ +2.1 ms (+27 calls); aten::sum +1.3 ms (+27 calls)"``, and the total difference."""
    keys = set(candidate) | set(floor)
    zero = {"ms": 0.0, "calls": 0.0, "bytes": 0.0}
    diffs = sorted(((candidate.get(k, zero)[what] - floor.get(k, zero)[what],
                     candidate.get(k, zero)["calls"] - floor.get(k, zero)["calls"], k) for k in keys), reverse=True)
    total = sum(d for d, _, _ in diffs)
    unit, div = ("ms", 1.0) if what == "ms" else ("MiB", 2.0**20)
    parts = [f"{k} {d / div:+.1f} {unit} ({c:+.0f} calls)" for d, c, k in diffs[:top] if d > 0]
    return f"total {total / div:+.1f} {unit}; " + "; ".join(parts) if parts else f"total {total / div:+.1f} {unit}"
