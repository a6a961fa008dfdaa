"""Generated reviews: `python -m reviews.generate --out DIR --files 4 --rows 2000`.

Each review is two to four clauses such as "the staff was not friendly"; each clause is
positive or negative by its adjective, flipped by a "not" or "never" just before it, and the
review's label is the sign of the clauses' sum (ties are not written). Word order matters: "not"
flips only the word after it, so a bag of words cannot read a review as well as a model that
sees which word follows which.

Files are tab-separated, `LABEL<TAB>TEXT` per line (LABEL 1 positive, 0 negative), written as
train-NNNNN-of-NNNNN.tsv and eval-NNNNN-of-NNNNN.tsv. Plain Python, no TensorFlow: the same seed
gives the same files anywhere.
"""

from __future__ import annotations

import argparse
import os
import random

POSITIVE = ("good", "great", "excellent", "lovely", "fine", "tasty", "friendly", "fast", "clean", "fresh")
NEGATIVE = ("bad", "awful", "terrible", "poor", "rude", "slow", "dirty", "stale", "bland", "cold")
NEGATIONS = ("not", "never")
NOUNS = ("food", "service", "staff", "place", "table", "meal", "price", "room", "view", "coffee", "bread", "music")
LINKS = ("and", "but", "and then", "although")
ADVERBS = ("very", "really", "quite", "rather", "")


def clause(rng: random.Random) -> tuple[str, int]:
    """One clause and its polarity, +1 or -1."""
    positive = rng.random() < 0.5
    adjective = rng.choice(POSITIVE if positive else NEGATIVE)
    polarity = 1 if positive else -1
    words = ["the", rng.choice(NOUNS), rng.choice(("was", "is"))]
    if rng.random() < 0.35:
        words.append(rng.choice(NEGATIONS))
        polarity = -polarity
    adverb = rng.choice(ADVERBS)
    if adverb and words[-1] not in NEGATIONS:
        words.append(adverb)
    words.append(adjective)
    return " ".join(words), polarity


def review(rng: random.Random) -> tuple[str, int]:
    """A review and its label (1 positive, 0 negative); never a tie."""
    while True:
        clauses = [clause(rng) for _ in range(rng.randint(2, 4))]
        total = sum(polarity for _, polarity in clauses)
        if total:
            text = clauses[0][0]
            for words, _ in clauses[1:]:
                text += f" {rng.choice(LINKS)} {words}"
            return text, int(total > 0)


def write(out: str, split: str, files: int, rows: int, seed: int) -> list[str]:
    rng = random.Random(f"{seed}-{split}")
    os.makedirs(out, exist_ok=True)
    paths = []
    for index in range(files):
        path = os.path.join(out, f"{split}-{index:05d}-of-{files:05d}.tsv")
        with open(path, "w") as handle:
            for _ in range(rows // files + (index < rows % files)):
                text, label = review(rng)
                handle.write(f"{label}\t{text}\n")
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    from trainer import cli

    parser = cli.OneLineParser(prog="python -m reviews.generate", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for the .tsv files")
    parser.add_argument("--files", type=cli.positive_int, default=4, help="files per split")
    parser.add_argument("--rows", type=cli.positive_int, default=2000, help="training reviews (validation: a quarter)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    train = write(args.out, "train", args.files, args.rows, args.seed)
    validation = write(args.out, "eval", args.files, max(args.rows // 4, args.files), args.seed)
    print(f"wrote {len(train)} training and {len(validation)} validation files to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
