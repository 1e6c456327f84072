"""Speed and memory of every model family under Fixup, its bare form and BatchNorm/LayerNorm, side by side.

The same benchmark as ``fixup bench`` (the code is fixup.bench.speed), runnable from a checkout with the same
options, e.g. every family x 1 and 2 threads x eager and compiled:

    python benchmarks/bench_models.py --compile --variants none fixup norm fixup-folded --threads 1 2 --reps 3 \
        --markdown --json bench.json

docs/performance.md gives each current figure with the exact command that measured it, what is measured and
how to read the ratios.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# Run from a checkout, benchmark the checkout's code (not another installed copy).
_SRC = Path(__file__).resolve().parents[1] / "src"
if (_SRC / "fixup").is_dir():
    sys.path.insert(0, str(_SRC))

from fixup.bench import speed as bench  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    bench.add_arguments(parser)
    return bench.run_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
