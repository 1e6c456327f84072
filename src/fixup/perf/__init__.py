"""The fast paths the models run on: the lean forward (:mod:`.ops`), folding for inference (:mod:`.fold`) and
segment checkpointing (:mod:`.checkpointing`). See docs/performance.md.

This package sits below the models (they import it) and imports only :mod:`fixup.nn` and :mod:`fixup.branch`;
the benchmarks that measure it are in :mod:`fixup.bench`. Nothing is imported here: ``fixup.perf.ops`` and
the others are imported by what uses them.
"""
