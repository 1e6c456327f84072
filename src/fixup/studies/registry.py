"""The studies by name, in the order ``fixup reproduce`` runs and reports them."""

from __future__ import annotations

from . import ablation, batch, depth, paper_data, regularisation, theory, translation
from .base import Study

__all__ = ["STUDIES", "get_study"]

STUDIES: dict[str, Study] = {s.name: s for s in (depth.STUDY, ablation.STUDY, regularisation.STUDY, paper_data.STUDY,
                                                    translation.STUDY, theory.STUDY, batch.STUDY)}


def get_study(name: str) -> Study:
    if name not in STUDIES:
        raise ValueError(f"unknown study {name!r}; choose one of {', '.join(STUDIES)}")
    return STUDIES[name]
