"""How far rare words cap a generated translation task: the test BLEU of a learner that translates every word
seen in training perfectly and no other (each target word that never occurs in the training targets is replaced
by one placeholder word). A task whose cap is near 100 holds a system below the ceiling only by what it fails to learn.

    python benchmarks/synthetic_ceiling.py --task hard --change train=10000 --change nouns=6000
"""

from __future__ import annotations

import argparse
import json
import tempfile
from typing import Any

import sacrebleu

from fixup.data.synthetic_translation import SYNTHETIC_TASKS, seen_word_oracle, synthetic_task, write_synthetic_task


def ceiling(task: str = "hard", **changes: Any) -> dict[str, Any]:
    """The cap of the named task with ``changes`` (seed, train, vocabulary sizes, ...): the share of test target
    words never seen in training, and the BLEU of the reference with those words replaced."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_synthetic_task(tmp, synthetic_task(task, **changes))
        train = (folder / "train.tgt").read_text().splitlines()
        refs = (folder / "test.tgt").read_text().splitlines()
    hyps, unseen = seen_word_oracle(train, refs)
    return {"task": task, "changes": changes, "unseen_target_words": unseen,
            "ceiling_bleu": sacrebleu.corpus_bleu(hyps, [refs]).score}


def _change(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"--change takes NAME=VALUE (e.g. train=10000), got {text!r}")
    return key, json.loads(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="hard", choices=sorted(SYNTHETIC_TASKS))
    parser.add_argument("--change", type=_change, action="append", default=[],
                        help="a field of SyntheticTranslationConfig over the task's, NAME=VALUE (repeatable)")
    args = parser.parse_args()
    result = ceiling(args.task, **dict(args.change))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
