"""``fixup.adapt`` on branches that end in a concatenation or a sum of several weight paths (docs/adapt.md,
"Branches that end in several paths"): the last layer of each path is zeroed, m counts the path with the most
layers, every block is the identity at initialisation, the logits are exactly zero, and a few SGD steps train.
On a hand-written branch (two parallel end layers concatenated, two summed) and on timm's GhostNet."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fixup
from adapt_zoo import ZOO
from fixup import FixupWarning, adapt, branch_scale
from fixup.branch import find_branches
from test_adapt_zoo import _needs

GHOSTNET = "ghostnet_100 (timm GhostNet, concatenated ends)"


class SplitEnd(nn.Module):
    """``x + join(fc2a(h), fc2b(h))`` with ``h = relu(fc1(norm(x)))``: the branch's last layer split in two parallel
    layers, their outputs concatenated (``join="cat"``, each half as wide) or summed (``"sum"``)."""

    def __init__(self, join: str, dim: int = 16, hidden: int = 32) -> None:
        super().__init__()
        self.join = join
        out = dim // 2 if join == "cat" else dim
        self.norm, self.fc1 = nn.LayerNorm(dim), nn.Linear(dim, hidden)
        self.fc2a, self.fc2b = nn.Linear(hidden, out), nn.Linear(hidden, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(self.norm(x)))
        a, b = self.fc2a(h), self.fc2b(h)
        return x + (torch.cat([a, b], dim=-1) if self.join == "cat" else a + b)


class SplitNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem, self.cat, self.sum, self.head = nn.Linear(8, 16), SplitEnd("cat"), SplitEnd("sum"), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.sum(self.cat(self.stem(x))))


def _batch(n: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g)


def _block_changes(model: nn.Module, *args: torch.Tensor) -> tuple[dict[str, float], torch.Tensor]:
    """Each residual block's largest |output - shortcut(input)| on ``args`` (its branch's output: 0 where the block
    starts as its shortcut, the identity or GhostNet's projection ``block.shortcut``), and the model's output."""
    changes: dict[str, float] = {}

    def hook(block: nn.Module, a: tuple[torch.Tensor, ...], o: torch.Tensor, name: str) -> None:
        changes[name] = float((o - getattr(block, "shortcut", nn.Identity())(a[0])).abs().max())

    hooks = [block.register_forward_hook(lambda m, a, o, name=name: hook(m, a, o, name))
             for name, block in model.named_modules() if callable(getattr(block, "residual_branches", None))]
    with torch.no_grad():
        out = model.eval()(*args)
    for h in hooks:
        h.remove()
    return changes, out


def _trains(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int) -> list[float]:
    """The loss of ``steps`` SGD steps (the README's recipe: fixup.param_groups, lr 0.1, momentum 0.9, clip 1)."""
    opt = torch.optim.SGD(fixup.param_groups(model, 0.1), lr=0.1, momentum=0.9)
    model.train()
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss))
    return losses


def test_a_split_last_layer_zeroes_each_path_and_counts_m_per_path() -> None:
    torch.manual_seed(0)
    model, report = adapt(SplitNet(), _batch()[0])
    assert report.num_branches == 2
    for b, block in zip(report.branches, ("cat", "sum")):
        # fc1 then fc2a or fc2b: two layers per path, not the three of the branch.
        assert (b.name, b.m, b.factor) == (block, 2, pytest.approx(branch_scale(2, 2)))
        assert [s.name for s in b.scaled] == [f"{block}.fc1"]
        assert [z.name for z in (b.zeroed, *b.also_zeroed)] == [f"{block}.fc2a", f"{block}.fc2b"]
        assert b.has_scale
    for _, branch in find_branches(model):
        assert branch.ends == 2 and all(not layer.weight.any() and not layer.bias.any() for layer in branch.zeroed)
        assert branch.inner[0].weight.any()
        # One multiplier for the branch, after each of its two parallel ends.
        assert branch.zeroed[0].fixup_scale is branch.zeroed[1].fixup_scale is branch.scale
    assert report.residuals[0].layers == ["cat.fc1", "cat.fc2a", "cat.fc2b"]


def test_a_split_last_layer_starts_as_the_identity_and_trains() -> None:
    torch.manual_seed(0)
    x, y = _batch()
    model, _ = adapt(SplitNet(), x)
    changes, logits = _block_changes(model, x)
    assert changes == {"cat": 0.0, "sum": 0.0}
    assert not logits.any()
    losses = _trains(model, x, y, steps=20)
    assert losses[0] == pytest.approx(torch.log(torch.tensor(3.0)).item())
    assert losses[-1] < 0.8 * losses[0], losses
    # Every zeroed end moved: each receives the branch's gradient (not the feeder, whose ReLU would stop it).
    assert all(layer.weight.any() for _, b in find_branches(model) for layer in b.zeroed)


