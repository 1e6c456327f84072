"""Fine-tuning a converted Transformer on a shifted translation task (issue 37, the text side).

``fixup translate --extra '{"converted": FILE, "vocab_dir": DIR}'`` fine-tunes a LayerNorm Transformer converted by
``fixup.convert`` from its saved weights (src/fixup/translation/task.py); benchmarks/transfer_text.py compares it
with the LayerNorm model fine-tuned alike.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import fixup
from fixup.train import fit
from fixup.train.task import Shard
from fixup.translation.task import TranslationTask, translation_config

ROOT = Path(__file__).resolve().parent.parent
TINY = {"d_model": 32, "ffn_dim": 64, "encoder_layers": 1, "decoder_layers": 1}
SHIFTED = {"synthetic_main_order": "verb-final", "synthetic_adjective_order": "before"}


def _config(work: Path, **changes):
    extra = {"work_dir": str(work), "synthetic_train": 200, "synthetic_eval": 20, "max_tokens": 512,
             "vocab_size": 200, "bleu_limit": 0, "model": TINY, **changes.pop("extra", {})}
    base = {"model": "transformer_tiny", "device": "cpu", "max_updates": 1, "warmup_steps": 1, "lr": 1e-3,
            "dropout": 0.0, "checkpoint": False}
    return translation_config(**{**base, "extra": extra, **changes})


def _trained_like(task: TranslationTask, config) -> nn.Module:
    """A LayerNorm Transformer whose norms' gains and shifts are not at their initial values, in eval mode."""
    torch.manual_seed(0)
    model = task.build_model(config)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.3)
    return model.eval()


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """Task A, a trained-like LayerNorm model on it, and each option's converted model saved."""
    work = tmp_path_factory.mktemp("source")
    config = _config(work, norm="layernorm")
    task = TranslationTask(config, work_dir=work)
    model = _trained_like(task, config)
    example = task.first_batch()
    saved = {}
    for option in ("affine", "dyt"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", fixup.FixupWarning)
            converted, report = fixup.convert(model, tuple(t[:2] for t in example), per_example_norms=option,
                                              calibration=[example])
        path = work / f"converted_{option}.pt"
        fixup.save_converted(path, converted, report)
        saved[option] = (str(path), converted, report)
    return {"work": work, "task": task, "model": model, "saved": saved}


def _target_config(source, tmp_path, option: str, **changes):
    extra = {**SHIFTED, "vocab_dir": str(source["work"] / "vocab"), "converted": source["saved"][option][0]}
    return _config(tmp_path / "target", extra=extra, **changes)


@pytest.mark.parametrize("option", ["affine", "dyt"])
def test_a_converted_transformer_loads_as_it_was_converted(source, tmp_path, option, one_thread) -> None:
    """The translate task builds the saved converted model: the converted function exactly, no LayerNorm left, the
    weights read with weights_only=True; and the conversion's change is reported, finite and not zero."""
    path, converted, report = source["saved"][option]
    assert torch.load(path, weights_only=True)["format"] == "fixup-converted/1"
    config = _target_config(source, tmp_path, option)
    task = TranslationTask(config, work_dir=tmp_path / "target")
    loaded = task.build_model(config)
    assert loaded.training
    assert not any(isinstance(m, nn.LayerNorm) for m in loaded.modules())
    src, tgt_in = source["task"].first_batch()
    with torch.no_grad():
        expected, original = converted.eval()(src, tgt_in), source["model"](src, tgt_in)
        assert torch.equal(loaded.eval()(src, tgt_in), expected)
    assert math.isfinite(report.rms_change) and 0 < report.rms_change <= report.max_change
    assert not torch.allclose(expected, original)  # a LayerNorm is approximated, and the report says so


def test_the_fine_tuning_starts_from_the_converted_weights(source, tmp_path, one_thread) -> None:
    """Step 0's loss is the converted model's loss on the first batch of the shifted task: nothing re-initialised
    (a Fixup model at initialisation, whose logits are zero, gives another)."""
    config = _target_config(source, tmp_path, "dyt")
    task = TranslationTask(config, work_dir=tmp_path / "target")
    batch = next(iter(task.train_batches(0, Shard())))
    with torch.no_grad():
        expected = task.loss(source["saved"]["dyt"][1].eval(), batch)[0].item()
        fresh = task.loss(task._registered_model(config, "fixup").eval(), batch)[0].item()
    losses: list[float] = []
    result = fit(config, task=task, progress=False, on_step=lambda info: losses.append(info.loss))
    assert result.outcome == "completed"
    assert losses[0] == pytest.approx(expected, rel=1e-5)
    assert abs(fresh - expected) > 1e-3


def test_fixup_translate_fine_tunes_a_converted_model(source, tmp_path, capsys, one_thread) -> None:
    from fixup.cli import main

    extra = {**SHIFTED, "converted": source["saved"]["affine"][0], "vocab_dir": str(source["work"] / "vocab"),
             "synthetic_train": 200, "synthetic_eval": 10, "max_tokens": 512, "bleu_limit": 0, "model": TINY}
    code = main(["translate", "--extra", json.dumps(extra), "--lr", "0.003", "--schedule", "cosine", "--warmup-steps",
                 "1", "--clip", "norm", "--grad-clip", "1", "--max-updates", "2", "--beam", "1", "--no-progress",
                 "--out-dir", str(tmp_path / "run")])
    assert code == 0
    summary = json.loads((tmp_path / "run" / "translation.json").read_text())
    assert summary["task"]["options"]["converted"] == extra["converted"]
    assert (tmp_path / "run" / "vocab" / "spm.src.model").read_bytes() == (
        source["work"] / "vocab" / "spm.src.model").read_bytes()
    assert 0 <= summary["bleu"]["bleu"] <= 100


def test_converted_and_vocab_dir_refuse_what_cannot_be_meant(source, tmp_path) -> None:
    config = _target_config(source, tmp_path, "affine", norm="layernorm")
    with pytest.raises(ValueError, match="without normalisation"):
        TranslationTask(config, work_dir=tmp_path / "a").build_model(config)
    config = _config(tmp_path / "b", extra={"vocab_dir": str(source["work"] / "vocab"),
                                             "converted": str(tmp_path / "missing.pt")})
    with pytest.raises(ValueError, match="no file"):
        TranslationTask(config, work_dir=tmp_path / "b").build_model(config)
    with pytest.raises(ValueError, match=r"holds no spm\.src\.model"):
        TranslationTask(_config(tmp_path / "c", extra={"vocab_dir": str(tmp_path)}), work_dir=tmp_path / "c")
    other = tmp_path / "d"
    TranslationTask(_config(other, extra={"vocab_size": 150, "synthetic_seed": 3}), work_dir=other)  # its own vocab
    with pytest.raises(ValueError, match="another vocabulary"):
        TranslationTask(_config(other, extra={"vocab_dir": str(source["work"] / "vocab")}), work_dir=other)
    config = _config(tmp_path / "e", extra={"converted": source["saved"]["affine"][0],
                                             "vocab_dir": str(source["work"] / "vocab"), "model": {"d_model": 64}})
    with pytest.raises(ValueError, match="does not fit"):  # another architecture than the one converted
        TranslationTask(config, work_dir=tmp_path / "e").build_model(config)


def _benchmark():
    spec = importlib.util.spec_from_file_location("transfer_text_benchmark", ROOT / "benchmarks" / "transfer_text.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_text_transfer_benchmark_smoke_mode(tmp_path, one_thread) -> None:
    bench = _benchmark()
    out = bench.main(["--smoke", "--work-dir", str(tmp_path / "work"), "--json", str(tmp_path / "t.json")])
    saved = json.loads((tmp_path / "t.json").read_text())
    assert saved["command"].startswith("PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/transfer_text.py --smoke")
    assert saved["complete"]
    before = out["before"][0]
    for option in ("affine", "dyt"):
        assert math.isfinite(before[option]["rms_change"]) and before[option]["rms_change"] > 0
        assert (tmp_path / "work" / f"converted_{option}_seed0.pt").is_file()
    assert {r["route"] for r in out["runs"]} == set(bench.ROUTES)
    for r in out["runs"]:
        assert 0 <= r["val_bleu"] <= 100 and 0 <= r["test_bleu"] <= 100
    for b in before.values():
        assert 0 <= b["target_test_bleu"] <= 100
    assert len(saved["table"].splitlines()) == 2 + len(bench.ROUTES)
    diffs = bench.main(["--summarise", str(tmp_path / "t.json")])["paired"]  # each route against LayerNorm, by seed
    runs = {r["route"]: r["test_bleu"] for r in out["runs"]}
    assert set(diffs) == {"affine", "dyt", "scratch"}
    assert diffs["dyt"]["values"] == [runs["dyt"] - runs["layernorm"]]
