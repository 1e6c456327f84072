"""Mixup, Cutout and label smoothing: the properties that define them."""

from __future__ import annotations

import torch

from fixup.train import cutout, mixup, soft_targets


def test_soft_targets_smooth_and_sum_to_one() -> None:
    t = soft_targets(torch.tensor([0, 3]), 4, smoothing=0.2)
    assert torch.allclose(t.sum(1), torch.ones(2))
    assert torch.allclose(t[0], torch.tensor([0.85, 0.05, 0.05, 0.05]))


def test_mixup_mixes_inputs_and_targets_with_one_lambda() -> None:
    g = torch.Generator().manual_seed(0)
    targets = soft_targets(torch.arange(8) % 5, 5, smoothing=0.1)
    # Feeding the targets as the inputs too: both must be mixed by the same lambda and partner.
    x, t, lam = mixup(targets.clone(), targets, alpha=0.7, generator=g)
    assert 0.0 < lam < 1.0
    assert torch.allclose(x, t)
    assert torch.allclose(t.sum(1), torch.ones(8))
    assert (t >= 0).all()
    lams = torch.tensor([mixup(targets, targets, 0.2, g)[2] for _ in range(400)])
    # Beta(0.2, 0.2) is U-shaped: mean 1/2, most mass near 0 and 1.
    assert abs(lams.mean() - 0.5) < 0.06 and ((lams < 0.1) | (lams > 0.9)).float().mean() > 0.5


def test_cutout_zeroes_exactly_the_patch() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.rand(64, 3, 12, 12) + 1.0  # no zeros before Cutout
    out, boxes = cutout(x, 4, g)
    for b in range(64):
        top, bottom, left, right = boxes[b].tolist()
        inside = torch.zeros(12, 12, dtype=torch.bool)
        inside[top:bottom, left:right] = True
        assert (out[b][:, inside] == 0).all()
        assert torch.equal(out[b][:, ~inside], x[b][:, ~inside])
        assert 0 < bottom - top <= 4 and 0 < right - left <= 4
        if 0 < top and bottom < 12 and 0 < left and right < 12:
            assert (bottom - top, right - left) == (4, 4)
    sides = (boxes[:, 1] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 2])
    assert ((out == 0).sum((1, 2, 3)) == 3 * sides).all()
    assert (sides < 16).any() and (sides == 16).any()  # centres anywhere: some patches are clipped
