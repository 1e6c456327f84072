"""Models written elsewhere: the public seam to :func:`fixup.adapt` and its command line.

The training engine, the laboratory and ``fixup inspect --adapt`` load a user's model by ``module:factory``,
make example inputs from shapes and adapt the model through this module; the machinery stays private in
``fixup._adapt``.
"""

from __future__ import annotations

from ._adapt import adapt
from ._adapt._cli import add_arguments as add_adapt_arguments
from ._adapt._cli import check_arguments as check_adapt_arguments
from ._adapt._cli import example_inputs, load_factory
from ._adapt._cli import run as run_adapt

__all__ = ["adapt", "add_adapt_arguments", "check_adapt_arguments", "example_inputs", "load_factory", "run_adapt"]
