"""``fixup train``: the command line over :func:`fixup.train.fit`, its options generated from TrainConfig.

Every config field is an option (``scalar_lr_mult`` -> ``--scalar-lr-mult``; booleans take
``--x/--no-x``; ``--betas 0.9 0.98``; ``--milestones 0.5 0.75``; ``--extra '{"k": 1}'``) whose help is
the field's comment. ``--config PATH`` starts from a saved config.json. Unknown options are an error.
``--dp`` trains privately (DP-SGD through Opacus: ``--target-epsilon 8`` or ``--noise-multiplier``, ``--delta``,
``--max-grad-norm``; needs ``pip install 'fixup-lab[dp]'``). Exit codes: 0 completed, 3 diverged, 5 collapsed,
2 bad options or input, 130 / 143 stopped by SIGINT / SIGTERM (a checkpoint of the last finished step is kept in
--out-dir; the same command resumes it).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import os
import re
import sys
import typing
from pathlib import Path
from typing import Any

from .._io import json_object, read_json
from ..method import resolve_method
from .config import SECTIONS, TrainConfig
from .recipe import finetune_defaults

__all__ = ["config_from_args", "register"]


@functools.cache
def field_comments(cls: type) -> dict[str, str]:
    """Each field's trailing comment in the source of the dataclass ``cls`` and its bases: the option's help.

    Read once per class (finding a class's source parses its module)."""
    pattern = re.compile(r"^\s+(\w+): [^=]+=.*?#\s*(.+)$")
    comments: dict[str, str] = {}
    for klass in reversed(cls.__mro__[:-1]):
        comments.update({m.group(1): m.group(2) for line in inspect.getsource(klass).splitlines()
                         if (m := pattern.match(line))})
    return comments


def add_config_options(parser: argparse.ArgumentParser, *, defaults: TrainConfig | None = None,
                       skip: tuple[str, ...] = ()) -> None:
    """One option per TrainConfig field, in one group per section (leaving out the sections in ``skip``).

    Only the options given end up in the parsed namespace; ``defaults`` is the config whose values the
    help shows (the command's own starting point; TrainConfig() by default).
    """
    hints = typing.get_type_hints(TrainConfig)
    comments = field_comments(TrainConfig)
    defaults = defaults or TrainConfig()
    for name, section in SECTIONS.items():
        if name not in skip:
            _add_section(parser, name, section, hints, comments, defaults)


def _add_section(parser: argparse.ArgumentParser, name: str, section: type, hints: dict[str, Any],
                 comments: dict[str, str], defaults: TrainConfig) -> None:
    group = parser.add_argument_group(f"{name} options", (section.__doc__ or "").strip().splitlines()[0])
    for f in dataclasses.fields(section):
        flag, tp, shown = "--" + f.name.replace("_", "-"), hints[f.name], getattr(defaults, f.name)
        if f.name not in comments:
            raise TypeError(f"TrainConfig.{f.name} has no comment; its comment is the option's help text")
        kw: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS,
                              "help": f"{comments[f.name]} (default: {shown!r})".replace("%", "%%")}
        if tp is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, **kw)
        elif tp in (int, float, str):
            group.add_argument(flag, type=tp, metavar=tp.__name__.upper(), **kw)
        elif typing.get_origin(tp) is tuple:
            args = typing.get_args(tp)
            nargs = "+" if args[-1] is Ellipsis else len(args)
            group.add_argument(flag, type=args[0], nargs=nargs, metavar=args[0].__name__.upper(), **kw)
        elif typing.get_origin(tp) is dict:
            group.add_argument(flag, type=json_object, metavar="JSON", **kw)
        else:  # a field type this generator does not know: fail loudly rather than skip the option
            raise TypeError(f"TrainConfig.{f.name} has type {tp}, which `fixup train` cannot parse")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The config from ``--config`` (if given) with the options given on the command line applied."""
    base = TrainConfig()
    if getattr(args, "config", None):
        base = TrainConfig.from_dict(read_json(args.config, expect=dict, what="--config file"))
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    changes = {k: v for k, v in vars(args).items() if k in names}
    for key in ("betas", "milestones"):
        if key in changes:
            changes[key] = tuple(changes[key])
    if "init" in changes and "norm" not in changes:  # --init METHOD alone: the method's own norm, over --config's
        try:
            resolve_method(base.norm or None, changes["init"] or None)
        except ValueError:
            changes["norm"] = ""
    if changes.get("extra", {}).get("converted") and not getattr(args, "config", None):
        changes = {**finetune_defaults(changes), **changes}  # fine-tuning a converted model: its recipe
    return base.replace(**changes)


def _train(args: argparse.Namespace) -> int:
    from .._io import write_json
    from .._signals import Interrupted
    from .engine import CHECKPOINT, fit

    config = config_from_args(args)
    if args.force:
        config = config.replace(resume=False)
    try:
        result = fit(config, out_dir=args.out_dir, progress=not args.no_progress)
    except Interrupted as err:  # during start-up, before the first step: the run folder is as it was
        err.kept = err.kept or (f"{args.out_dir} is as it was before this run" if args.out_dir else
                                "nothing was kept (no --out-dir)")
        raise
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun only the first process reports
        return result.exit_code
    final, outcome = result.final, result.outcome
    if result.stopped_by:
        where = f"epoch {outcome.epoch + 1}, step {outcome.step}"
        raise Interrupted.from_name(result.stopped_by, kept=(
            f"stopped after step {outcome.step}; checkpoint of {where} kept in {Path(args.out_dir) / CHECKPOINT}"
            if args.out_dir and config.checkpoint else
            f"stopped after step {outcome.step}; nothing was kept (give --out-dir to make runs resumable)"))
    if result.already_ended:
        metrics = ", ".join(f"{k} {v:.4f}" for k, v in final.items() if k.startswith("test_"))
        print(f"fixup train: the run in {args.out_dir} already ended ({outcome.status} after {outcome.step} steps"
              + (f": {metrics}" if metrics else "") + "); nothing was trained. Add --force to train it again from "
              "the start, or choose another --out-dir", file=sys.stderr)
        return result.exit_code
    metrics = ", ".join(f"{k} {v:.4f}" for k, v in final.items() if k.startswith(("train_", "test_")))
    print(f"{outcome.status} after {len(result.history)} epoch(s), {outcome.step} steps" +
          (f": {metrics}" if metrics else "") + (f"\n{outcome.reason}" if outcome.reason else ""))
    groups = "; ".join(f"{g['name']}: {g['count']} tensors, lr {g['lr']:g}, weight decay {g['weight_decay']:g}"
                       for g in result.param_groups)
    print(f"parameter groups: {groups}")
    print("recipe: " + "; ".join(result.recipe.get("notes", [])))
    if result.privacy:
        pv = result.privacy
        print(f"privacy: epsilon {pv['epsilon']:.3f} spent at delta {pv['delta']:g} after {pv['steps']} noisy steps "
              f"({pv['accountant']} accountant; noise multiplier {pv['noise_multiplier']:.4g} from "
              f"{pv['noise_from']}, per-example clipping at {pv['max_grad_norm']:g}, Poisson sampling at rate "
              f"{pv['sample_rate']:.4g}, expected batch {pv['expected_batch_size']})")
    if args.out_dir:
        print(f"run folder: {args.out_dir} (parameters of each group in run.json)")
    if args.json:
        write_json(args.json, result.to_dict())
    return result.exit_code


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a model (images by default; see docs/training.md)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", default=None, help="run folder: config, metrics, checkpoint, result (resumed "
                                                   "when it holds a checkpoint)")
    p.add_argument("--config", default=None, metavar="PATH", help="start from a saved config.json")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the result (history, outcome) as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (default: a bar on the terminal)")
    p.add_argument("--force", action="store_true", help="train from the start even if --out-dir holds a run that "
                                                        "already ended (default: report that run and stop)")
    add_config_options(p)
    p.set_defaults(func=_train)

