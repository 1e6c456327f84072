"""Adapted models train without normalisation at the BatchNorm learning rate (0.1) on digits.

Fixup's claim (section 4.1) is that the rule makes the normalised network's learning rate usable
without normalisation. Two models written elsewhere, adapted from their normalised form: a
torchvision-style ResNet (BasicBlock, projection shortcuts) and a classifier built on
``nn.TransformerEncoder`` that reads each 8x8 digit as a sequence of 8 rows. A short plain SGD loop over
``fixup.param_groups`` (momentum 0.9, weight decay 5e-4, batch 64, no clipping), a few seconds each on one
core; a normalised model's groups hold only its weights.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fixup import adapt, param_groups
from fixup.data import load_digits
from test_adapt import BasicBlock, ResNet, no_norm_left


def _digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    data = load_digits()
    mean, std = data.mean[0], data.std[0]
    return ((data.train.images - mean) / std, data.train.labels, (data.test.images - mean) / std, data.test.labels)


def _train(model: nn.Module, shape: tuple[int, ...], epochs: int, seed: int = 0) -> tuple[float, list[float]]:
    """Train with SGD at lr 0.1 over the model's optimiser groups; return the test accuracy and the losses."""
    xtr, ytr, xte, yte = _digits()
    opt = torch.optim.SGD(param_groups(model, lr=0.1, weight_decay=5e-4), lr=0.1, momentum=0.9)
    order = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(epochs):
        model.train()
        perm = torch.randperm(len(ytr), generator=order)
        for i in range(0, len(perm), 64):
            idx = perm[i:i + 64]
            loss = nn.functional.cross_entropy(model(xtr[idx].reshape(-1, *shape)), ytr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        accuracy = (model(xte.reshape(-1, *shape)).argmax(1) == yte).float().mean().item()
    return accuracy, losses


class RowTransformer(nn.Module):
    """Digits as sequences of 8 rows of 8 pixels: a linear embedding, learnt positions, a post-norm
    ``nn.TransformerEncoder`` (2 layers, width 32, 4 heads), mean pooling and a linear classifier."""

    def __init__(self, width: int = 32, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Linear(8, width)
        self.pos = nn.Parameter(torch.zeros(8, width))
        layer = nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, 8 rows, 8 pixels)
        return self.head(self.encoder(self.embed(x) + self.pos).mean(1))


def test_adapted_resnet_trains_at_the_batchnorm_learning_rate() -> None:
    torch.manual_seed(0)
    net = ResNet(BasicBlock, [1, 1, 1], width=16, in_channels=1, small_input=True)
    model, report = adapt(net, torch.randn(2, 1, 8, 8), generator=torch.Generator().manual_seed(0))
    assert report.num_branches == 3 and no_norm_left(model)
    accuracy, losses = _train(model, (1, 8, 8), epochs=4)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert accuracy >= 0.85, f"adapted ResNet reached only {accuracy:.3f} test accuracy"


def test_adapted_transformer_classifier_trains_at_the_batchnorm_learning_rate() -> None:
    torch.manual_seed(0)
    model, report = adapt(RowTransformer(), torch.randn(2, 8, 8), generator=torch.Generator().manual_seed(0))
    assert [b.kind for b in report.branches] == ["attention", "mlp"] * 2 and no_norm_left(model)
    accuracy, losses = _train(model, (8, 8), epochs=8)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert accuracy >= 0.8, f"adapted Transformer classifier reached only {accuracy:.3f} test accuracy"


def _without_norms(model: nn.Module) -> nn.Module:
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, (nn.BatchNorm2d, nn.LayerNorm)):
                setattr(module, name, nn.Identity())
    return model


def _resnet(seed: int, blocks: list[int] | None = None) -> nn.Module:
    torch.manual_seed(seed)
    net = ResNet(BasicBlock, blocks or [1, 1, 1], width=16, in_channels=1, small_input=True)
    for m in net.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
    return net


def _transformer(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return RowTransformer()


@pytest.mark.slow
def test_digits_accuracy_table(capsys: pytest.CaptureFixture[str]) -> None:
    """The figures of docs/adapt.md: Fixup-adapted vs normalised vs bare, 3 seeds each, printed (-s)."""
    rows = {}
    for label, build, shape, epochs in (("ResNet", _resnet, (1, 8, 8), 4), ("Transformer", _transformer, (8, 8), 8)):
        for method in ("fixup.adapt", "normalised", "norms removed"):
            accs = []
            for seed in range(3):
                model = build(seed)
                if method == "fixup.adapt":
                    model, _ = adapt(model, torch.randn(2, *shape), generator=torch.Generator().manual_seed(seed))
                elif method == "norms removed":
                    model = _without_norms(model)
                with _no_mha_fastpath():
                    accs.append(_train(model, shape, epochs, seed)[0])
            rows[(label, method)] = accs
    with capsys.disabled():
        for (label, method), accs in rows.items():
            t = torch.tensor(accs)
            print(f"{label:<12}{method:<15}" + " ".join(f"{a:.3f}" for a in accs)
                  + f"  mean {t.mean():.3f} +- {t.std():.3f} (n=3)")
    assert torch.tensor(rows[("ResNet", "fixup.adapt")]).mean() >= 0.85
    assert torch.tensor(rows[("Transformer", "fixup.adapt")]).mean() >= 0.8


class _no_mha_fastpath:
    """The stock encoder's eval fast path reads its LayerNorms' eps; the norm-free baseline has none."""

    def __enter__(self) -> None:
        self.was = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(False)

    def __exit__(self, *exc: object) -> None:
        torch.backends.mha.set_fastpath_enabled(self.was)


@pytest.mark.slow
def test_at_depth_the_bare_network_diverges_and_the_adapted_one_trains() -> None:
    """18 BasicBlocks (38 layers) at lr 0.1: without normalisation, He init diverges; Fixup trains."""
    for seed in (0, 1):
        model, _ = adapt(_resnet(seed, [6, 6, 6]), torch.randn(2, 1, 8, 8),
                         generator=torch.Generator().manual_seed(seed))
        accuracy, losses = _train(model, (1, 8, 8), 3, seed)
        assert torch.isfinite(torch.tensor(losses)).all() and accuracy >= 0.7
        _, bare_losses = _train(_without_norms(_resnet(seed, [6, 6, 6])), (1, 8, 8), 3, seed)
        assert not torch.isfinite(torch.tensor(bare_losses)).all() or max(bare_losses) > 1e3
