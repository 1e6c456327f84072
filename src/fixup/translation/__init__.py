"""Translation: decoding (greedy, beam search with a length penalty), BLEU, checkpoint averaging."""

from .averaging import average_checkpoints, average_state_dicts
from .decode import beam_search, greedy_search
from .evaluate import BleuResult, DecodeConfig, corpus_bleu, evaluate_bleu, translate_pairs

__all__ = [
    "BleuResult",
    "DecodeConfig",
    "average_checkpoints",
    "average_state_dicts",
    "beam_search",
    "corpus_bleu",
    "evaluate_bleu",
    "greedy_search",
    "translate_pairs",
]
