"""fixup-lab: Fixup initialisation for residual networks without normalisation.

>>> import fixup
>>> model = fixup.create_model("resnet20", norm="fixup")
>>> report = fixup.fixup_init_(model)
>>> report.num_branches
9
"""

from ._adapt import (
    ADAPT_METHODS,
    TRUNK_RULES,
    AdaptError,
    AdaptReport,
    DyTAdaptReport,
    GateAdaptReport,
    NFAdaptReport,
    TFixupAdaptReport,
    adapt,
    load_original,
    trunk_init_,
)
from ._convert import (
    ConvertError,
    ConvertReport,
    ConvertWarning,
    SharedNormWarning,
    StatisticsWarning,
    TrainModeWarning,
    convert,
    load_converted,
    save_converted,
)
from .branch import Branch, FixupClassifier, ResidualBlock, WeightSlice
from .clip import adaptive_clip_grad_
from .groups import param_groups
from .init import branch_scale, fixup_init_
from .method import METHODS, Method, resolve_method
from .models import create_model, list_models, register_model
from .nn import Bias, DyT, Gate, Scale, residual_add
from .perf.checkpointing import enable_checkpointing
from .perf.fold import fold_for_inference
from .report import FixupReport, FixupWarning, InitReport

__version__ = "0.1.0"

__all__ = [
    "ADAPT_METHODS",
    "METHODS",
    "TRUNK_RULES",
    "AdaptError",
    "AdaptReport",
    "Bias",
    "Branch",
    "ConvertError",
    "ConvertReport",
    "ConvertWarning",
    "DyT",
    "DyTAdaptReport",
    "FixupClassifier",
    "FixupReport",
    "FixupWarning",
    "Gate",
    "GateAdaptReport",
    "InitReport",
    "Method",
    "NFAdaptReport",
    "ResidualBlock",
    "Scale",
    "SharedNormWarning",
    "StatisticsWarning",
    "TFixupAdaptReport",
    "TrainModeWarning",
    "WeightSlice",
    "adapt",
    "adaptive_clip_grad_",
    "branch_scale",
    "convert",
    "create_model",
    "enable_checkpointing",
    "fixup_init_",
    "fold_for_inference",
    "list_models",
    "load_converted",
    "load_original",
    "param_groups",
    "register_model",
    "residual_add",
    "resolve_method",
    "save_converted",
    "trunk_init_",
]
