"""Speed and memory of CIFAR ResNets under Fixup, BatchNorm and no normalisation, side by side.

The same benchmark as ``fixup bench`` (the code is fixup.bench), runnable from a checkout:

    python benchmarks/bench_models.py --depths 20 56 110 --batch 128 --json bench.json

See docs/performance.md for what is measured and how to read the ratios.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# Run from a checkout, benchmark the checkout's code (not another installed copy).
_SRC = Path(__file__).resolve().parents[1] / "src"
if (_SRC / "fixup").is_dir():
    sys.path.insert(0, str(_SRC))

from fixup import bench  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    bench.add_arguments(parser)
    return bench.run_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
