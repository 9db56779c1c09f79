"""Generated movie reviews whose sentiment hangs on a few decisive words (chapter 09's classification task).

Every review comes from a small grammar, so the data set is made from a seed, never downloaded, and the
label is known exactly. The grammar (``|`` separates choices, ``[...]`` is optional)::

    review      := [opener ","] clause                      a single clause decides
                 | [opener ","] clause "but" clause         the clause after "but" decides
    clause      := subject verb opinion [coda]
    opinion     := [negation] [intensifier] adjective
    subject     := "the plot" | "the acting" | "the music" | "the ending" | "the film" | ...
    verb        := "was" | "is" | "felt" | "seemed"
    negation    := "not" | "never"
    intensifier := "very" | "really" | "truly" | "quite" | "so"
    adjective   := positive: "good" | "great" | "fun" | "clever" | "moving" | "superb" | ...
                   negative: "bad" | "dull" | "awful" | "boring" | "weak" | "clumsy" | ...
    opener      := "honestly" | "overall" | "in the end" | "to be fair" | "not surprisingly" | ...
    coda        := "at times" | "for me" | "in places" | "to be honest" | ...

The label rule:

- a clause's polarity is its adjective's polarity, flipped when the clause has a negation
  (an intensifier never flips it: "not very good" is negative, "not very bad" positive);
- a review's label is the polarity of its **deciding clause**: the only clause, or the one after "but".
  In a "but" review the two clauses always have opposite polarities, as the word suggests.

Three things make the task need more than a bag of words:

- negation is an interaction: "not" flips "good" but is itself neither positive nor negative, so no
  weighted sum of word counts gets both "good"/"not good" and "bad"/"not bad" right;
- order decides "but" reviews: "the plot was good but the music was bad" and "the plot was bad but the
  music was good" contain exactly the same words and have opposite labels, so *any* model that sees only
  word counts gets at most one of the two right;
- distractors: the opener "not surprisingly" contains a "not" that negates nothing, and the first clause
  of a "but" review carries sentiment words that do not count.

Usage::

    train, test = make_review_splits(num_train=4000, num_test=1000, seed=0)
    train.tokens   # (4000, L) token ids, <cls> first, right-padded with <pad>
    train.labels   # (4000,) 1 = positive, 0 = negative
    train.reviews  # the Review objects: text, label and which tokens decide it
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from attention_course.checks import check_int
from attention_course.vocabulary import CLS, PAD, UNK, Vocabulary

__all__ = [
    "ADJECTIVES",
    "CLS",
    "INTENSIFIERS",
    "NEGATIONS",
    "PAD",
    "UNK",
    "Review",
    "ReviewSplit",
    "ReviewVocabulary",
    "VOCAB",
    "generate_review",
    "generate_reviews",
    "make_review_splits",
]


POSITIVE = ("good", "great", "fun", "clever", "moving", "superb", "lovely", "gripping")
NEGATIVE = ("bad", "dull", "awful", "boring", "weak", "clumsy", "tedious", "bland")
#: adjective -> polarity (1 = positive, 0 = negative)
ADJECTIVES: dict[str, int] = {**{word: 1 for word in POSITIVE}, **{word: 0 for word in NEGATIVE}}
#: Words that flip the polarity of the adjective they precede ("not good" is negative).
NEGATIONS = ("not", "never")
#: Words that strengthen an adjective without changing its polarity.
INTENSIFIERS = ("very", "really", "truly", "quite", "so")
SUBJECTS = (
    "the plot", "the acting", "the music", "the ending", "the film", "the cast", "the story", "the dialogue",
    "the pacing", "the script",
)
#: Linking verbs between a review's subject and its adjective.
VERBS = ("was", "is", "felt", "seemed")
OPENERS = ("honestly", "overall", "in the end", "to be fair", "not surprisingly", "i think", "sadly enough")
CODAS = ("at times", "for me", "in places", "to be honest", "on the whole", "by the end")


def _words(phrases: Iterable[str]) -> list[str]:
    return [word for phrase in phrases for word in phrase.split()]


def _vocabulary_words() -> tuple[str, ...]:
    """Every word the grammar can produce, specials first, each once, in a fixed order."""
    words = [PAD, CLS, UNK, ",", "but"]
    groups = (POSITIVE, NEGATIVE, NEGATIONS, INTENSIFIERS, SUBJECTS, VERBS, OPENERS, CODAS)
    for word in _words(phrase for group in groups for phrase in group):
        if word not in words:
            words.append(word)
    return tuple(words)


class ReviewVocabulary(Vocabulary):
    """The course's :class:`~attention_course.vocabulary.Vocabulary` with ``<pad>``, ``<cls>``, ``<unk>`` first.

    Reviews are lower-cased and split on spaces (a comma is its own token); unknown words become ``<unk>``.

    Args:
        words: all words, specials first (default: every word the grammar produces).
    """

    def __init__(self, words: Sequence[str] | None = None) -> None:
        words = tuple(words) if words is not None else _vocabulary_words()
        if words[:3] != (PAD, CLS, UNK):
            raise ValueError(f"the vocabulary must start with {PAD!r}, {CLS!r}, {UNK!r}, got {words[:3]}")
        if len(set(words)) != len(words):
            raise ValueError("the vocabulary has duplicate words")
        super().__init__(words[3:], specials=(PAD, CLS, UNK))

    @property
    def words(self) -> tuple[str, ...]:
        """Every token, by id (the same as ``itos``, as a tuple)."""
        return tuple(self.itos)

    @property
    def index(self) -> dict[str, int]:
        """Token -> id (the same as ``stoi``)."""
        return self.stoi

    def encode(self, tokens: Sequence[str] | str, add_cls: bool = True) -> list[int]:  # type: ignore[override]
        """Token ids of one review (a string is split on spaces); unknown words become ``<unk>``."""
        if isinstance(tokens, str):
            tokens = tokens.replace(",", " , ").split()
        ids = self.ids(token.lower() for token in tokens)
        return [self.cls_id, *ids] if add_cls else ids

    def decode(self, ids: Iterable[int], skip_pad: bool = True) -> list[str]:  # type: ignore[override]
        """Words of a sequence of ids (padding dropped unless ``skip_pad=False``)."""
        return [self.itos[int(i)] for i in ids if not (skip_pad and int(i) == self.pad_id)]

    def batch(self, reviews: Sequence[Sequence[str] | str], max_len: int | None = None,
              add_cls: bool = True) -> Tensor:
        """Right-padded ids ``(N, L)`` for N reviews; L is the longest review or ``max_len``.

        Raises:
            ValueError: a review is longer than ``max_len``, or there are no reviews.
        """
        if len(reviews) == 0:
            raise ValueError("batch() needs at least one review")
        encoded = [self.encode(review, add_cls=add_cls) for review in reviews]
        longest = max(len(ids) for ids in encoded)
        if max_len is not None and longest > max_len:
            raise ValueError(f"a review has {longest} tokens, more than max_len={max_len}")
        return self.pad_batch(encoded, max_len)


#: The vocabulary of the grammar (shared by every split).
VOCAB = ReviewVocabulary()


@dataclass(frozen=True)
class Review:
    """One generated review.

    Attributes:
        tokens: the words, e.g. ``("the", "plot", "was", "not", "very", "good")``.
        label: 1 positive, 0 negative.
        decisive: positions in ``tokens`` of the words that decide the label: the negation (if any) and the
            adjective of the deciding clause.
        negated: the deciding clause has a negation.
        contrast: the review has two clauses joined by "but".
        intensified: the deciding clause has an intensifier.
        distractor_not: the review opens with "not surprisingly" (a "not" that negates nothing).
    """

    tokens: tuple[str, ...]
    label: int
    decisive: tuple[int, ...]
    negated: bool
    contrast: bool
    intensified: bool
    distractor_not: bool

    @property
    def text(self) -> str:
        return " ".join(self.tokens).replace(" ,", ",")


def _clause(rng: random.Random, polarity: int, p_negation: float, p_intensifier: float,
            p_coda: float) -> tuple[list[str], list[int], bool, bool]:
    """Words of one clause with the given polarity, the offsets of its decisive words, negated, intensified."""
    negated = rng.random() < p_negation
    intensified = rng.random() < p_intensifier
    adjective_polarity = 1 - polarity if negated else polarity
    adjective = rng.choice(POSITIVE if adjective_polarity == 1 else NEGATIVE)
    words = rng.choice(SUBJECTS).split() + [rng.choice(VERBS)]
    decisive = []
    if negated:
        decisive.append(len(words))
        words.append(rng.choice(NEGATIONS))
    if intensified:
        words.append(rng.choice(INTENSIFIERS))
    decisive.append(len(words))
    words.append(adjective)
    if rng.random() < p_coda:
        words += rng.choice(CODAS).split()
    return words, decisive, negated, intensified


def generate_review(
    rng: random.Random,
    p_contrast: float = 0.4,
    p_negation: float = 0.3,
    p_intensifier: float = 0.4,
    p_opener: float = 0.4,
    p_coda: float = 0.3,
) -> Review:
    """Draw one review from the grammar (see the module docstring) with the random source ``rng``.

    Args:
        rng: a ``random.Random``; the review is a deterministic function of its state.
        p_contrast: probability of a two-clause "but" review.
        p_negation: probability that a clause is negated.
        p_intensifier: probability that a clause has an intensifier.
        p_opener: probability of an opening phrase ("honestly,", "not surprisingly,", ...).
        p_coda: probability that a clause ends with a neutral phrase ("at times", ...).
    """
    for name, p in (("p_contrast", p_contrast), ("p_negation", p_negation), ("p_intensifier", p_intensifier),
                    ("p_opener", p_opener), ("p_coda", p_coda)):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"{name} must be a probability in [0, 1], got {p!r}")
    label = rng.randrange(2)
    tokens: list[str] = []
    opener = rng.choice(OPENERS) if rng.random() < p_opener else None
    if opener is not None:
        tokens += opener.split() + [","]
    contrast = rng.random() < p_contrast
    if contrast:  # the first clause has the opposite polarity and does not decide
        first, _, _, _ = _clause(rng, 1 - label, p_negation, p_intensifier, p_coda)
        tokens += first + ["but"]
    words, offsets, negated, intensified = _clause(rng, label, p_negation, p_intensifier, p_coda)
    decisive = tuple(len(tokens) + offset for offset in offsets)
    tokens += words
    return Review(tuple(tokens), label, decisive, negated, contrast, intensified, opener == "not surprisingly")


def generate_reviews(num: int, seed: int = 0, *, exclude: Iterable[str] = (), **probabilities: float) -> list[Review]:
    """``num`` distinct reviews drawn from the grammar, deterministic in ``seed``.

    Args:
        num: how many reviews.
        seed: seed of the private random source (the global random state is not touched).
        exclude: review texts that must not be produced (e.g. the training set, to build a held-out set).
        **probabilities: passed to :func:`generate_review`.
    """
    check_int("num", num)
    rng = random.Random(seed)
    seen = set(exclude)
    reviews: list[Review] = []
    attempts = 0
    while len(reviews) < num:
        attempts += 1
        if attempts > 50 * num + 1000:
            raise ValueError(f"could not draw {num} distinct reviews; the grammar's settings allow too few")
        review = generate_review(rng, **probabilities)
        if review.text in seen:
            continue
        seen.add(review.text)
        reviews.append(review)
    return reviews


@dataclass
class ReviewSplit:
    """Reviews ready for training.

    Attributes:
        tokens: ``(N, L)`` long ids, ``<cls>`` first, right-padded with ``<pad>`` (id 0).
        labels: ``(N,)`` long, 1 = positive, 0 = negative.
        reviews: the N :class:`Review` objects, in the same order.
    """

    tokens: Tensor
    labels: Tensor
    reviews: list[Review]

    def __len__(self) -> int:
        return len(self.reviews)

    def mask(self, attribute: str) -> Tensor:
        """``(N,)`` bool: which reviews have the boolean ``attribute`` (e.g. ``"negated"``, ``"contrast"``)."""
        if attribute not in ("negated", "contrast", "intensified", "distractor_not"):
            raise ValueError(f"unknown attribute {attribute!r}")
        return torch.tensor([getattr(review, attribute) for review in self.reviews], dtype=torch.bool)


def _split(reviews: list[Review], max_len: int) -> ReviewSplit:
    tokens = VOCAB.batch([review.tokens for review in reviews], max_len=max_len)
    labels = torch.tensor([review.label for review in reviews], dtype=torch.long)
    return ReviewSplit(tokens, labels, reviews)


def make_review_splits(num_train: int, num_test: int, seed: int = 0,
                       **probabilities: float) -> tuple[ReviewSplit, ReviewSplit]:
    """A training and a held-out split; no review text appears in both.

    Both are padded to the same length (the longest review of either, plus the ``<cls>`` token), so a model
    sees tensors of one shape. The same ``seed`` gives the same splits.
    """
    train = generate_reviews(num_train, seed, **probabilities)
    test = generate_reviews(num_test, seed + 1_000_003, exclude=(r.text for r in train), **probabilities)
    max_len = 1 + max(len(review.tokens) for review in train + test)
    return _split(train, max_len), _split(test, max_len)
