"""Initialisation, one module per method; :data:`fixup.METHODS` is the index.

Each row of :data:`fixup.METHODS` names its initialiser (``Method.initialiser``), one module here:

- :mod:`~fixup.init.fixup`: Fixup's rule and its ablations (:func:`fixup_init_`);
- :mod:`~fixup.init.baselines`: He, Xavier, the 1/sqrt(2) rescaling, the normalised networks;
- :mod:`~fixup.init.lsuv`: LSUV, finished on the first batch by :func:`data_init_`;
- :mod:`~fixup.init.gates`: SkipInit and ReZero, a gate at 0 on every branch;
- :mod:`~fixup.init.nf_resnet`: NF-ResNets' weight-standardised blocks ``h + alpha * F(h / beta)``;
- :mod:`~fixup.init.t_fixup`: T-Fixup's scaling of the Transformer without LayerNorm;
- :mod:`~fixup.init.fans`: the per-group fans and standard draws they all start from.

A model's constructor ends with ``self.init_report = initialise_(self, method, generator=generator)``;
:func:`initialise_` re-initialises a built model by its own method. :data:`INITIALISERS` is the one registry of
initialisers. To add a method: a row in :mod:`fixup.method` naming an initialiser here, and, if none fits, a module
with ``initialise_(model, method, *, generator=None, base=None) -> InitReport`` (its report names the method and
lists what it did, layer by layer), registered in :data:`INITIALISERS`. What every initialiser does around its own
rule (the branches checked, the normalisation still present, the sweep over the rest of the model) is
:mod:`fixup.init._skeleton`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..method import Method, as_method
from ..report import InitReport, warn_report
from . import baselines, fixup, gates, lsuv, nf_resnet, t_fixup
from ._layers import check_output_scale
from .baselines import describe_init, he_init_, xavier_init_, zero_last_norm_gains_
from .fans import BASE_INITS, FAN_MODES, base_std, fans, groups_of, he_std, orthonormal_, xavier_std
from .fixup import branch_scale, fixup_init_, zero_branches_
from .lsuv import data_init_, lsuv_, orthonormal_init_

__all__ = [
    "BASE_INITS",
    "FAN_MODES",
    "INITIALISERS",
    "base_std",
    "branch_scale",
    "data_init_",
    "describe_init",
    "fans",
    "fixup_init_",
    "groups_of",
    "he_init_",
    "he_std",
    "initialise_",
    "lsuv_",
    "orthonormal_",
    "orthonormal_init_",
    "xavier_init_",
    "xavier_std",
    "zero_branches_",
    "zero_last_norm_gains_",
]

Initialiser = Callable[..., InitReport]
# The registry of initialisers: Method.initialiser -> the function that initialises a model for it.
INITIALISERS: dict[str, Initialiser] = {
    "fixup": fixup.initialise_,
    "baselines": baselines.initialise_,
    "lsuv": lsuv.initialise_,
    "gates": gates.initialise_,
    "nf_resnet": nf_resnet.initialise_,
    "t_fixup": t_fixup.initialise_,
}


@torch.no_grad()
def initialise_(model: nn.Module, method: Method | str | None = None, *, generator: torch.Generator | None = None,
                base: str | None = None) -> InitReport:
    """Initialise ``model`` for ``method`` (default: the model's own, ``model.method``) and return the report.

    A constructor's last step, and the way to re-initialise a built model by its own method. ``base`` is the
    standard initialisation the Fixup and gated forms start from (default: the model's ``init_base``, else He).
    A data-dependent method (LSUV) leaves ``report.data_init_pending`` set until :func:`data_init_` has run on
    a batch. The report's warnings are issued as :class:`fixup.FixupWarning`.
    """
    if method is None:
        method = getattr(model, "method", None)
        if not isinstance(method, Method):
            raise ValueError(f"{type(model).__name__} was not built for a method of fixup.METHODS; name one: "
                             "initialise_(model, 'fixup')")
    elif not isinstance(method, Method):  # a name, given directly (a constructor passes the Method it resolved)
        method = as_method(method)
    if method.initialiser not in INITIALISERS:
        raise ValueError(f"method {method.name!r} names the initialiser {method.initialiser!r}, which fixup.init does "
                         f"not have; choose one of {', '.join(INITIALISERS)} (or add it to fixup.init.INITIALISERS)")
    check_output_scale(model, method)
    report = INITIALISERS[method.initialiser](model, method, generator=generator, base=base)
    report.output_scale = method.output_scale
    warn_report(report, stacklevel=4)
    return report
