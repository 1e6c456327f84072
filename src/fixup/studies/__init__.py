"""The paper's studies as resumable runs of cells, and ``fixup reproduce``, which runs them all into one report.

>>> from fixup.studies import make_grid, reproduce
>>> result = reproduce(make_grid("quick"), "runs/quick", jobs=2)   # doctest: +SKIP
>>> result.report                                                   # doctest: +SKIP
PosixPath('runs/quick/report.md')
"""

from .cells import Cell, Task
from .grid import Grid, make_grid
from .registry import STUDIES, get_study
from .reproduce import ReproduceResult, reproduce
from .runner import Progress, run_tasks
from .store import Store

__all__ = ["STUDIES", "Cell", "Grid", "Progress", "ReproduceResult", "Store", "Task", "get_study", "make_grid",
           "reproduce", "run_tasks"]
