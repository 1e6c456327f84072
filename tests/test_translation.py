"""Decoding and scoring: beam 1 is greedy, a wide beam is exact search, BLEU, checkpoint averaging."""

from __future__ import annotations

import itertools

import pytest
import torch

import fixup
from fixup.data.text import BOS, EOS
from fixup.translation import (
    average_checkpoints,
    average_state_dicts,
    beam_search,
    corpus_bleu,
    greedy_search,
)


def random_model(vocab: int, seed: int = 0, norm: str = "fixup"):
    model = fixup.create_model("transformer_tiny", norm=norm, d_model=32, ffn_dim=64, heads=4,
                               src_vocab=vocab, tgt_vocab=vocab, dropout=0.0, encoder_layers=1,
                               decoder_layers=2)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return model.eval()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_one_equals_greedy(seed):
    model = random_model(40, seed)
    src = torch.randint(4, 40, (6, 7), generator=torch.Generator().manual_seed(seed))
    src[2, 4:] = 0
    greedy = greedy_search(model, src, max_len_a=1.0, max_len_b=5)
    assert greedy == beam_search(model, src, beam=1, max_len_a=1.0, max_len_b=5)
    assert any(len(h) > 0 for h in greedy)


@pytest.mark.parametrize("beam", [2, 3, 5])
def test_beam_search_does_not_depend_on_the_batch(beam):
    """Each source decodes the same alone or among others (padded, finishing at different steps)."""
    model = random_model(8, seed=5)  # few tokens: EOS is often likely, hypotheses end at different steps
    g = torch.Generator().manual_seed(beam)
    src = torch.randint(4, 8, (7, 6), generator=g)
    src[1, 2:] = 0
    src[4, 4:] = 0
    batched = beam_search(model, src, beam=beam, max_len_a=0.0, max_len_b=8)
    alone = [beam_search(model, src[i:i + 1, : int(src[i].ne(0).sum())], beam=beam, max_len_a=0.0,
                         max_len_b=8)[0] for i in range(7)]
    assert batched == alone
    assert len({len(h) for h in batched}) > 1  # hypotheses finished at different steps


@pytest.mark.parametrize("length_penalty", [0.0, 1.0, 2.0])
def test_wide_beam_is_exact_search(length_penalty):
    """With a beam wider than the number of live hypotheses, beam search finds the best sequence."""
    vocab, limit = 6, 3  # tokens UNK, EOS and two pieces; outputs of at most 3 tokens (EOS forced last)
    model = random_model(vocab, seed=4)
    src = torch.tensor([[4, 5, 4, 5]])
    found = beam_search(model, src, beam=27, length_penalty=length_penalty, max_len_a=0.0, max_len_b=limit)[0]

    def score(seq):
        tgt = torch.tensor([[BOS, *seq]])
        logp = torch.log_softmax(model(src, tgt), -1)[0]
        total = sum(logp[i, t].item() for i, t in enumerate([*seq, EOS]))
        return total / (len(seq) + 1) ** length_penalty

    choices = [1, 4, 5]
    candidates = [list(c) for n in range(limit) for c in itertools.product(choices, repeat=n)]
    best = max(candidates, key=score)
    assert found == best
    assert score(found) == pytest.approx(score(best))


def test_corpus_bleu():
    refs = ["the cat sat on the mat .", "a dog ran ."]
    assert corpus_bleu(refs, refs).bleu == pytest.approx(100.0)
    assert corpus_bleu(["x y z", "q r"], refs).bleu < 1.0
    partial = corpus_bleu(["the cat sat on a mat .", "a dog ran ."], refs)
    assert 20 < partial.bleu < 100 and "tok:13a" in partial.signature
    with pytest.raises(ValueError, match="one each"):
        corpus_bleu(refs[:1], refs)


def test_checkpoint_averaging(tmp_path):
    a, b = random_model(10, 0), random_model(10, 1)
    avg = average_state_dicts([a.state_dict(), b.state_dict()])
    for key, value in avg.items():
        torch.testing.assert_close(value, (a.state_dict()[key] + b.state_dict()[key]) / 2)
    c = random_model(10, 2)
    c.load_state_dict(avg)
    torch.save({"model": a.state_dict(), "step": 1}, tmp_path / "a.pt")
    torch.save({"model": b.state_dict(), "step": 2}, tmp_path / "b.pt")
    from_files = average_checkpoints([tmp_path / "a.pt", tmp_path / "b.pt"])
    assert all(torch.equal(from_files[k], avg[k]) for k in avg)
    with pytest.raises(ValueError, match="same entries"):
        average_state_dicts([a.state_dict(), {"x": torch.zeros(1)}])
