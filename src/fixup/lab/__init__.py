"""The laboratory: Fixup's theory made executable, and probes that diagnose real networks.

* :mod:`~fixup.lab.theory`: the exponent's budgets and the lesson's fixtures;
* :mod:`~fixup.lab.scalar`: the scalar residual network of section 3, its first SGD steps computed exactly;
* :mod:`~fixup.lab.probes`: per-layer and per-block statistics in train and eval mode;
* :mod:`~fixup.lab.update`: the functional update Δf of real networks against depth, with its log-log slope;
* :mod:`~fixup.lab.checks`: batch coupling, symmetry and residual-shape checks;
* :mod:`~fixup.lab.plots`: figures (matplotlib, imported only when plotting).

Every function returns data (flat records); the ``fixup lab`` command prints and plots them.
"""

from .checks import batch_coupling, residual_shapes, symmetry_probe
from .methods import METHODS, build_model, model_factory, sample_batch
from .probes import layer_stats
from .scalar import SCALAR_SCHEMES, ScalarConfig, forward_variance, scalar_sweep
from .theory import Budget, budget, independence_scale, lesson_lines, relu_std, row_normalise
from .update import depth_sweep, functional_update, loglog_slope, update_sweep

__all__ = [
    "METHODS",
    "SCALAR_SCHEMES",
    "Budget",
    "ScalarConfig",
    "batch_coupling",
    "budget",
    "build_model",
    "depth_sweep",
    "forward_variance",
    "functional_update",
    "independence_scale",
    "layer_stats",
    "lesson_lines",
    "loglog_slope",
    "model_factory",
    "relu_std",
    "residual_shapes",
    "row_normalise",
    "sample_batch",
    "scalar_sweep",
    "symmetry_probe",
    "update_sweep",
]
