"""Parallel text and the generated translation task: reproducibility, vocabularies, batching, filtering."""

from __future__ import annotations

import pytest

from fixup.data.synthetic_translation import (
    SyntheticTranslationConfig,
    make_lexicon,
    word_for_word,
    write_synthetic_task,
)
from fixup.data.text import BOS, EOS, PAD, load_parallel_data, token_batches
from fixup.translation import corpus_bleu

SMALL = SyntheticTranslationConfig(seed=7, train=1500, valid=60, test=60)


def _files(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_generated_task_is_reproducible_from_its_seed(tmp_path):
    a, b = write_synthetic_task(tmp_path / "a", SMALL), write_synthetic_task(tmp_path / "b", SMALL)
    assert _files(a) == _files(b)
    other_cfg = SyntheticTranslationConfig(seed=8, train=1500, valid=60, test=60)
    other = write_synthetic_task(tmp_path / "c", other_cfg)
    assert _files(other)["train.src"] != _files(a)["train.src"]
    for split, n in (("train", 1500), ("valid", 60), ("test", 60)):
        assert len((a / f"{split}.src").read_text().splitlines()) == n
        assert len((a / f"{split}.tgt").read_text().splitlines()) == n


def test_generated_task_is_not_a_copy_task(tmp_path):
    folder = write_synthetic_task(tmp_path, SMALL)
    src = (folder / "test.src").read_text().splitlines()
    tgt = (folder / "test.tgt").read_text().splitlines()
    assert corpus_bleu(src, tgt).bleu < 2.0  # copying the source scores about zero
    train_src = set((folder / "train.src").read_text().splitlines())
    assert not train_src & set(src)  # test sentences are unseen
    lex = make_lexicon(SMALL)
    assert not lex.src_vocabulary() & lex.tgt_vocabulary()
    assert 200 <= len(lex.src_vocabulary()) <= 400  # "a few hundred words"
    # A dictionary that knows every word but not order or agreement stays far from the reference.
    gloss = [word_for_word(s, lex) for s in src]
    assert 1.0 < corpus_bleu(gloss, tgt).bleu < 25.0


def test_agreement_and_verb_second():
    """A present-tense main clause with a pronoun subject puts the person-marked verb second."""
    import random

    from fixup.data.synthetic_translation import _VERB_ENDINGS, generate_pairs

    cfg = SyntheticTranslationConfig(seed=1, p_second_clause=0.0, p_pronoun=1.0, p_pp=0.0, p_adverb=0.0)
    lex = make_lexicon(cfg)
    checked = 0
    for src, tgt in generate_pairs(cfg, lex, 200, random.Random(0)):
        s, t = src.removesuffix(".").split(), tgt.removesuffix(".").split()
        if s[-1] in lex.src["tense"]:
            continue
        person = lex.src["pronoun"].index(s[0])
        verb = lex.src["verb"].index(s[-1])  # source: verb-final
        assert t[1] == lex.tgt["verb"][verb] + _VERB_ENDINGS[person]  # target: verb-second, agreeing
        checked += 1
    assert checked > 50


def test_quick_task_is_unchanged_by_the_hard_tasks_options(tmp_path):
    """The hard task's options are off in the quick task, which draws exactly what it drew before they
    existed (the committed translation results were trained on it): no relative pronoun, the same words."""
    from fixup.data.synthetic_translation import synthetic_task

    assert synthetic_task("quick", seed=7, train=1500, valid=60, test=60) == SMALL
    lex = make_lexicon(SMALL)
    assert "rel" not in lex.src
    folder = write_synthetic_task(tmp_path, SMALL)
    import hashlib

    digest = hashlib.sha256(b"".join((folder / f"{s}.{side}").read_bytes() for s in ("train", "valid", "test")
                                     for side in ("src", "tgt"))).hexdigest()
    assert digest[:16] == "d6f5ccc7f9aa69f2"  # written by the code before the hard task existed


def test_hard_task_moves_relative_clauses_and_agrees_across_them():
    """Hard task: a source relative clause (NP_obj VERB REL) precedes its head; in the target it follows
    the head, opened by the pronoun of the head's gender/number and closed by a verb of the head's number."""
    import random

    from fixup.data.synthetic_translation import _PLURAL, _VERB_ENDINGS, generate_pairs, synthetic_task

    cfg = synthetic_task("hard", seed=3, p_relative=1.0, relative_depth=1, p_pronoun=0.0, p_second_clause=0.0,
                         p_pp=0.0, p_adverb=0.0)
    lex = make_lexicon(cfg)
    rel_s, rel_t = lex.src["rel"][0], lex.tgt["rel"]
    checked = 0
    for src, tgt in generate_pairs(cfg, lex, 100, random.Random(0)):
        s, t = src.removesuffix(".").split(), tgt.removesuffix(".").split()
        assert s.count(rel_s) == 2  # the subject and the object each carry one (depth 1: none nested)
        head = s.index(rel_s) + 1  # the subject's noun phrase follows its relative clause's marker
        noun_s = next(w for w in s[head:] if w in lex.src["noun"] or w.removesuffix("ri") in lex.src["noun"])
        plural = noun_s not in lex.src["noun"]
        noun = lex.src["noun"].index(noun_s.removesuffix("ri") if plural else noun_s)
        gender = lex.gender[noun]
        noun_t = lex.tgt["noun"][noun] + (_PLURAL[gender] if plural else "")
        pronoun = next(w for w in t if w in rel_t)  # the first target pronoun is the subject's
        assert rel_t.index(pronoun) == ("m", "f", "n", "pl").index("pl" if plural else gender)
        verb_s = s[head - 2]  # NP_obj VERB REL: the relative clause's verb precedes the marker
        verb_t = lex.tgt["verb"][lex.src["verb"].index(verb_s)] + _VERB_ENDINGS[5 if plural else 2]
        assert t.index(noun_t) < t.index(pronoun) < t.index(verb_t)  # moved after the head, verb-final
        checked += 1
    assert checked == 100


def test_hard_task_has_rare_words_and_longer_sentences(tmp_path):
    from collections import Counter

    from fixup.data.synthetic_translation import synthetic_task

    quick = write_synthetic_task(tmp_path / "q", SMALL)
    hard = write_synthetic_task(tmp_path / "h", synthetic_task("hard", seed=7, train=1500, valid=60, test=60))
    words = {name: (f / "train.src").read_text().split() for name, f in (("quick", quick), ("hard", hard))}
    lines = {name: len((f / "train.src").read_text().splitlines()) for name, f in (("quick", quick), ("hard", hard))}
    assert len(words["hard"]) / lines["hard"] > 1.4 * len(words["quick"]) / lines["quick"]
    counts = Counter(words["hard"])
    singletons = sum(1 for c in counts.values() if c == 1)
    assert singletons > 3 * sum(1 for c in Counter(words["quick"]).values() if c == 1)
    lex = make_lexicon(synthetic_task("hard", seed=7))
    src = (hard / "test.src").read_text().splitlines()
    gloss = [word_for_word(s, lex) for s in src]  # every word known, the relative marker included
    assert all(w not in lex.src_vocabulary() for g in gloss for w in g.removesuffix(".").split())
    with pytest.raises(ValueError, match="unknown generated task 'huge'"):
        synthetic_task("huge")
    with pytest.raises(ValueError, match="p_relative is a probability"):
        SyntheticTranslationConfig(p_relative=1.5)


def test_a_shifted_task_changes_the_target_order_only(tmp_path):
    """The shifted task (transfer) has the same source sentences and the same target words, in another order: main
    clauses verb-final and adjectives before the noun; the default task is unchanged by the option's existence."""
    import dataclasses

    shifted = dataclasses.replace(SMALL, main_order="verb-final", adjective_order="before")
    a, b = write_synthetic_task(tmp_path / "a", SMALL), write_synthetic_task(tmp_path / "b", shifted)
    assert (a / "train.src").read_bytes() == (b / "train.src").read_bytes()
    lex = make_lexicon(SMALL)
    adjectives = {w + e for w in lex.tgt["adj"] for e in ("er", "a", "es", "en")}
    pairs = list(zip(*((f / "train.tgt").read_text().splitlines() for f in (a, b)),
                     (a / "train.src").read_text().splitlines()))
    moved = 0
    for ta, tb, src in pairs:
        wa, wb = ta.removesuffix(".").split(), tb.removesuffix(".").split()
        assert sorted(wa) == sorted(wb)  # the same words, agreement included
        moved += wa != wb
        last = src.removesuffix(".").split()[-1]
        if last in lex.src["verb"] and not set(src.split()) & set(lex.src["coord"] + lex.src["subord"]):
            verb = lex.tgt["verb"][lex.src["verb"].index(last)]
            assert wb[-1].startswith(verb) and not wb[-1].startswith("ge")  # the finite verb last
        for i, w in enumerate(wb[1:], 1):  # an adjective follows the determiner or an adjective, never a noun
            if w in adjectives:
                assert wb[i - 1] in lex.tgt["det"] or wb[i - 1] in adjectives
    assert moved > 0.8 * len(pairs)
    with pytest.raises(ValueError, match="main_order must be one of verb-second, verb-final"):
        SyntheticTranslationConfig(main_order="verb-first")


def test_text_pipeline_roundtrip_and_vocabulary_reuse(tmp_path):
    data_dir = write_synthetic_task(tmp_path / "data", SMALL)
    data = load_parallel_data(data_dir, tmp_path / "run", vocab_size=300)
    assert (tmp_path / "run" / "spm.src.model").is_file() and (tmp_path / "run" / "spm.tgt.model").is_file()
    assert len(data.pairs["train"]) == 1500 and data.filtered == 0
    src, tgt = data.pairs["valid"][0]
    assert src[-1] == EOS and tgt[0] == BOS and tgt[-1] == EOS and PAD not in src
    assert data.tgt_vocab.decode(tgt) == data.references["valid"][0]
    assert data.src_vocab.decode(src) == data.sources["valid"][0]
    again = load_parallel_data(data_dir, tmp_path / "run", vocab_size=999)  # reuses the saved models
    assert again.pairs["train"] == data.pairs["train"]
    joint = load_parallel_data(data_dir, tmp_path / "joint", vocab_size=400, joint_vocab=True)
    assert joint.joint and (tmp_path / "joint" / "spm.joint.model").is_file()


def test_length_filter_and_alignment_errors(tmp_path):
    data_dir = write_synthetic_task(tmp_path / "data", SMALL)
    data = load_parallel_data(data_dir, tmp_path / "run", vocab_size=300, max_len=12)
    assert data.filtered > 0 and len(data.pairs["train"]) == 1500 - data.filtered
    assert all(len(s) <= 12 and len(t) - 1 <= 12 for s, t in data.pairs["train"])
    assert len(data.pairs["test"]) == 60  # evaluation splits are never filtered
    lines = (data_dir / "valid.tgt").read_text().splitlines()
    (data_dir / "valid.tgt").write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(ValueError, match="must align"):
        load_parallel_data(data_dir, tmp_path / "run")
    with pytest.raises(FileNotFoundError, match="no text file"):
        load_parallel_data(tmp_path / "nowhere", tmp_path / "run")


def test_token_batches_cover_every_pair_once_within_budget():
    pairs = [([5] * (1 + i % 17), [5] * (2 + (i * 7) % 13)) for i in range(500)]
    for shuffle in (False, True):
        batches = token_batches(pairs, 64, shuffle=shuffle, seed=3)
        assert sorted(i for b in batches for i in b) == list(range(500))
        for b in batches:
            assert len(b) * max(max(len(pairs[i][0]), len(pairs[i][1])) for i in b) <= 64
    assert token_batches(pairs, 64, shuffle=True, seed=3) == token_batches(pairs, 64, shuffle=True, seed=3)
    assert token_batches(pairs, 64, shuffle=True, seed=3) != token_batches(pairs, 64, shuffle=True, seed=4)
    with pytest.raises(ValueError, match="max_tokens"):
        token_batches(pairs, 8)
