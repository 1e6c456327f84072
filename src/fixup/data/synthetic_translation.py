"""A generated translation task, made deterministically from a seed, written as plain parallel text.

No translation corpus can be downloaded on this machine, so the embedded default is a pair of
invented languages. It is written to ``{train,valid,test}.{src,tgt}`` files and then read back by
:mod:`fixup.data.text` exactly as real data would be.

Source language (verb-final, no agreement)::

    clause := NP_subj NP_obj [PP] [ADV] VERB [TENSE]         # TENSE: a past or future particle
    NP     := DET ADJ{0,2} NOUN | PRONOUN                     # plural: the noun takes a suffix
    sentence := clause [CONJ clause] "."                    # written "word word." (detokenised)

Target language (its own vocabulary; verb-second in main clauses, verb-final after a subordinating
conjunction; adjectives after the noun; gender and number agreement)::

    main present:  NP_subj VERB-agr [ADV] NP_obj [PP]
    main past/fut: NP_subj AUX-agr [ADV] NP_obj [PP] PARTICIPLE
    subordinate:   CONJ NP_subj [ADV] NP_obj [PP] VERB-agr | ... PARTICIPLE AUX-agr
    NP := DET-agr NOUN-num ADJ-agr{0,2}

Each target noun has a gender drawn from the seed, which the determiner and the adjectives must match;
the verb and auxiliary agree with the subject's person and number, which the source verb never
shows. A copy of the source scores about zero BLEU, since the two vocabularies are disjoint.

Two tasks are defined (:data:`SYNTHETIC_TASKS`): ``"quick"`` (the default above) and ``"hard"``, which adds
what makes translation hard for a small model, so that systems sit well below the ceiling:

* relative clauses, nested up to ``relative_depth`` deep: head-final in the source (``NP_obj VERB REL``
  before the noun phrase they describe), after the noun in the target, opened by a relative pronoun that
  agrees with the head noun's gender and number and closed by a verb that agrees with the head's number,
  so a span of many words moves across the noun phrase and the agreement reaches across it;
* a vocabulary ten times larger, its content words drawn with Zipf's law (``zipf``), so that many test
  sentences hold words seen a handful of times in training, or never;
* longer sentences (more second clauses).

A shifted task (for transfer: benchmarks/transfer_text.py) keeps the seed, and so both vocabularies and the
source sentences, and changes the target's word order: ``main_order="verb-final"`` puts the finite verb of main
clauses last, as in subordinate ones (``NP_subj [ADV] NP_obj [PP] VERB-agr``, ``... PARTICIPLE AUX-agr``), and
``adjective_order="before"`` puts the adjectives between the determiner and the noun (``DET-agr ADJ-agr{0,2}
NOUN-num``). Agreement is unchanged.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "SYNTHETIC_TASKS",
    "Lexicon",
    "SyntheticTranslationConfig",
    "generate_pairs",
    "make_lexicon",
    "seen_word_oracle",
    "synthetic_task",
    "word_for_word",
    "write_synthetic_task",
]

_SRC_LETTERS = ("bdgkmnprst", "aeiou")  # source words: consonant-vowel syllables
_TGT_LETTERS = ("fhjlvwzc", "aeiouy", "lnrsx")  # target words: consonant-vowel-(coda) syllables
_GENDERS = ("m", "f", "n")
# Target inflection (person index 0-5: 1sg 2sg 3sg 1pl 2pl 3pl).
_VERB_ENDINGS = ("o", "as", "at", "om", "et", "on")
_ADJ_ENDINGS = {"m": "er", "f": "a", "n": "es", "pl": "en"}
_PLURAL = {"m": "e", "f": "n", "n": "ir"}
MAIN_ORDERS = ("verb-second", "verb-final")  # the finite verb of a target main clause: second, or last
ADJECTIVE_ORDERS = ("after", "before")  # target adjectives after the noun, or before it


@dataclass
class SyntheticTranslationConfig:
    """Size of the generated task and of its languages."""

    seed: int = 0  # everything (vocabularies, genders, sentences) follows from it
    train: int = 30000  # sentence pairs
    valid: int = 1000
    test: int = 1000
    nouns: int = 120
    verbs: int = 60
    adjectives: int = 50
    adverbs: int = 24
    prepositions: int = 10
    p_second_clause: float = 0.35  # chance of "clause CONJ clause"
    p_pronoun: float = 0.25  # chance that a subject is a pronoun
    p_pp: float = 0.4  # chance of a prepositional phrase
    p_adverb: float = 0.4
    p_relative: float = 0.0  # chance that a noun phrase (not a pronoun) carries a relative clause
    relative_depth: int = 1  # relative clauses inside relative clauses, at most this deep
    zipf: float = 0.0  # content words drawn with probability ~ 1 / rank^zipf (0: uniformly)
    main_order: str = "verb-second"  # target main clauses: "verb-second", or "verb-final" (a shifted task)
    adjective_order: str = "after"  # target adjectives "after" the noun, or "before" it (a shifted task)

    def __post_init__(self) -> None:
        for name, valid in (("main_order", MAIN_ORDERS), ("adjective_order", ADJECTIVE_ORDERS)):
            if getattr(self, name) not in valid:
                raise ValueError(f"{name} must be one of {', '.join(valid)}, got {getattr(self, name)!r}")
        for name in ("train", "valid", "test", "nouns", "verbs", "adjectives", "adverbs", "prepositions",
                     "relative_depth"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)!r}")
        for name in ("p_second_clause", "p_pronoun", "p_pp", "p_adverb", "p_relative"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} is a probability, got {getattr(self, name)!r}")
        if self.zipf < 0:
            raise ValueError(f"zipf must be >= 0 (0: uniform word choice), got {self.zipf!r}")


# The named tasks: "quick" is the default above; "hard" leaves a small Transformer headroom below the
# ceiling (docs/translation.md, "The hard task"), at the same number of training pairs.
SYNTHETIC_TASKS: dict[str, dict[str, float | int]] = {
    "quick": {},
    "hard": {"nouns": 1200, "verbs": 600, "adjectives": 500, "adverbs": 120, "prepositions": 16,
             "p_second_clause": 0.5, "p_relative": 0.3, "relative_depth": 2, "zipf": 1.0},
}


def synthetic_task(name: str = "quick", **changes: Any) -> SyntheticTranslationConfig:
    """The config of the named generated task (:data:`SYNTHETIC_TASKS`), with ``changes`` (seed, sizes, word
    order, ...) over it."""
    if name not in SYNTHETIC_TASKS:
        raise ValueError(f"unknown generated task {name!r}; choose one of {', '.join(SYNTHETIC_TASKS)}")
    return SyntheticTranslationConfig(**{**SYNTHETIC_TASKS[name], **changes})


@dataclass
class Lexicon:
    """Word lists of both languages, index-aligned (source word i translates as target word i)."""

    src: dict[str, list[str]] = field(default_factory=dict)
    tgt: dict[str, list[str]] = field(default_factory=dict)
    gender: list[str] = field(default_factory=list)  # target gender of each noun

    def src_vocabulary(self) -> set[str]:
        return {w for words in self.src.values() for w in words}

    def tgt_vocabulary(self) -> set[str]:
        return {w for words in self.tgt.values() for w in words}


class _Words:
    """Draws unique words from syllables; ``forms`` guards against collisions of inflected forms."""

    def __init__(self, rng: random.Random, letters: tuple[str, ...], taken: set[str]) -> None:
        self.rng, self.letters, self.taken = rng, letters, taken

    def syllable(self) -> str:
        s = "".join(self.rng.choice(part) for part in self.letters[:2])
        if len(self.letters) > 2 and self.rng.random() < 0.3:
            s += self.rng.choice(self.letters[2])
        return s

    def draw(self, syllables: tuple[int, int], suffixes: tuple[str, ...] = ("",), prefix: str = "") -> str:
        for _ in range(10000):
            stem = "".join(self.syllable() for _ in range(self.rng.randint(*syllables)))
            forms = {stem + s for s in suffixes} | ({prefix + stem} if prefix else set())
            if not forms & self.taken and len(forms) == len(suffixes) + bool(prefix):
                self.taken |= forms
                return stem
        raise ValueError(f"could not draw a new word of {syllables} syllables; lower the vocabulary sizes")


def make_lexicon(cfg: SyntheticTranslationConfig) -> Lexicon:
    """Both vocabularies, drawn from ``cfg.seed``; every surface form of either language is unique."""
    rng = random.Random(f"lexicon-{cfg.seed}")
    taken: set[str] = set()
    src, tgt = _Words(rng, _SRC_LETTERS, taken), _Words(rng, _TGT_LETTERS, taken)
    lex = Lexicon()
    function = {"det": 2, "pronoun": 6, "tense": 2, "coord": 2, "subord": 2, "prep": cfg.prepositions}
    for kind, n in function.items():
        lex.src[kind] = [src.draw((1, 1)) for _ in range(n)]
    lex.src["noun"] = [src.draw((2, 3), ("", "ri")) for _ in range(cfg.nouns)]
    for kind, n in (("verb", cfg.verbs), ("adj", cfg.adjectives), ("adv", cfg.adverbs)):
        lex.src[kind] = [src.draw((2, 3)) for _ in range(n)]
    # Target: determiners by (definiteness, gender or plural), auxiliaries by (tense, person).
    lex.tgt["det"] = [tgt.draw((1, 1)) for _ in range(8)]  # def m f n pl, indef m f n pl
    lex.tgt["aux"] = [tgt.draw((1, 2)) for _ in range(12)]  # past 1sg..3pl, future 1sg..3pl
    for kind in ("pronoun", "coord", "subord", "prep"):
        lex.tgt[kind] = [tgt.draw((1, 2)) for _ in lex.src[kind]]
    lex.gender = [rng.choice(_GENDERS) for _ in lex.src["noun"]]
    lex.tgt["noun"] = [tgt.draw((2, 2), ("", _PLURAL[g])) for g in lex.gender]
    lex.tgt["verb"] = [tgt.draw((1, 2), _VERB_ENDINGS, prefix="ge") for _ in lex.src["verb"]]
    lex.tgt["adj"] = [tgt.draw((1, 2), tuple(_ADJ_ENDINGS.values())) for _ in lex.src["adj"]]
    lex.tgt["adv"] = [tgt.draw((2, 3)) for _ in lex.src["adv"]]
    if cfg.p_relative:  # drawn last, so that the quick task's words stay what they were
        lex.src["rel"] = [src.draw((1, 1))]
        lex.tgt["rel"] = [tgt.draw((1, 1)) for _ in range(4)]  # agreeing with the head: m f n pl
    return lex


_CUMULATIVE: dict[tuple[int, float], list[float]] = {}


def _pick(rng: random.Random, n: int, zipf: float) -> int:
    """A word index in ``range(n)``: uniform, or by Zipf's law (index 0 the most frequent)."""
    if not zipf:
        return rng.randrange(n)
    key = (n, zipf)
    if key not in _CUMULATIVE:
        total, cum = 0.0, []
        for rank in range(1, n + 1):
            total += rank ** -zipf
            cum.append(total)
        _CUMULATIVE[key] = cum
    return rng.choices(range(n), cum_weights=_CUMULATIVE[key])[0]


