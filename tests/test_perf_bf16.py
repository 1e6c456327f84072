"""The training engine under bf16 (and fp16) autocast keeps Fixup's parameters float32 and moves its scalars as
float32 does."""

from __future__ import annotations

import torch

from fixup.nn import Bias, Scale
from fixup.train.config import TrainConfig
from fixup.train.engine import fit


def _moves(model: torch.nn.Module) -> torch.Tensor:
    """Every scalar's distance from its initial value (multipliers start at 1, biases at 0)."""
    moves = [m.scale.detach() - 1 for m in model.modules() if isinstance(m, Scale)]
    moves += [m.bias.detach() for m in model.modules() if isinstance(m, Bias)]
    return torch.cat([t.reshape(-1) for t in moves])


def test_engine_bf16_keeps_float32_parameters_and_the_scalars_updates():
    runs = {}
    for precision in ("fp32", "bf16"):
        config = TrainConfig(depth=8, epochs=1, max_updates=6, batch_size=32, precision=precision, seed=0)
        runs[precision] = fit(config, progress=False).model
    for p in runs["bf16"].parameters():
        assert p.dtype == torch.float32
    fp32, bf16 = (_moves(m) for m in (runs["fp32"], runs["bf16"]))
    assert fp32.numel() == 17  # ResNet-8: 3 blocks x (4 biases + multiplier), stem and head biases
    assert (fp32 != 0).float().mean() > 0.8 and (bf16 != 0).float().mean() > 0.8
    # the updates are mostly below bf16's spacing near 1 (2^-7), yet bf16 autocast keeps them as float32 does
    assert (fp32.abs() < 2**-7).float().mean() > 0.5
    assert (bf16 - fp32).norm() < 0.2 * fp32.norm(), ((bf16 - fp32).norm(), fp32.norm())


def test_engine_fp16_scales_the_loss_keeps_float32_parameters_and_moves_the_scalars():
    """fp16 autocast with the gradient scaler: every gradient, the scalars' included, is unscaled before the
    float32 step; the epoch's record gives the loss scale (65536 at the start, halved per skipped step)."""
    runs = {}
    for precision in ("fp32", "fp16"):
        config = TrainConfig(depth=8, epochs=1, max_updates=4, batch_size=16, precision=precision, seed=0)
        runs[precision] = fit(config, progress=False)
    assert "loss_scale" not in runs["fp32"].history[-1]
    assert runs["fp16"].history[-1]["loss_scale"] == 2.0**16  # no step of these four overflowed: none skipped
    for p in runs["fp16"].model.parameters():
        assert p.dtype == torch.float32
    fp32, fp16 = (_moves(r.model) for r in (runs["fp32"], runs["fp16"]))
    assert (fp16 != 0).float().mean() > 0.8
    assert (fp16 - fp32).norm() < 0.2 * fp32.norm(), ((fp16 - fp32).norm(), fp32.norm())
