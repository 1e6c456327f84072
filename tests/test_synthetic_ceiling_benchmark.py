"""benchmarks/synthetic_ceiling.py: the cap that words never seen in training put on a generated task's BLEU."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("synthetic_ceiling", ROOT / "benchmarks" / "synthetic_ceiling.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fewer_training_pairs_leave_more_test_words_unseen_and_a_lower_cap():
    ceiling = _bench().ceiling
    few = ceiling("hard", train=30, valid=20, test=40)
    more = ceiling("hard", train=3000, valid=20, test=40)
    assert few["unseen_target_words"] > more["unseen_target_words"] >= 0
    assert few["ceiling_bleu"] < more["ceiling_bleu"] <= 100
    assert few["changes"] == {"train": 30, "valid": 20, "test": 40}


def test_the_oracle_keeps_every_seen_word_and_only_those():
    from fixup.data.synthetic_translation import seen_word_oracle

    hyps, unseen = seen_word_oracle(["la vo.", "zi"], ["la zi vo.", "la ku."], unseen="?")
    assert hyps == ["la zi vo.", "la ?"]  # the period does not make a seen word unseen
    assert unseen == 1 / 5
    assert seen_word_oracle(["la"], ["la la."])[1] == 0.0
