"""Speed and memory: the lean forward (:mod:`.ops`), folding for inference (:mod:`.fold`), segment
checkpointing (:mod:`.checkpointing`), peak memory (:mod:`.memory`), operator profiles (:mod:`.profiling`) and
the benchmarks behind ``fixup bench`` (:mod:`.bench`, :mod:`.bench_families`) and ``fixup bench-deep``
(:mod:`.bench_deep`). See docs/performance.md.

Nothing is imported here: ``fixup.perf.ops`` and the others are imported by what uses them.
"""
