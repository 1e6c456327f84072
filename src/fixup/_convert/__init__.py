"""``fixup.convert``: a *trained* model without normalisation, computing the same function, ready to fine-tune.

:func:`fixup.adapt` re-initialises what it touches: it serves training from scratch. ``convert`` keeps the trained
function. It records the model with adapt's machinery (:mod:`fixup._adapt._record`, ``_graph``, ``_rewrite``) and
returns a copy (same class) in which

* every BatchNorm, with its running statistics (its eval-mode function), is folded exactly into the weight layer
  before it, or becomes a per-channel :class:`~fixup._convert._layers.ChannelAffine` where none can take it
  (:mod:`fixup._convert._fold`);
* LayerNorm/GroupNorm, which normalise each example by its own statistics, become a fitted per-channel affine or
  Dynamic Tanh where the user chooses one (``per_example_norms``), with the change each causes measured, and
  are refused otherwise (:mod:`fixup._convert._norms`);
* each residual branch gets Fixup's scalars at their identity values (a :class:`fixup.Scale` at 1 after its last
  layer, :class:`fixup.Bias` at 0 before its layers and activations, one before the classifier), or for
  ``method="skipinit"``/``"rezero"`` a :class:`fixup.Gate` at **1** (not adapt's 0: a gate at 0 would cut the
  trained branch off), so that :func:`fixup.param_groups` gives them their rates when fine-tuning;
* nothing is re-initialised, and the outputs are checked against the original's on held-out inputs in eval mode.
"""

from ._layers import ChannelAffine, DynamicTanh, FusedAffineTail
from ._norms import PER_EXAMPLE_OPTIONS
from ._pipeline import convert
from ._report import (
    ConvertError,
    ConvertReport,
    ConvertWarning,
    NormFate,
    SharedNormWarning,
    StatisticsWarning,
    TrainModeWarning,
)
from ._save import load_converted, save_converted

__all__ = ["PER_EXAMPLE_OPTIONS", "ChannelAffine", "ConvertError", "ConvertReport", "ConvertWarning", "DynamicTanh",
           "FusedAffineTail", "NormFate", "SharedNormWarning", "StatisticsWarning", "TrainModeWarning", "convert",
           "load_converted", "save_converted"]
