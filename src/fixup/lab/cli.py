"""``fixup lab ...``: argument parsing and printing for the laboratory; the work is in the lab modules.

Subcommands: ``theory``, ``scalar``, ``update``, ``probe MODEL``, ``stream MODEL``, ``coupling MODEL``,
``signal MODEL``, ``scalars RUN``. Each prints a
table, writes its records with ``--json PATH`` and a figure with ``--plot PATH``.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from typing import Any

import torch

from .._checks import check_numbers

__all__ = ["register"]


def _ints(text: str) -> list[int]:
    try:
        return [int(float(v)) for v in text.split(",") if v.strip()]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers like 10,100,1000, "
                                         f"got {text!r}") from err


def _names(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        return f"{v:.4g}"
    if isinstance(v, list):
        return "x".join(map(str, v)) if all(isinstance(a, int) for a in v) else str(v)
    return str(v)


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """A plain text table of ``columns`` from ``rows``."""
    cells = [[_fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def _finish(args: argparse.Namespace, data: Any, plot: Any = None) -> int:
    from .._io import write_json

    if args.json:
        write_json(args.json, data)
        print(f"wrote {args.json}")
    if args.plot and plot is not None:
        print(f"wrote {plot(args.plot)}")
    return 0


def _theory(args: argparse.Namespace) -> int:
    check_numbers(args, positive=("depths", "variance_depths", "draws", "eta"))
    _check_m(args.m)
    from . import plots
    from .scalar import forward_variance
    from .theory import budget, exponents, lesson_fixtures, lesson_lines

    print("\n".join(lesson_lines()))
    budgets = [budget(L, args.m, args.eta).to_dict() for L in args.depths]
    print(f"\nfirst-step budgets (m={args.m}, eta={args.eta}): aligned updates add like L, independent like sqrt(L)")
    print(table(budgets, ["L", "scale", "path_gain", "per_branch", "aligned_total", "independent_total",
                          "independence_scale", "independence_aligned_total"]))
    variance = forward_variance([L for L in args.variance_depths], m=args.m, draws=args.draws)
    print(f"\nforward second moment E[f^2]/x^2 at initialisation, scalar network, {args.draws} draws")
    print(table(variance, ["L", "standard_exact", "standard_mean_f2", "standard_median_f2", "fixup_mean_f2",
                           "fixup_max_abs_f_minus_x"]))
    data = {"lesson": lesson_fixtures(), "exponents": exponents(tuple(sorted({2, 3, args.m}))), "budgets": budgets,
            "forward_variance": variance}
    return _finish(args, data, lambda p: plots.plot_forward_variance(variance, p))


def _scalar(args: argparse.Namespace) -> int:
    check_numbers(args, positive=("depths", "eta"), finite=("x", "y"))
    _check_m(args.m)
    from . import plots
    from .scalar import ScalarConfig, scalar_sweep

    cfg = ScalarConfig(m=args.m, eta=args.eta, x=args.x, y=args.y, draw=args.draw, updates=args.updates, seed=args.seed)
    records = scalar_sweep(args.depths, args.schemes, cfg)
    print(f"scalar network: m={cfg.m}, eta={cfg.eta}, x={cfg.x}, y={cfg.y}, {cfg.draw} weights, {cfg.updates} updates")
    print(table(records, ["scheme", "L", "factor", "sum_gain2", "df1", "df1_over_eta", "df2",
                          "inner_moved_step1", "inner_moved_step2"]))
    return _finish(args, {"config": cfg.__dict__, "records": records}, lambda p: plots.plot_scalar(records, p))


def _update(args: argparse.Namespace) -> int:
    check_numbers(args, positive=("depths", "steps", "batch", "size", "num_classes"), nonneg=("lr", "scalar_lr"))
    from . import plots
    from .update import update_sweep

    result = update_sweep(args.model, args.depths, methods=args.methods, lr=args.lr, steps=args.steps,
                          batch=args.batch, size=args.size, num_classes=args.num_classes,
                          scalar_lr_factor=args.scalar_lr, seed=args.seed, per_block=args.blocks)
    c = result["config"]
    print(f"{c['model']}: Δf of SGD steps {c['steps']} at lr {c['lr']} (scalars x{c['scalar_lr_factor']}), "
          f"batch {c['batch']} of {c['size']}x{c['size']} Gaussian images")
    columns = ["method", "depth", "L", "step", "loss", "df", "df_max", "df_rel"]
    if args.blocks:
        columns += ["block_df_rel_max", "block_df_rel_argmax"]
    print(table(result["records"], columns))
    fits = [{"method": m, "quantity": q, **f} for m, by in result["fits"].items() for q, f in by.items()]
    print("\nlog-log fit against L (df@k: Δf of step k; df_max@k: largest Δf of steps 1..k; diverged points "
          "are excluded and counted)")
    print(table(fits, ["method", "quantity", "slope", "stderr", "n", "excluded"]))
    return _finish(args, result, lambda p: plots.plot_update(result, p))


def _stream(args: argparse.Namespace) -> int:
    from ..data import load_digits
    from .stream import stream_probe

    check_numbers(args, positive=("size", "num_classes", "depth"), nonneg=("lr", "scalar_lr_mult"))
    if args.batch < 2 or args.steps < 1:
        raise ValueError(f"--batch must be at least 2 and --steps at least 1, got {args.batch} and {args.steps}")
    digits = load_digits(size=args.size if args.size != 8 else 0, channels=3)
    x, y = digits.train.batch(torch.arange(min(args.batch, len(digits.train))))
    mean, std = torch.tensor(digits.mean)[:, None, None], torch.tensor(digits.std)[:, None, None]
    x = (x - mean) / std
    model = _model(args, args.method, x)
    data = stream_probe(model, x, y, steps=args.steps, lr=args.lr, scalar_lr_mult=args.scalar_lr_mult,
                        stream_budget=args.budget)
    rate = (f"each at lr {data['stream_bias_lr']:.3g} (one scalar's {data['scalar_lr']:.3g} shared by "
            f"{data['stream_biases']})" if data["stream_budget"]
            else f"each at the scalar rate {data['scalar_lr']:.3g}")
    print(f"{args.model} ({args.method}): {data['stream_biases']} stream biases, {rate}")
    print(f"gradients of the stream biases at step {data['grad_step']} (the first with any), per stage "
          "(offset_speed: how much faster the stage's offset moves than one bias)")
    print(table(data["stages"], ["stage", "blocks", "grad_mean", "relative_spread", "identical", "offset_speed"]))
    print(f"\nthe first {args.steps} SGD steps on one digits batch of {x.shape[0]} (lr {args.lr}, momentum 0.9): "
          "loss, live fraction of the classifier's input, offset of each stage")
    columns = list(data["steps"][0])
    print(table(data["steps"], columns))
    return _finish(args, {"model": args.model, "method": args.method, **data})


def _signal(args: argparse.Namespace) -> int:
    from .._adapt import AdaptError
    from .._adapt._options import takes_trunk
    from ..external import example_inputs, load_factory
    from ..models import create_model
    from .signal import compare_signal

    torch.manual_seed(args.seed)
    if ":" in args.model:
        made = load_factory(args.model)()
        model, example = made if isinstance(made, tuple) else (made, None)
    else:
        overrides = {"depth": args.depth} if args.depth is not None else {}
        model, example = create_model(args.model, norm="batchnorm", num_classes=args.num_classes, **overrides), None
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"{args.model}: the factory returned {type(model).__name__}, not an nn.Module")
    if args.input_shape or example is None:
        example = example_inputs(args.input_shape or ["8,3,32,32"], args.token_inputs)
    forms: dict[str, Any] = {}
    refused: dict[str, str] = {}
    for method in args.method:
        for rule in args.trunk if takes_trunk(method) else [None]:
            label = ", ".join(x for x in (method if len(args.method) > 1 else "",
                                          f"trunk {rule}" if rule and (len(args.trunk) > 1 or len(args.method) == 1)
                                          else "") if x)
            try:
                result = compare_signal(model, example, method=method, **({"trunk": rule} if rule else {}))
            except AdaptError as err:
                refused[method] = str(err).splitlines()[0]
                break
            forms.setdefault("normalised", result["normalised"])
            forms[f"adapted ({label})" if label else "adapted"] = result["adapted"]
    if not forms:
        raise ValueError(f"every method refused {args.model}: " + "; ".join(f"{m}: {w}" for m, w in refused.items()))
    ref = next(iter(forms.values()))
    print(f"{args.model}: the stream's RMS at initialisation, x the input's ({ref.input_rms:.3g}), "
          f"one batch of {tuple(example[0].shape)}")
    level = "blocks" if args.blocks else "stages"
    names = [r.name for r in getattr(ref, level)]
    rows = [{level[:-1]: n, **{f: next((r.ratio for r in getattr(sig, level) if r.name == n), None)
                                for f, sig in forms.items()}} for n in names]
    print(table(rows, [level[:-1], *forms]))
    for form, sig in forms.items():
        out = sig.outside()
        if out and form != "normalised":
            print(f"{form}: outside [0.5, 2]x at {', '.join(r.name for r in out)}")
    for method, why in refused.items():
        print(f"{method}: refused ({why})")
    from . import plots
    return _finish(args, {"model": args.model, **{f: s.to_dict() for f, s in forms.items()}},
                   lambda p: plots.plot_signal(forms, p))


def _model(args: argparse.Namespace, method: str, data: Any) -> Any:
    from .methods import build_model

    kwargs: dict[str, Any] = {"num_classes": args.num_classes, "data": data}
    if args.depth is not None:
        kwargs["depth"] = args.depth
    try:
        return build_model(args.model, method, seed=args.seed, **kwargs)
    except (ValueError, TypeError) as err:
        if "unknown method" in str(err) or "unknown model" in str(err):
            raise
        raise ValueError(f"{err}. `fixup lab {args.lab_command}` feeds Gaussian images (batch, 3, size, size) to "
                         f"image classifiers; for {args.model!r} call fixup.lab.layer_stats / batch_coupling / "
                         "symmetry_probe / residual_shapes with a batch of its own inputs") from err


def _probe(args: argparse.Namespace) -> int:
    check_numbers(args, positive=("batch", "size", "num_classes", "depth"), nonneg=("lr", "sym_steps"))
    from . import plots
    from .checks import residual_shapes, symmetry_probe
    from .methods import sample_batch
    from .probes import layer_stats

    x, y = sample_batch(args.batch, args.size, 3, args.num_classes, args.seed)
    model = _model(args, args.method, x)
    stats = layer_stats(model, x, y)
    shown = stats if args.all else [r for r in stats if r["role"] in ("block", "classifier")]
    print(f"{args.model} ({args.method}): per-{'module' if args.all else 'block'} statistics, train and eval mode")
    print(table(shown, ["mode", "name", "role", "mean", "std", "frac_zero", "frac_saturated", "grad_norm",
                        "param_norm"]))
    sym = symmetry_probe(model, x, y, lr=args.lr, steps=args.sym_steps)
    flagged = [r for r in sym if r["flagged"]]
    print(f"\nsymmetry after {args.sym_steps} SGD step(s): {len(flagged)} of {len(sym)} weight layers "
          "have identical units")
    if flagged:
        print(table(flagged, ["name", "units", "identical", "identical_nonzero", "zero_units", "groups", "largest"]))
    shapes = residual_shapes(model, x)
    bad = [r for r in shapes if not r["ok"]]
    print(f"\nresidual shapes: {len(shapes) - len(bad)} of {len(shapes)} residual sums match")
    for r in bad:
        print(f"  {r['block']}: {r['message']}")
    data = {"model": args.model, "method": args.method, "stats": stats, "symmetry": sym, "residual_shapes": shapes}
    return _finish(args, data, lambda p: plots.plot_layer_stats(stats, p))


def _coupling(args: argparse.Namespace) -> int:
    check_numbers(args, positive=("companions", "size", "num_classes", "depth"))
    from . import plots
    from .checks import batch_coupling
    from .methods import sample_batch

    x, _ = sample_batch(1 + 2 * args.companions, args.size, 3, args.num_classes, args.seed)
    probe, a, b = x[:1], x[1: 1 + args.companions], x[1 + args.companions:]
    records = []
    for method in args.methods:
        model = _model(args, method, x)
        records += [{"method": method, **r} for r in batch_coupling(model, probe, a, b)]
    print(f"{args.model}: change of one example's outputs when its {args.companions} companions change")
    print(table(records, ["method", "mode", "output", "output_rel", "blocks", "blocks_rel", "worst_block"]))
    return _finish(args, records, lambda p: plots.plot_coupling(records, p))


def _scalars(args: argparse.Namespace) -> int:
    from ..train.scalars import ALL, read_scalars
    from . import plots

    epochs = read_scalars(args.run)
    rows = [{"epoch": e["epoch"], "step": e["step"], **r} for e in epochs for r in e["scalars"]
            if args.stages or r["stage"] == ALL]
    if not rows:
        print(f"{args.run}: {len(epochs)} epochs recorded, no scalars (the model has no Fixup scalar and no gate)")
        return _finish(args, {"run": str(args.run), "scalars": epochs})
    print(f"{args.run}: the method's scalars per epoch (0: at initialisation), "
          + ("per kind and stage" if args.stages else "per kind over the whole model (--stages: per stage)"))
    print(table(rows, ["epoch", "step", "kind", "stage", "count", "mean", "std", "min", "max", "mean_abs"]))
    return _finish(args, {"run": str(args.run), "scalars": epochs},
                   lambda p: plots.plot_scalars(epochs, p, title=str(args.run)))


def _check_m(m: int) -> None:
    if m < 2:
        raise ValueError(f"--m must be >= 2 weight layers per branch (the Fixup factor L^(-1/(2m-2)) needs m > 1), "
                         f"got {m}")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="PATH", help="also write the records as JSON to this file")
    p.add_argument("--plot", metavar="PATH", help="also write a figure to this file (PNG; needs matplotlib)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the sample inputs")


def _model_args(p: argparse.ArgumentParser, methods: bool = False) -> None:
    p.add_argument("model", help="a registered model name (`fixup list`), e.g. resnet20 or resnet_cifar")
    if methods:
        p.add_argument("--methods", type=_names, default=["fixup", "batchnorm"],
                       help="comma-separated methods (fixup, fixup_no_depth_scale, none, batchnorm, ...)")
    else:
        p.add_argument("--method", default="fixup",
                       help="fixup (default), fixup_no_depth_scale, none (He), sqrt2, lsuv, batchnorm, ...")
    p.add_argument("--depth", type=int, default=None, help="depth, for models that take one (default None: the "
                                                           "model's own)")
    p.add_argument("--num-classes", type=int, default=10, help="classifier outputs")
    p.add_argument("--size", type=int, default=8, help="side of the Gaussian sample images in pixels")


def _add_theory(labsub: argparse._SubParsersAction) -> None:
    p = labsub.add_parser("theory", help="the lesson's fixtures, first-step budgets, forward variance at init")
    p.add_argument("--depths", type=_ints, default=[1, 10, 100, 1000, 10000], help="L values for the budgets")
    p.add_argument("--variance-depths", type=_ints, default=[1, 5, 10, 20, 50, 100],
                   help="L values for the forward variance of the scalar network")
    p.add_argument("--m", type=int, default=2, help="weight layers per residual branch")
    p.add_argument("--eta", type=float, default=0.1, help="learning rate of the first-step budgets")
    p.add_argument("--draws", type=int, default=2000, help="random draws for the forward variance")
    _common(p)
    p.set_defaults(func=_theory)


def _add_scalar(labsub: argparse._SubParsersAction) -> None:
    p = labsub.add_parser("scalar", help="the scalar network of section 3: exact first-step Δf against depth")
    p.add_argument("--depths", type=_ints, default=[10, 100, 1000, 10000, 100000],
                   help="comma-separated numbers of residual branches L")
    p.add_argument("--schemes", type=_names, default=["fixup", "unscaled", "sqrt", "zero", "fixup_x0.1", "fixup_x10"],
                   help="comma-separated initialisation schemes of the branch weights")
    p.add_argument("--m", type=int, default=2, help="weight layers per residual branch")
    p.add_argument("--eta", type=float, default=0.1, help="SGD learning rate")
    p.add_argument("--x", type=float, default=1.0, help="scalar input")
    p.add_argument("--y", type=float, default=2.0, help="regression target")
    p.add_argument("--draw", choices=("constant", "gaussian"), default="constant",
                   help="initial weights: all equal to the scheme's scale, or Gaussian with that spread")
    p.add_argument("--updates", choices=("aligned", "random_sign"), default="aligned",
                   help="gradients of the second step: the exact (aligned) ones, or with random signs")
    _common(p)
    p.set_defaults(func=_scalar)


def _add_update(labsub: argparse._SubParsersAction) -> None:
    p = labsub.add_parser("update", help="measured Δf of SGD steps against depth on a real network")
    p.add_argument("--model", default="resnet_cifar", help="a registered model that takes depth=")
    p.add_argument("--depths", type=_ints, default=[20, 56, 110], help="comma-separated model depths")
    p.add_argument("--methods", type=_names, default=["fixup", "fixup_no_depth_scale", "none"],
                   help="comma-separated initialisation methods")
    p.add_argument("--steps", type=_ints, default=[1, 10], help="steps to measure (1 is the first)")
    p.add_argument("--lr", type=float, default=0.1, help="SGD learning rate")
    p.add_argument("--scalar-lr", type=float, default=1.0,
                   help="learning-rate factor of Fixup's scalar biases and multipliers (0 holds them fixed)")
    p.add_argument("--batch", type=int, default=8, help="examples in the Gaussian batch")
    p.add_argument("--size", type=int, default=8, help="side of the Gaussian sample images in pixels")
    p.add_argument("--num-classes", type=int, default=10, help="classifier outputs")
    p.add_argument("--blocks", action="store_true", help="also measure every residual block's change")
    _common(p)
    p.set_defaults(func=_update)


def _add_probe(labsub: argparse._SubParsersAction) -> None:
    p = labsub.add_parser("probe", help="per-block statistics, symmetry and residual-shape checks of a model")
    _model_args(p)
    p.add_argument("--batch", type=int, default=10, help="examples in the Gaussian batch")
    p.add_argument("--lr", type=float, default=0.1, help="SGD rate of the symmetry probe")
    p.add_argument("--sym-steps", type=int, default=2, help="SGD steps before judging symmetry")
    p.add_argument("--all", action="store_true", help="show every module, not only blocks and classifier")
    _common(p)
    p.set_defaults(func=_probe)


def _add_stream(labsub: argparse._SubParsersAction) -> None:
    p = labsub.add_parser("stream", help="the stream biases' shared gradient: per stage, and the offset over the first "
                                         "steps")
    _model_args(p)
    p.add_argument("--batch", type=int, default=32, help="digits images in the batch (default 32)")
    p.add_argument("--steps", type=int, default=10, help="SGD steps to follow (default 10)")
    p.add_argument("--lr", type=float, default=0.1, help="the weights' learning rate (default 0.1)")
    p.add_argument("--scalar-lr-mult", type=float, default=0.1, help="the scalars' rate relative to --lr (default 0.1)")
    p.add_argument("--budget", action=argparse.BooleanOptionalAction, default=None,
                   help="give the stream biases one scalar's rate between them (default: as the method says)")
    _common(p)
    p.set_defaults(func=_stream)


def _add_signal(labsub: argparse._SubParsersAction) -> None:
    p = labsub.add_parser("signal", help="the stream's RMS at initialisation, stage by stage: normalised beside "
                                         "adapted")
    p.add_argument("model", help="a registered model name (built with BatchNorm, then adapted) or MODULE:FACTORY / "
                                 "path/to/file.py:FACTORY returning any model (or model, example input)")
    p.add_argument("--trunk", type=_names, default=["lsuv"],
                   help="comma-separated trunk rules of fixup.adapt to compare (lsuv, fan_in, none; default lsuv)")
    p.add_argument("--method", type=_names, default=["fixup"],
                   help="comma-separated methods of fixup.adapt to compare (fixup, skipinit, rezero, nf_resnet, "
                        "nf_resnet_nozero, dyt, t_fixup; default fixup); the trunk rules apply to those that take one")
    p.add_argument("--input-shape", action="append", metavar="SHAPE",
                   help="the example batch's shape (default 8,3,32,32; repeat for several inputs)")
    p.add_argument("--token-inputs", type=int, default=0, metavar="VOCAB",
                   help="example inputs are token ids below VOCAB instead of normal floats")
    p.add_argument("--depth", type=int, default=None, help="depth, for registered models that take one")
    p.add_argument("--num-classes", type=int, default=10, help="classifier outputs of a registered model")
    p.add_argument("--blocks", action="store_true", help="one row per residual block instead of per stage")
    _common(p)
    p.set_defaults(func=_signal)


def _add_scalars(labsub: argparse._SubParsersAction) -> None:
    p = labsub.add_parser("scalars", help="a run's scalars over training: Fixup's multipliers and biases, the gates "
                                          "of SkipInit and ReZero, per epoch")
    p.add_argument("run", help="a run folder (fixup train --out-dir; a study or compare cell's folder), its "
                               "scalars.jsonl or its result.json")
    p.add_argument("--stages", action="store_true", help="one row per stage, not only each kind over the model")
    p.add_argument("--json", metavar="PATH", help="also write the records as JSON to this file")
    p.add_argument("--plot", metavar="PATH", help="also write a figure to this file (PNG; needs matplotlib)")
    p.set_defaults(func=_scalars)


def _add_coupling(labsub: argparse._SubParsersAction) -> None:
    p = labsub.add_parser("coupling", help="does one example's output depend on its batch companions?")
    _model_args(p, methods=True)
    p.add_argument("--companions", type=int, default=7, help="examples beside the probed one in its batch")
    _common(p)
    p.set_defaults(func=_coupling)


def register(sub: argparse._SubParsersAction) -> None:
    lab = sub.add_parser("lab", help="the laboratory: Fixup's theory made executable, probes of real networks")
    labsub = lab.add_subparsers(dest="lab_command", required=True)
    for add in (_add_theory, _add_scalar, _add_update, _add_probe, _add_stream, _add_signal, _add_scalars,
                _add_coupling):  # in the order `fixup lab --help` lists them
        add(labsub)
