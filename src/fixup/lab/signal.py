"""Signal propagation at initialisation in the laboratory: a model's residual stream beside its
:func:`fixup.adapt`-ed copy's, stage by stage (the measurement itself is :mod:`fixup.signal`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor, nn

from ..signal import SIGNAL_BAND, SignalRecord, StreamSignal, output_rms, residual_blocks, stage_names, stream_signal

__all__ = ["SIGNAL_BAND", "SignalRecord", "StreamSignal", "compare_signal", "output_rms", "residual_blocks",
           "stage_names", "stream_signal"]


def compare_signal(model: nn.Module, example_input: Tensor | Sequence[Tensor], **adapt_options: Any
                   ) -> dict[str, StreamSignal]:
    """The stream of ``model`` as it is (``"normalised"``) beside its adapted copy (``"adapted"``), at the same
    blocks and stages; ``adapt_options`` go to :func:`fixup.adapt` (e.g. ``trunk="none"`` to see the stream
    without the trunk rule, ``method="dyt"`` to see it with DyT in place of each LayerNorm)."""
    from .._adapt import adapt  # the lab measures adapt's result
    from ..method import as_method

    adapted, _ = adapt(model, example_input, **adapt_options)
    if as_method(adapt_options.get("method", "fixup")).adapt == "dyt":
        # DyT declares no branch: the residual sums are those Fixup's adaptation finds, which DyT leaves as they were
        blocks = residual_blocks(adapt(model, example_input)[0])
    else:
        blocks = residual_blocks(adapted)
    return {"normalised": stream_signal(model, example_input, blocks=blocks),
            "adapted": stream_signal(adapted, example_input, blocks=blocks)}
