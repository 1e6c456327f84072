"""Slow: a small Fixup Transformer and a small LayerNorm Transformer both learn the generated task.

Same recipe for both (the engine's Adam (0.9, 0.98), inverse square-root schedule, label smoothing
0.1), 600 updates of at most 2048 tokens, beam 4 on the 1000 test sentences. Copying the source scores
about 0 BLEU and a word-for-word dictionary about 4; both models must reach 50.
Run with ``python -m pytest -m slow tests/test_translation_slow.py -s`` (torch uses every core).
"""

from __future__ import annotations

import pytest

from fixup.translation.evaluate import DecodeConfig
from fixup.translation.run import train_and_evaluate
from fixup.translation.task import translation_config

# The "tiny" recipe (transformer_tiny, 600 updates of 2048 tokens, Adam (0.9, 0.98), rate 3e-3 after 100
# warm-up steps, dropout 0.1), as `fixup translate` runs it; greedy valid BLEU on 200 sentences per epoch.
RECIPE = {"device": "cpu", "extra": {"bleu_limit": 200}}
BLEU_FLOOR = 50.0


@pytest.mark.slow
@pytest.mark.parametrize("norm", ["fixup", "layernorm"])
def test_small_transformer_learns_the_generated_task(norm, tmp_path):
    config = translation_config("tiny", norm=norm, **RECIPE)
    summary = train_and_evaluate(config, tmp_path / norm, DecodeConfig(beam=4), progress=False)
    bleu = summary["bleu"]["bleu"]
    print(f"\n{norm}: test BLEU {bleu:.2f} after {summary['updates']} updates "
          f"(copy {summary['copy_bleu']:.2f}, word-for-word {summary['word_for_word_bleu']:.2f}; "
          f"valid BLEU by epoch {[round(h.get('valid_bleu', -1), 1) for h in summary['history']]})")
    assert summary["outcome"]["status"] == "completed"
    assert summary["copy_bleu"] < 1.0 and summary["word_for_word_bleu"] < 10.0
    assert bleu > BLEU_FLOOR
