"""The accounting report: what an initialiser of :mod:`fixup.init` did to a model, as data.

It is the "model contract" of an initialisation: enough for another implementation to be
checked against it (L, m and the factor per branch, which layers were zeroed, scaled or left
alone, the scalars present, the normalisation still there and its axes, epsilon, affine
parameters and running state).

Every report lives here, one module per initialiser's report (as :mod:`fixup.init` has one module per
initialiser): :mod:`~fixup.report.base` (:class:`InitReport`, what they share, and :class:`FixupWarning`),
:mod:`~fixup.report.fixup`, :mod:`~fixup.report.gates`, :mod:`~fixup.report.nf_resnet`,
:mod:`~fixup.report.t_fixup`, and the records they are made of (:mod:`~fixup.report.records`).
"""

from .base import FixupWarning, InitReport, some_of, warn_report
from .fixup import FixupReport
from .gates import GateReport
from .nf_resnet import NFReport
from .records import (
    BranchRecord,
    GateRecord,
    LayerRecord,
    LSUVRecord,
    NFBlockRecord,
    NormRecord,
    describe_norm,
    layer_records,
)
from .t_fixup import TFixupReport

__all__ = ["BranchRecord", "FixupReport", "FixupWarning", "GateRecord", "GateReport", "InitReport", "LSUVRecord",
           "LayerRecord", "NFBlockRecord", "NFReport", "NormRecord", "TFixupReport", "describe_norm", "layer_records",
           "some_of", "warn_report"]
