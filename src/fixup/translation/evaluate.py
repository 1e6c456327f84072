"""Translating a split and scoring it: detokenised hypotheses against raw references with sacrebleu.

BLEU is computed by sacrebleu's ``corpus_bleu`` with its default 13a tokenisation on detokenised text
(the sentencepiece model turns ids back into plain sentences), so figures are comparable to any other
sacrebleu score on the same references. Higher is better.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from ..data.text import ParallelData, Vocabulary, collate, token_batches
from ..models.transformer import Transformer
from .decode import beam_search, greedy_search

__all__ = ["BleuResult", "DecodeConfig", "corpus_bleu", "translate_pairs"]


@dataclass
class DecodeConfig:
    """How hypotheses are produced."""

    beam: int = 4  # 1 is greedy search
    length_penalty: float = 1.0  # score / length ** length_penalty (fairseq's --lenpen)
    max_len_a: float = 1.5  # output limit a * source length + b tokens
    max_len_b: int = 10
    max_tokens: int = 4096  # source tokens per decoding batch


@dataclass
class BleuResult:
    """A sacrebleu corpus score with its signature, for reports."""

    bleu: float
    signature: str
    precisions: list[float]
    brevity_penalty: float
    sentences: int

    def to_dict(self) -> dict:
        return asdict(self)


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> BleuResult:
    """sacrebleu's corpus BLEU of detokenised ``hypotheses`` against one reference each."""
    import sacrebleu

    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references; give one each")
    metric = sacrebleu.BLEU()
    score = metric.corpus_score(list(hypotheses), [list(references)])
    return BleuResult(float(score.score), str(metric.get_signature()), [float(p) for p in score.precisions],
                      float(score.bp), len(hypotheses))


@torch.no_grad()
def translate_pairs(model: Transformer, pairs: Sequence[tuple[list[int], list[int]]], tgt_vocab: Vocabulary,
                    cfg: DecodeConfig | None = None, device: torch.device | str = "cpu") -> list[str]:
    """Detokenised translations of the sources of ``pairs``, in their order."""
    cfg = cfg or DecodeConfig()
    was_training = model.training
    model.eval()
    out: list[str] = [""] * len(pairs)
    try:
        for index in token_batches(pairs, max(cfg.max_tokens, max(len(s) for s, _ in pairs))):
            src = collate(pairs, index).src.to(device)
            if cfg.beam == 1:
                ids = greedy_search(model, src, cfg.max_len_a, cfg.max_len_b)
            else:
                ids = beam_search(model, src, cfg.beam, cfg.length_penalty, cfg.max_len_a, cfg.max_len_b)
            for i, seq in zip(index, ids):
                out[i] = tgt_vocab.decode(seq)
    finally:
        model.train(was_training)
    return out


def evaluate_bleu(model: Transformer, data: ParallelData, split: str = "test",
                  cfg: DecodeConfig | None = None, device: torch.device | str = "cpu",
                  limit: int | None = None) -> tuple[BleuResult, list[str]]:
    """Translate ``split`` (its first ``limit`` pairs, if given) and score it; returns (score, hypotheses)."""
    pairs, refs = data.pairs[split], data.references[split]
    if limit is not None:
        pairs, refs = pairs[:limit], refs[:limit]
    hyps = translate_pairs(model, pairs, data.tgt_vocab, cfg, device)
    return corpus_bleu(hyps, refs), hyps
