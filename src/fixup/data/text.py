"""Parallel text for translation: files, a sentencepiece vocabulary learnt locally, batches by tokens.

A data folder holds ``{train,valid,test}.{src_suffix,tgt_suffix}``, one sentence a line, aligned by
line number (for example ``train.de`` / ``train.en``). The subword vocabulary is learnt with
sentencepiece on the training side only, one per language or one joint model, and saved beside the
run so that decoding and BLEU later use exactly the same segmentation. Batches hold at most
``max_tokens`` (padded) tokens, as fairseq's ``--max-tokens`` does.
"""

from __future__ import annotations

import io
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

__all__ = [
    "BOS",
    "EOS",
    "PAD",
    "UNK",
    "ParallelBatch",
    "ParallelData",
    "Vocabulary",
    "copy_vocabulary",
    "learn_vocabulary",
    "load_parallel_data",
    "read_lines",
    "token_batches",
]

PAD, UNK, BOS, EOS = 0, 1, 2, 3  # fixed special ids of every vocabulary
SPLITS = ("train", "valid", "test")


def read_lines(path: str | Path) -> list[str]:
    """The lines of a UTF-8 text file, without their line ends."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no text file at {path}; a data folder needs "
                                "{train,valid,test}.{src_suffix,tgt_suffix} files, one sentence a line")
    return path.read_text(encoding="utf-8").splitlines()


class Vocabulary:
    """A trained sentencepiece model: ``encode`` text to ids (no specials), ``decode`` ids to text."""

    def __init__(self, model_file: str | Path) -> None:
        import sentencepiece as spm

        self.path = Path(model_file)
        self.sp = spm.SentencePieceProcessor(model_file=str(self.path))
        if (self.sp.pad_id(), self.sp.unk_id(), self.sp.bos_id(), self.sp.eos_id()) != (PAD, UNK, BOS, EOS):
            raise ValueError(f"{self.path} was not trained with pad/unk/bos/eos ids {PAD}/{UNK}/{BOS}/{EOS}; "
                             "learn it with fixup.data.text.learn_vocabulary")

    def __len__(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        return self.sp.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        """Detokenised text; specials (pad, bos, eos) are dropped."""
        return self.sp.decode([int(i) for i in ids if int(i) > EOS])


def learn_vocabulary(texts: Sequence[str], model_prefix: str | Path, vocab_size: int,
                     model_type: str = "bpe") -> Vocabulary:
    """Learn a sentencepiece model on ``texts`` and save it as ``{model_prefix}.model``.

    ``vocab_size`` is an upper bound: a small corpus gets the vocabulary it can fill.
    """
    import sentencepiece as spm

    if model_type not in ("unigram", "bpe", "word", "char"):
        raise ValueError(f"model_type must be unigram, bpe, word or char (sentencepiece), got {model_type!r}")
    if vocab_size < 8:
        raise ValueError(f"vocab_size must be at least 8 (4 specials plus pieces), got {vocab_size}")
    Path(model_prefix).parent.mkdir(parents=True, exist_ok=True)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=model, vocab_size=vocab_size, model_type=model_type,
        pad_id=PAD, unk_id=UNK, bos_id=BOS, eos_id=EOS, character_coverage=1.0, hard_vocab_limit=False,
        num_threads=1, minloglevel=2, input_sentence_size=0, shuffle_input_sentence=False,
    )
    path = Path(f"{model_prefix}.model")
    path.write_bytes(model.getvalue())
    return Vocabulary(path)


def copy_vocabulary(source: str | Path, vocab_dir: str | Path, joint: bool = False) -> None:
    """Copy the sentencepiece models of another run (``spm.src.model`` and ``spm.tgt.model``, or
    ``spm.joint.model``) from ``source`` into ``vocab_dir``, where :func:`load_parallel_data` reuses them.

    A model already in ``vocab_dir`` must be the same file: a run keeps the vocabulary it started with."""
    source, vocab_dir = Path(source), Path(vocab_dir)
    names = ("spm.joint.model",) if joint else ("spm.src.model", "spm.tgt.model")
    for name in names:
        if not (source / name).is_file():
            raise ValueError(f"vocab_dir {source} holds no {name}; name the vocab folder of the run that trained the "
                             f"model ({'joint' if joint else 'separate'} vocabularies, as joint_vocab says)")
        data, target = (source / name).read_bytes(), vocab_dir / name
        if target.is_file() and target.read_bytes() != data:
            raise ValueError(f"{target} differs from {source / name}: this run folder was started with another "
                             "vocabulary; use a new run folder")
        vocab_dir.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


@dataclass
class ParallelData:
    """Encoded sentence pairs of every split, their raw target text (BLEU references) and the vocabularies."""

    src_vocab: Vocabulary
    tgt_vocab: Vocabulary
    pairs: dict[str, list[tuple[list[int], list[int]]]]  # split -> (source ids + EOS, BOS + target ids + EOS)
    sources: dict[str, list[str]]  # raw source sentences per split
    references: dict[str, list[str]]  # raw target sentences per split
    filtered: int = 0  # training pairs dropped by the length filter

    @property
    def joint(self) -> bool:
        return self.src_vocab.path == self.tgt_vocab.path


def load_parallel_data(data_dir: str | Path, vocab_dir: str | Path, *, src_suffix: str = "src",
                       tgt_suffix: str = "tgt", vocab_size: int = 1000, joint_vocab: bool = False,
                       model_type: str = "bpe", max_len: int = 128, max_len_ratio: float = 3.0
                       ) -> ParallelData:
    """Read a data folder, learn (or reuse, if ``vocab_dir`` has them) the vocabularies, encode every split.

    Training pairs longer than ``max_len`` subword tokens on either side, or whose length ratio exceeds
    ``max_len_ratio``, are dropped (``filtered`` counts them); valid and test are kept whole.
    """
    data_dir, vocab_dir = Path(data_dir), Path(vocab_dir)
    text = {(split, side): read_lines(data_dir / f"{split}.{suffix}")
            for split in SPLITS for side, suffix in (("src", src_suffix), ("tgt", tgt_suffix))}
    for split in SPLITS:
        if len(text[split, "src"]) != len(text[split, "tgt"]):
            raise ValueError(f"{data_dir}/{split}.{src_suffix} has {len(text[split, 'src'])} lines but "
                             f"{split}.{tgt_suffix} has {len(text[split, 'tgt'])}; parallel files must align")

    def vocab(name: str, texts: list[str]) -> Vocabulary:
        path = vocab_dir / f"spm.{name}.model"
        if path.is_file():
            return Vocabulary(path)
        return learn_vocabulary(texts, path.with_suffix(""), vocab_size, model_type)

    if joint_vocab:
        src_vocab = tgt_vocab = vocab("joint", text["train", "src"] + text["train", "tgt"])
    else:
        src_vocab, tgt_vocab = vocab("src", text["train", "src"]), vocab("tgt", text["train", "tgt"])
    pairs, sources, refs, filtered = {}, {}, {}, 0
    for split in SPLITS:
        enc = []
        kept_src, kept_ref = [], []
        for s, t in zip(text[split, "src"], text[split, "tgt"]):
            src, tgt = [*src_vocab.encode(s), EOS], [BOS, *tgt_vocab.encode(t), EOS]
            if split == "train" and (max(len(src), len(tgt) - 1) > max_len
                                     or max(len(src), len(tgt)) > max_len_ratio * min(len(src), len(tgt))):
                filtered += 1
                continue
            enc.append((src, tgt))
            kept_src.append(s)
            kept_ref.append(t)
        pairs[split], sources[split], refs[split] = enc, kept_src, kept_ref
    if not pairs["train"]:
        raise ValueError(f"no training pair of {data_dir} is at most max_len={max_len} tokens long; "
                         "raise max_len")
    return ParallelData(src_vocab, tgt_vocab, pairs, sources, refs, filtered)


@dataclass
class ParallelBatch:
    """A padded batch: ``src`` (B, S); ``tgt_in`` (B, T) from BOS; ``tgt_out`` (B, T) up to EOS."""

    src: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    index: list[int]  # positions of these pairs in their split

    def to(self, device: torch.device | str) -> ParallelBatch:
        return ParallelBatch(self.src.to(device), self.tgt_in.to(device), self.tgt_out.to(device), self.index)


def _pad(seqs: Sequence[Sequence[int]]) -> Tensor:
    out = torch.full((len(seqs), max(len(s) for s in seqs)), PAD, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out


def collate(pairs: Sequence[tuple[list[int], list[int]]], index: list[int]) -> ParallelBatch:
    """Pad the pairs at ``index`` into a :class:`ParallelBatch`."""
    chosen = [pairs[i] for i in index]
    return ParallelBatch(_pad([s for s, _ in chosen]), _pad([t[:-1] for _, t in chosen]),
                         _pad([t[1:] for _, t in chosen]), list(index))


def token_batches(pairs: Sequence[tuple[list[int], list[int]]], max_tokens: int, *, shuffle: bool = False,
                  seed: int = 0) -> list[list[int]]:
    """Group pair indices into batches of at most ``max_tokens`` padded tokens on either side.

    Pairs are sorted by length so that padding stays small; with ``shuffle`` the order of pairs of
    equal length and the order of batches follow ``seed`` (pass a new seed each epoch).
    """
    longest = max(max(len(s), len(t)) for s, t in pairs)
    if max_tokens < longest:
        raise ValueError(f"max_tokens={max_tokens} is smaller than the longest sentence ({longest} tokens); "
                         "raise max_tokens or filter long sentences")
    rng = random.Random(seed)
    keys = [(len(t), len(s), rng.random() if shuffle else i) for i, (s, t) in enumerate(pairs)]
    order = sorted(range(len(pairs)), key=keys.__getitem__)
    batches, current, width = [], [], 0
    for i in order:
        w = max(width, len(pairs[i][0]), len(pairs[i][1]))
        if current and w * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, w = [], max(len(pairs[i][0]), len(pairs[i][1]))
        current.append(i)
        width = w
    if current:
        batches.append(current)
    if shuffle:
        rng.shuffle(batches)
    return batches