def _noun_phrase(rng: random.Random, cfg: SyntheticTranslationConfig, lex: Lexicon, subject: bool, depth: int = 0
                 ) -> tuple[list[str], list[str], int]:
    """(source words, target words, person index 0-5) of one noun phrase; ``depth``: relative clauses above it."""
    if subject and rng.random() < cfg.p_pronoun:
        p = rng.randrange(6)
        return [lex.src["pronoun"][p]], [lex.tgt["pronoun"][p]], p
    noun, plural, definite = _pick(rng, len(lex.gender), cfg.zipf), rng.random() < 0.35, rng.random() < 0.6
    adjs = [_pick(rng, len(lex.src["adj"]), cfg.zipf) for _ in range(rng.choice((0, 0, 1, 1, 2)))]
    g = lex.gender[noun]
    agr = "pl" if plural else g
    src = [lex.src["det"][0 if definite else 1], *(lex.src["adj"][a] for a in adjs),
           lex.src["noun"][noun] + ("ri" if plural else "")]
    det = (0 if definite else 4) + ("m", "f", "n", "pl").index(agr)
    noun_t = [lex.tgt["noun"][noun] + (_PLURAL[g] if plural else "")]
    adjs_t = [lex.tgt["adj"][a] + _ADJ_ENDINGS[agr] for a in adjs]
    tgt = [lex.tgt["det"][det], *((adjs_t + noun_t) if cfg.adjective_order == "before" else (noun_t + adjs_t))]
    person = 5 if plural else 2
    if cfg.p_relative and depth < cfg.relative_depth and rng.random() < cfg.p_relative:
        rel_s, rel_t = _relative_clause(rng, cfg, lex, agr, person, depth + 1)
        src, tgt = [*rel_s, *src], [*tgt, *rel_t]
    return src, tgt, person


