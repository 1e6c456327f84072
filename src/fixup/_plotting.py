"""matplotlib, imported only when a figure is drawn (the library never imports it at import time)."""

from __future__ import annotations

from typing import Any

__all__ = ["pyplot"]


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend, or an error saying how to install it."""
    try:
        import matplotlib
    except ImportError as err:  # pragma: no cover - depends on the installation
        raise ImportError("figures need matplotlib: pip install 'fixup-lab[plots]'") from err
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
