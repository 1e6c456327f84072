"""The paper's figures, each with its source, and the claims our studies test.

Zhang, Dauphin & Ma, "Fixup Initialization: Residual Learning Without Normalization", ICLR 2019,
as summarised in the project's seed document (``SEEDS.md``). Every number the report prints for the
paper comes from here; plotting and report code never write a paper figure inline.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CLAIMS", "Claim", "PaperFigure", "claim"]


@dataclass(frozen=True)
class PaperFigure:
    """One figure of the paper: a value (a number, or a statement where the paper gives a plot) and where it is."""

    value: float | str
    unit: str
    source: str
    digits: int = 1  # decimals as printed in the paper

    def format(self) -> str:
        if isinstance(self.value, str):
            return self.value
        return f"{self.value:.{self.digits}f}{self.unit}"


# --- Figure 3: first-epoch test accuracy against depth (section 4.1) -------------------------------
DEPTH_PROTOCOL = {
    "architecture": "Wide-ResNet, width 1",
    "data": "CIFAR-10",
    "depths": (10, 100, 1000, 10000),
    "lr": 0.1,  # the default BatchNorm learning rate, held for every method
    "weight_decay": 5e-4,
    "batch": 128,  # 64 at 10,000 layers, "because of computational demands"
    "batch_10000": 64,
    "epochs": 1,
    "methods": ("fixup", "batchnorm", "lsuv", "sqrt2"),
    "source": "Figure 3",
}

# --- Table 1: CIFAR-10, ResNet-110, test error (%) ---------------------------------------------------
CIFAR10_RESNET110 = {
    "batchnorm": PaperFigure(6.61, "%", "Table 1 (CIFAR-10, ResNet-110)", 2),
    "none": PaperFigure(7.78, "%", "Table 1 (CIFAR-10, ResNet-110)", 2),  # Xavier init, smaller rate
    "fixup": PaperFigure(7.24, "%", "Table 1 (CIFAR-10, ResNet-110)", 2),
}

# --- Table 2: ImageNet top-1 test error (%) ----------------------------------------------------------
IMAGENET_RESNET50 = {
    "batchnorm": PaperFigure(23.6, "%", "Table 2 (ImageNet, ResNet-50)"),
    "none": PaperFigure(31.5, "%", "Table 2 (ImageNet, ResNet-50)"),  # Xavier init
    "fixup": PaperFigure(27.6, "%", "Table 2 (ImageNet, ResNet-50)"),
    "fixup+mixup": PaperFigure(24.0, "%", "Table 2 (ImageNet, ResNet-50)"),
    "groupnorm+mixup": PaperFigure(23.9, "%", "Table 2 (ImageNet, ResNet-50)"),
    "batchnorm+mixup": PaperFigure(23.3, "%", "Table 2 (ImageNet, ResNet-50)"),
}
# Table 2's training protocol is not in our sources (SEEDS.md): these are the defaults of the authors'
# released ImageNet script (imagenet/imagenet_train.py), lr/10 every 30 epochs, scalars at lr/10.
IMAGENET_PROTOCOL = {"batch": 256, "lr": 0.1, "weight_decay": 1e-4, "epochs": 90, "decay_every": 30,
                     "source": "the authors' imagenet/imagenet_train.py defaults (Table 2's protocol is not in "
                               "SEEDS.md)"}
IMAGENET_RESNET101 = {
    "batchnorm": PaperFigure(22.0, "%", "Table 2 (ImageNet, ResNet-101)"),
    "batchnorm+mixup": PaperFigure(20.8, "%", "Table 2 (ImageNet, ResNet-101)"),
    "groupnorm+mixup": PaperFigure(21.4, "%", "Table 2 (ImageNet, ResNet-101)"),
    "fixup+mixup": PaperFigure(21.4, "%", "Table 2 (ImageNet, ResNet-101)"),
}

# Mixup alpha chosen by cross-validation per method, and the scalar learning rate under strong
# regularisation (section 4.2).
MIXUP_ALPHA = {"batchnorm": 0.2, "groupnorm": 0.1, "fixup": 0.7}
SCALAR_LR_MULT_STRONG_REG = 0.1

# --- Appendix C: Wide-ResNet with Mixup and Cutout, test error (%) ----------------------------------
WRN_CIFAR10_REG = {
    "fixup": PaperFigure(2.3, "%", "Appendix C (CIFAR-10, Wide-ResNet, Mixup + Cutout)"),
    "batchnorm": PaperFigure(2.5, "%", "Appendix C (CIFAR-10, Wide-ResNet, with regularisation)"),
}
WRN_SVHN_REG = {
    "fixup": PaperFigure(1.4, "%", "Appendix C (SVHN, Wide-ResNet, with regularisation)"),
    "batchnorm": PaperFigure(1.4, "%", "Appendix C (SVHN, Wide-ResNet, with regularisation)"),
}

# --- Table 3: translation BLEU (higher is better), 200,000 updates ----------------------------------
DROPOUT_GRID = (0.3, 0.4, 0.5, 0.6)  # section 4.3: searched for both systems
IWSLT_DE_EN = {
    "layernorm": PaperFigure(34.2, " BLEU", "Table 3 (IWSLT De-En)"),
    "fixup": PaperFigure(34.5, " BLEU", "Table 3 (IWSLT De-En)"),
    "dropout": PaperFigure(0.5, "", "Section 4.3 (IWSLT De-En, chosen for both)"),
}
WMT16_EN_DE = {
    "layernorm": PaperFigure(29.3, " BLEU", "Table 3 (WMT16 En-De)"),
    "fixup": PaperFigure(29.3, " BLEU", "Table 3 (WMT16 En-De)"),
    "dropout": PaperFigure(0.4, "", "Section 4.3 (WMT16 En-De, chosen for both)"),
}


@dataclass(frozen=True)
class Claim:
    """A claim of the paper, its figures with their sources, and the study that tests it (None: none can)."""

    id: str
    statement: str
    figures: tuple[PaperFigure, ...]
    study: str | None
    why_not: str = ""  # for study=None: why this machine cannot test it

    def paper_text(self) -> str:
        return "; ".join(f"{f.format()}" for f in self.figures)

    def sources(self) -> str:
        seen: list[str] = []
        for f in self.figures:
            if f.source not in seen:
                seen.append(f.source)
        return "; ".join(seen)


def _fig(text: str, source: str) -> PaperFigure:
    return PaperFigure(text, "", source)


# How the tables' row keys read in the report.
ROW_LABELS = {"batchnorm": "BatchNorm", "groupnorm": "GroupNorm", "layernorm": "LayerNorm", "fixup": "Fixup",
              "none": "Xavier, no normalisation", "dropout": "dropout"}


def _label(key: str) -> str:
    return " + ".join(ROW_LABELS.get(part, part.capitalize()) for part in key.split("+"))


def _table(figs: dict[str, PaperFigure]) -> tuple[PaperFigure, ...]:
    return tuple(PaperFigure(f"{_label(k)} {f.format()}", "", f.source) for k, f in figs.items())


CLAIMS: tuple[Claim, ...] = (
    Claim("depth_fixup_trains_deep",
          "Fixup trains residual networks of up to 10,000 layers at learning rate 0.1 in the first epoch, "
          "tracking BatchNorm's first-epoch test accuracy",
          (_fig("Fixup tracks BatchNorm up to 10,000 layers (WRN width 1, CIFAR-10, lr 0.1, 1 epoch)",
                "Figure 3"),), "depth"),
    Claim("depth_baselines_fail",
          "LSUV and 1/sqrt(2) rescaling fail to train at that rate beyond 100 layers",
          (_fig("LSUV and 1/sqrt(2) fail beyond 100 layers at lr 0.1", "Figure 3"),), "depth"),
    Claim("no_norm_needs_small_rate",
          "Without normalisation, a standard initialisation cannot use the large learning rate",
          (_fig("Xavier without normalisation 'cannot use the large rate' (7.78% at a smaller one)",
                "Table 1 / section 4.1"),), "depth"),
    Claim("cifar10_resnet110",
          "ResNet-110 on CIFAR-10: Fixup (large rate) beats the unnormalised baseline and stays behind "
          "BatchNorm",
          _table(CIFAR10_RESNET110), "regularisation"),
    Claim("fixup_fits_training_set",
          "Without extra regularisation Fixup fits the training set at least as well as BatchNorm but "
          "tests worse: the remaining gap is regularisation, not optimisation",
          (_fig("Fixup reaches lower training error but higher test error than normalised ResNet-50",
                "Section 4.2 (ImageNet training curves)"),), "regularisation"),
    Claim("mixup_closes_gap",
          "Explicit regularisation (Mixup) closes most of Fixup's gap: regularisers are load-bearing",
          _table({k: IMAGENET_RESNET50[k] for k in ("fixup", "fixup+mixup", "batchnorm+mixup")}),
          "regularisation"),
    Claim("wrn_mixup_cutout",
          "With Mixup and Cutout, a Fixup Wide-ResNet matches or beats the regularised BatchNorm one",
          _table(WRN_CIFAR10_REG), "regularisation"),
    Claim("imagenet_resnet50",
          "ImageNet ResNet-50 top-1 error: BatchNorm, Xavier without normalisation, Fixup, each +/- Mixup",
          _table(IMAGENET_RESNET50), "paper_data"),
    Claim("imagenet_resnet101",
          "ImageNet ResNet-101: properly regularised Fixup is on par with GroupNorm",
          _table(IMAGENET_RESNET101), "paper_data"),
    Claim("svhn_wrn",
          "SVHN Wide-ResNet with regularisation: Fixup equals BatchNorm",
          _table(WRN_SVHN_REG), "paper_data"),
    Claim("translation_iwslt",
          "A Fixup Transformer (no LayerNorm) matches the LayerNorm Transformer in BLEU, with the same "
          "dropout chosen for both",
          _table(IWSLT_DE_EN),
          "translation"),
    Claim("translation_wmt",
          "WMT16 En-De: Fixup and LayerNorm tie",
          _table({k: v for k, v in WMT16_EN_DE.items() if k != "dropout"}), None,
          why_not="WMT16 is not on this machine and 200,000 updates of a big Transformer need a GPU cluster"),
    Claim("ablation_rule2_necessary",
          "Rule 2 (depth scaling of branch weights) is necessary: without it, very deep networks do not "
          "train at the large rate",
          (_fig("rule 2 is 'sufficient and necessary' for training extremely deep networks",
                "Section 3 / ablation"),), "ablation"),
    Claim("ablation_scale_x0.1",
          "Scaling branch weights 10x below Fixup's factor slows optimisation",
          (_fig("x0.1 'slows optimisation'", "Ablation (section 4)"),), "ablation"),
    Claim("ablation_scale_x10",
          "Scaling branch weights 10x above Fixup's factor destabilises training",
          (_fig("x10 'can destabilise training'", "Ablation (section 4)"),), "ablation"),
    Claim("ablation_zero_branch",
          "All-zero residual branches perform poorly",
          (_fig("all-zero branch weights 'perform poorly'", "Ablation (section 4)"),), "ablation"),
    Claim("ablation_no_bias",
          "Removing the scalar biases degrades results",
          (_fig("removing scalar biases 'degrades results'", "Ablation (section 4)"),), "ablation"),
    Claim("ablation_no_scale",
          "The scalar multiplier helps (it mimics weight-norm dynamics, so no new schedule is needed)",
          (_fig("one multiplier per branch 'mimics useful weight-norm dynamics'", "Section 3, rule 3"),),
          "ablation"),
    Claim("theory_fixed_update",
          "With Fixup the first-step functional change stays of order the learning rate at every depth; "
          "without the depth factor it grows with depth",
          (_fig("Δf = Θ(η) for any L with the L^(-1/(2m-2)) factor; aligned branch updates add like L",
                "Section 2-3, Appendix B"),), "theory"),
    # Not claims of the paper, which runs no batch-size experiment: the use the method is built for (SEEDS.md: no
    # mini-batch statistics, "attractive where batch-dependent behaviour ... [is] problematic"), as issue 36 asks.
    Claim("batch_independent_trains",
          "A batch-independent network (Fixup) trains where BatchNorm cannot: at small batches it is clearly more "
          "accurate than BatchNorm, each at its own rate",
          (_fig("no figure: the paper runs no batch-size experiment; Fixup computes no mini-batch statistics",
                "not in the paper: its motivation"),), "batch"),
    Claim("fixup_groupnorm_every_batch",
          "Fixup is on par with GroupNorm (within 1 point) at every batch size",
          (_fig("Fixup + Mixup 21.4% = GroupNorm + Mixup 21.4% (ImageNet ResNet-101, one batch size)", "Table 2"),),
          "batch"),
)


def claim(claim_id: str) -> Claim:
    for c in CLAIMS:
        if c.id == claim_id:
            return c
    raise ValueError(f"unknown claim {claim_id!r}; known: {', '.join(c.id for c in CLAIMS)}")