def _relative_clause(rng: random.Random, cfg: SyntheticTranslationConfig, lex: Lexicon, agr: str, person: int,
                     depth: int) -> tuple[list[str], list[str]]:
    """A relative clause whose subject is the head noun: ``NP_obj VERB REL`` before the head in the source;
    ``REL-agr NP_obj VERB-agr`` after it in the target (the pronoun agrees with the head's gender and number,
    the verb with its number)."""
    obj_s, obj_t, _ = _noun_phrase(rng, cfg, lex, subject=False, depth=depth)
    verb = _pick(rng, len(lex.src["verb"]), cfg.zipf)
    src = [*obj_s, lex.src["verb"][verb], lex.src["rel"][0]]
    tgt = [lex.tgt["rel"][("m", "f", "n", "pl").index(agr)], *obj_t, lex.tgt["verb"][verb] + _VERB_ENDINGS[person]]
    return src, tgt


def _clause(rng: random.Random, cfg: SyntheticTranslationConfig, lex: Lexicon, subordinate: bool
            ) -> tuple[list[str], list[str]]:
    subj_s, subj_t, person = _noun_phrase(rng, cfg, lex, subject=True)
    obj_s, obj_t, _ = _noun_phrase(rng, cfg, lex, subject=False)
    pp_s: list[str] = []
    pp_t: list[str] = []
    if rng.random() < cfg.p_pp:
        prep = rng.randrange(len(lex.src["prep"]))
        np_s, np_t, _ = _noun_phrase(rng, cfg, lex, subject=False)
        pp_s, pp_t = [lex.src["prep"][prep], *np_s], [lex.tgt["prep"][prep], *np_t]
    adv = _pick(rng, len(lex.src["adv"]), cfg.zipf) if rng.random() < cfg.p_adverb else None
    adv_s = [] if adv is None else [lex.src["adv"][adv]]
    adv_t = [] if adv is None else [lex.tgt["adv"][adv]]
    verb, tense = _pick(rng, len(lex.src["verb"]), cfg.zipf), rng.choice((None, None, 0, 1))  # 0 past, 1 future
    src = [*subj_s, *obj_s, *pp_s, *adv_s, lex.src["verb"][verb]]
    if tense is None:
        finite, participle = lex.tgt["verb"][verb] + _VERB_ENDINGS[person], []
    else:
        src.append(lex.src["tense"][tense])
        finite, participle = lex.tgt["aux"][6 * tense + person], ["ge" + lex.tgt["verb"][verb]]
    middle = [*adv_t, *obj_t, *pp_t]
    if subordinate or cfg.main_order == "verb-final":
        tgt = [*subj_t, *middle, *participle, finite]
    else:  # verb-second
        tgt = [*subj_t, finite, *middle, *participle]
    return src, tgt


