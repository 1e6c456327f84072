"""Shared fixtures."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def one_thread():
    """The machine is shared; small convolutions run fastest on one thread."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
