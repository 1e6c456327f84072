"""Decoding a trained Transformer: greedy search and beam search with a length penalty.

Both decode incrementally (each step feeds one token and reuses the cached keys and values of earlier
steps). Hypotheses end at EOS or at ``max_len_a * source_length + max_len_b`` tokens, where EOS is
forced, as in fairseq's ``generate``. Padding and BOS are never produced.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..data.text import BOS, EOS, PAD
from ..models.transformer import Transformer, reorder_cache

__all__ = ["beam_search", "greedy_search", "max_output_length"]


def max_output_length(src: Tensor, max_len_a: float, max_len_b: int) -> int:
    """The decoding limit for a padded batch of sources: ``a * longest source + b`` tokens."""
    longest = int(src.ne(PAD).sum(1).max())
    return max(1, int(max_len_a * longest + max_len_b))


def _log_probs(model: Transformer, tokens: Tensor, memory: Tensor, src_mask: Tensor, cache: list, step: int,
               force_eos: bool) -> Tensor:
    logits = model.decode(tokens, memory, src_mask, cache, start=step)[:, -1].float()
    logp = torch.log_softmax(logits, dim=-1)
    logp[:, PAD] = -torch.inf
    logp[:, BOS] = -torch.inf
    if force_eos:
        eos = logp[:, EOS].clone()
        logp.fill_(-torch.inf)
        logp[:, EOS] = eos
    return logp


@torch.no_grad()
def greedy_search(model: Transformer, src: Tensor, max_len_a: float = 1.5,
                  max_len_b: int = 10) -> list[list[int]]:
    """The most probable next token at every step; token ids without BOS and EOS, one list per source."""
    model.eval()
    memory, src_mask = model.encode(src)
    B, limit = src.shape[0], max_output_length(src, max_len_a, max_len_b)
    cache, tokens = model.new_cache(), torch.full((B, 1), BOS, dtype=torch.long, device=src.device)
    done = torch.zeros(B, dtype=torch.bool, device=src.device)
    out: list[list[int]] = [[] for _ in range(B)]
    for step in range(limit):
        nxt = _log_probs(model, tokens, memory, src_mask, cache, step, step == limit - 1).argmax(-1)
        for b in (~done).nonzero().flatten().tolist():
            if int(nxt[b]) != EOS:
                out[b].append(int(nxt[b]))
        done |= nxt.eq(EOS)
        if bool(done.all()):
            break
        tokens = nxt[:, None]
    return out


@torch.no_grad()
def beam_search(model: Transformer, src: Tensor, beam: int = 4, length_penalty: float = 1.0,
                max_len_a: float = 1.5, max_len_b: int = 10) -> list[list[int]]:
    """Beam search; the best finished hypothesis by ``sum log p / length ** length_penalty``.

    Length counts the output tokens including EOS (fairseq's convention). At each step the 2 * beam
    best extensions are considered: those ending in EOS (among the top ``beam``) are set aside as
    finished, the best others continue. A source is done when it has ``beam`` finished hypotheses.
    ``beam=1`` is greedy search.
    """
    if beam < 1:
        raise ValueError(f"beam must be at least 1, got {beam}")
    model.eval()
    memory, src_mask = model.encode(src)
    B, K, device = src.shape[0], beam, src.device
    limit = max_output_length(src, max_len_a, max_len_b)
    memory, src_mask = memory.repeat_interleave(K, 0), src_mask.repeat_interleave(K, 0)  # (B*K, S, d)
    scores = torch.full((B, K), -torch.inf, device=device)
    scores[:, 0] = 0.0  # all beams start identical: keep one
    hyps: list[list[list[int]]] = [[[] for _ in range(K)] for _ in range(B)]
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(B)]
    cache = model.new_cache()
    tokens = torch.full((B * K, 1), BOS, dtype=torch.long, device=device)
    for step in range(limit):
        logp = _log_probs(model, tokens, memory, src_mask, cache, step, step == limit - 1)
        V = logp.shape[-1]
        cand = (scores[:, :, None] + logp.view(B, K, V)).view(B, K * V)
        top_scores, top_index = cand.topk(min(2 * K, K * V), dim=1)
        top_scores, top_index = top_scores.tolist(), top_index.tolist()
        order, next_tokens = [], []
        new_scores = torch.full((B, K), -torch.inf, device=device)
        new_hyps: list[list[list[int]]] = []
        for b in range(B):
            kept: list[list[int]] = []
            rows: list[int] = []
            if len(finished[b]) < K:
                for rank, (score, index) in enumerate(zip(top_scores[b], top_index[b])):
                    if score == -torch.inf:
                        break
                    parent, token = divmod(index, V)
                    if token == EOS:
                        if rank < K:
                            length = len(hyps[b][parent]) + 1
                            finished[b].append((score / length ** length_penalty, hyps[b][parent]))
                    elif len(kept) < K:
                        new_scores[b, len(kept)] = score
                        rows.append(b * K + parent)
                        kept.append([*hyps[b][parent], token])
                    if len(kept) == K or len(finished[b]) >= K:
                        break
            if len(finished[b]) >= K:  # done: its rows keep running as placeholders with score -inf
                kept, rows = [], []
                new_scores[b] = -torch.inf
            next_tokens.extend(h[-1] for h in kept)
            next_tokens.extend([EOS] * (K - len(kept)))
            order.extend(rows + [b * K] * (K - len(kept)))
            new_hyps.append(kept + [[] for _ in range(K - len(kept))])
        if all(len(f) >= K for f in finished):
            break
        scores, hyps = new_scores, new_hyps
        index = torch.tensor(order, device=device)
        reorder_cache(cache, index)
        tokens = torch.tensor(next_tokens, device=device)[:, None]
    return [max(f, key=lambda sh: sh[0])[1] if f else [] for f in finished]