def generate_pairs(cfg: SyntheticTranslationConfig, lex: Lexicon, count: int, rng: random.Random
                   ) -> list[tuple[str, str]]:
    """``count`` sentence pairs drawn from ``rng`` (duplicates possible; the writer removes them)."""
    pairs = []
    for _ in range(count):
        src, tgt = _clause(rng, cfg, lex, subordinate=False)
        if rng.random() < cfg.p_second_clause:
            sub = rng.random() < 0.5
            conj = rng.randrange(2)
            src2, tgt2 = _clause(rng, cfg, lex, subordinate=sub)
            src = [*src, lex.src["subord" if sub else "coord"][conj], *src2]
            tgt = [*tgt, lex.tgt["subord" if sub else "coord"][conj], *tgt2]
        pairs.append((" ".join(src) + ".", " ".join(tgt) + "."))  # detokenised: the period sticks
    return pairs


def word_for_word(sentence: str, lex: Lexicon) -> str:
    """A dictionary baseline: each source word replaced by its target word in source order (nouns keep
    their number, verbs take the 3rd person singular, adjectives the masculine, determiners the
    masculine singular, the relative pronoun the masculine; tense particles are dropped). It knows the
    whole vocabulary and ignores word order and agreement, so its BLEU measures how much of the task
    those make up."""
    table: dict[str, str] = {}
    for kind in ("pronoun", "coord", "subord", "prep", "adv"):
        table.update(zip(lex.src[kind], lex.tgt[kind]))
    table.update({lex.src["det"][0]: lex.tgt["det"][0], lex.src["det"][1]: lex.tgt["det"][4]})
    if "rel" in lex.src:
        table[lex.src["rel"][0]] = lex.tgt["rel"][0]
    table.update((s, t + _VERB_ENDINGS[2]) for s, t in zip(lex.src["verb"], lex.tgt["verb"]))
    table.update((s, t + _ADJ_ENDINGS["m"]) for s, t in zip(lex.src["adj"], lex.tgt["adj"]))
    for s, t, g in zip(lex.src["noun"], lex.tgt["noun"], lex.gender):
        table[s], table[s + "ri"] = t, t + _PLURAL[g]
    table.update(dict.fromkeys(lex.src["tense"], ""))
    words = sentence.removesuffix(".").split()
    return " ".join(w for w in (table.get(w, w) for w in words) if w) + "."


