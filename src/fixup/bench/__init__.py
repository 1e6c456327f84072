"""The benchmarks: speed and memory of every model family (:mod:`.speed`, behind ``fixup bench``; the families
and their variants in :mod:`.families`, the printed tables in :mod:`.tables`), very deep networks against depth
(:mod:`.deep`, behind ``fixup bench-deep``), and how they measure: peak memory of a step (:mod:`.memory`) and
operator profiles (:mod:`.profiling`). See docs/performance.md.

This package sits above the models (it builds them); nothing in the library below the command line imports
it. Nothing is imported here: ``fixup.bench.speed`` and the others are imported by what uses them.
"""