def test_a_path_without_a_weight_layer_is_refused_naming_the_join() -> None:
    class HalfIdentity(nn.Module):  # cat([fc(x), x]): the second half never starts at zero
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(8, 8), nn.Linear(8, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.cat([self.fc2(torch.relu(self.fc1(x))), x[:, :4]], dim=-1)

    with pytest.raises(fixup.AdaptError, match=r"node 'add'.*branch ends in 'getitem'.* passes through no weight "
                                                r"layer\); zeroing that layer would not make the branch zero"):
        adapt(HalfIdentity(), torch.randn(2, 8))


def _ghostnet() -> nn.Module:
    entry = ZOO[GHOSTNET]
    _needs(entry.needs)
    torch.manual_seed(0)
    return entry.build()


def test_ghostnet_zeroes_both_convolutions_of_each_ghost_module() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FixupWarning)  # GhostNet's forward branches on self.training
        model, report = adapt(_ghostnet(), ZOO[GHOSTNET].example())
    for b in report.branches:
        assert [z.name for z in (b.zeroed, *b.also_zeroed)] == [f"{b.name}.ghost2.primary_conv.0",
                                                                f"{b.name}.ghost2.cheap_operation.0"]
    # The first block of a stage that changes width: a depthwise and a pointwise convolution, set as trunk layers.
    assert [r.shortcut for r in report.residuals].count("projection") == 5
    assert "blocks.1.0.shortcut.2" in [t.name for t in report.trunk]
    # The multiplier follows the primary convolution: the cheap one reads its output, so both halves get it once.
    for _, branch in find_branches(model):
        primary, cheap = branch.zeroed
        assert primary.fixup_scale is branch.scale and not hasattr(cheap, "fixup_scale")


def test_ghostnet_starts_as_the_identity_and_trains() -> None:
    x = torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    y = torch.randint(0, 10, (16,), generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FixupWarning)
        model, report = adapt(_ghostnet(), x[:2])
    changes, logits = _block_changes(model, x)
    assert len(changes) == report.num_branches == 16 and set(changes.values()) == {0.0}
    assert not logits.any()
    losses = _trains(model, x, y, steps=6)
    assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.parametrize("method", [m for m in fixup.ADAPT_METHODS if fixup.METHODS[m].adapt == "gate"])
@pytest.mark.parametrize("build", [SplitNet, _ghostnet], ids=["split", "ghostnet"])
def test_the_gated_methods_put_one_gate_after_the_ends(build, method: str) -> None:
    x = torch.randn(4, 3, 32, 32) if build is _ghostnet else _batch()[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FixupWarning)
        model, report = adapt(build(), x, method=method)
    changes, _ = _block_changes(model, x)
    assert set(changes.values()) == {0.0} and len(changes) == report.num_branches
    for _, branch in find_branches(model):  # the gate, not the weights, starts the branch at zero
        assert isinstance(branch.scale, fixup.Gate) and all(layer.weight.any() for layer in branch.zeroed)


class DeclaredSplit(nn.Module):
    """A block written for the library: it declares its split last layer itself (``Branch.ends``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2a, self.fc2b = nn.Linear(8, 16), nn.Linear(16, 4), nn.Linear(16, 4)
        self.scale = fixup.nn.Scale()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        return x + self.scale(torch.cat([self.fc2a(h), self.fc2b(h)], dim=-1))

    def residual_branches(self) -> list[fixup.Branch]:
        return [fixup.Branch([self.fc1, self.fc2a, self.fc2b], kind="split", m=2, scale=self.scale, ends=2)]


def test_the_protocol_declares_several_ends_and_the_report_round_trips() -> None:
    model = nn.Sequential(DeclaredSplit(), DeclaredSplit(), DeclaredSplit(), DeclaredSplit())
    report = fixup.fixup_init_(model, expect_biases=False)
    assert [(b.m, b.factor, b.zeroed.name, [z.name for z in b.also_zeroed]) for b in report.branches] == \
        [(2, pytest.approx(4 ** -0.5), f"{i}.fc2a", [f"{i}.fc2b"]) for i in range(4)]
    assert all(not m.fc2a.weight.any() and not m.fc2b.weight.any() and m.fc1.weight.any() for m in model)
    assert "zeroed fc2a, fc2b" in report.format()
    assert type(report).from_dict(report.to_dict()) == report
    with pytest.raises(ValueError, match=r"ends=4 must be a whole number from 1 to the branch's 3 layers"):
        fixup.Branch([nn.Linear(2, 2)] * 3, ends=4)