def seen_word_oracle(train_targets: Iterable[str], references: Iterable[str], unseen: str = "UNSEEN"
                     ) -> tuple[list[str], float]:
    """The output of a learner that translates every word seen in the training targets perfectly and no other:
    each reference with every word that never occurs in ``train_targets`` replaced by ``unseen``, and the share of
    reference words so replaced. Its BLEU is the task's ceiling for a model that learns from those pairs alone
    (words are compared without the sentence-final period)."""
    seen = {w.rstrip(".") for line in train_targets for w in line.split()}
    hyps, total, missing = [], 0, 0
    for line in references:
        words = line.split()
        known = [w.rstrip(".") in seen for w in words]
        total, missing = total + len(words), missing + known.count(False)
        hyps.append(" ".join(w if k else unseen for w, k in zip(words, known)))
    return hyps, missing / max(total, 1)


def write_synthetic_task(out_dir: str | Path, cfg: SyntheticTranslationConfig | None = None) -> Path:
    """Write ``{train,valid,test}.{src,tgt}`` and ``task.json`` under ``out_dir``; return the folder.

    Splits hold distinct source sentences (no valid or test sentence occurs in train). The same
    ``cfg`` always writes byte-identical files.
    """
    cfg = cfg or SyntheticTranslationConfig()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lex = make_lexicon(cfg)
    rng = random.Random(f"sentences-{cfg.seed}")
    sizes = {"valid": cfg.valid, "test": cfg.test, "train": cfg.train}
    seen: set[str] = set()
    splits: dict[str, list[tuple[str, str]]] = {name: [] for name in sizes}
    for name, size in sizes.items():
        attempts = 0
        while len(splits[name]) < size:
            attempts += 1
            if attempts > 20 * size + 1000:
                raise ValueError(f"could not draw {size} distinct {name} sentences; enlarge the vocabularies")
            (pair,) = generate_pairs(cfg, lex, 1, rng)
            if pair[0] not in seen:
                seen.add(pair[0])
                splits[name].append(pair)
    for name, pairs in splits.items():
        for side, index in (("src", 0), ("tgt", 1)):
            (out / f"{name}.{side}").write_text("".join(p[index] + "\n" for p in pairs), encoding="utf-8")
    meta = {"task": "synthetic_translation", "config": asdict(cfg),
            "src_lemmas": len(lex.src_vocabulary()), "tgt_lemmas": len(lex.tgt_vocabulary()),
            "src_word_forms": len({w for p in splits["train"] for w in p[0].split()}),
            "tgt_word_forms": len({w for p in splits["train"] for w in p[1].split()})}
    (out / "task.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return out
