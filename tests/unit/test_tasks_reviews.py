"""The generated review task: its grammar, its label rule, determinism and its splits."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from attention_course.tasks.reviews import (
    ADJECTIVES,
    CLS,
    INTENSIFIERS,
    NEGATIONS,
    PAD,
    UNK,
    VOCAB,
    ReviewVocabulary,
    generate_review,
    generate_reviews,
    make_review_splits,
)


def _reference_label(tokens: tuple[str, ...]) -> tuple[int, tuple[int, ...]]:
    """The label rule written independently of the generator: (label, decisive positions).

    The deciding clause is what follows "but" (or the whole review); in it, the adjective is the only
    sentiment word, and it is negated when "not"/"never" stands right before it or right before its
    intensifier.
    """
    start = tokens.index("but") + 1 if "but" in tokens else 0
    adjectives = [i for i in range(start, len(tokens)) if tokens[i] in ADJECTIVES]
    assert len(adjectives) == 1, f"deciding clause should have one adjective: {tokens}"
    adjective = adjectives[0]
    before = adjective - 1
    if tokens[before] in INTENSIFIERS:
        before -= 1
    negated = tokens[before] in NEGATIONS
    polarity = ADJECTIVES[tokens[adjective]]
    label = 1 - polarity if negated else polarity
    return label, ((before, adjective) if negated else (adjective,))


@pytest.fixture(scope="module")
def reviews():
    return generate_reviews(3000, seed=7)


def test_labels_follow_the_rule(reviews):
    for review in reviews:
        label, decisive = _reference_label(review.tokens)
        assert review.label == label, review.text
        assert review.decisive == decisive, review.text
        assert review.negated == (len(decisive) == 2)
        assert review.contrast == ("but" in review.tokens)


def test_but_joins_clauses_of_opposite_polarity(reviews):
    contrast = [r for r in reviews if r.contrast]
    assert len(contrast) > 900
    for review in contrast:
        cut = review.tokens.index("but")
        first_label, _ = _reference_label(review.tokens[:cut])
        assert first_label == 1 - review.label, review.text


def test_distractor_not_negates_nothing(reviews):
    with_distractor = [r for r in reviews if r.distractor_not]
    assert len(with_distractor) > 50
    for review in with_distractor:
        assert review.tokens[:3] == ("not", "surprisingly", ",")
        assert 0 not in review.decisive and 1 not in review.decisive


def test_every_kind_of_review_occurs_with_both_labels(reviews):
    for attribute in ("negated", "contrast", "intensified", "distractor_not"):
        labels = Counter(r.label for r in reviews if getattr(r, attribute))
        assert labels[0] > 20 and labels[1] > 20, (attribute, labels)
    # the hardest phrase of the brief: negation *and* intensifier before the adjective
    assert any(r.negated and r.intensified for r in reviews)


def test_probabilities_shape_the_mix(reviews):
    n = len(reviews)
    # defaults: p_contrast = 0.4, p_negation = 0.3; 5 binomial standard deviations of slack
    for observed, p in ((sum(r.contrast for r in reviews), 0.4), (sum(r.negated for r in reviews), 0.3),
                        (sum(r.label for r in reviews), 0.5)):
        assert abs(observed / n - p) < 5 * (p * (1 - p) / n) ** 0.5, (observed, p)
    plain = generate_reviews(300, seed=1, p_contrast=0.0, p_negation=0.0, p_opener=0.0)
    assert not any(r.contrast or r.negated or r.distractor_not for r in plain)


def test_bag_of_words_cannot_decide_contrast_reviews():
    """Swapping the two clauses of a "but" review keeps its words and flips its label."""
    rng = random.Random(3)
    checked = 0
    while checked < 200:
        review = generate_review(rng, p_contrast=1.0, p_opener=0.0)
        cut = review.tokens.index("but")
        swapped = review.tokens[cut + 1:] + ("but",) + review.tokens[:cut]
        assert Counter(swapped) == Counter(review.tokens)
        assert _reference_label(swapped)[0] == 1 - review.label
        checked += 1


def test_generation_is_deterministic_and_distinct():
    a = generate_reviews(200, seed=11)
    b = generate_reviews(200, seed=11)
    c = generate_reviews(200, seed=12)
    assert a == b
    assert [r.text for r in a] != [r.text for r in c]
    assert len({r.text for r in a}) == 200
    state = random.getstate()
    generate_reviews(10, seed=0)
    assert random.getstate() == state, "the global random state must not be touched"


def test_splits_are_disjoint_padded_and_labelled():
    train, test = make_review_splits(500, 200, seed=5)
    assert len(train) == 500 and len(test) == 200
    assert not {r.text for r in train.reviews} & {r.text for r in test.reviews}
    assert train.tokens.shape[1] == test.tokens.shape[1]
    assert train.tokens.dtype == torch.long and train.labels.dtype == torch.long
    assert (train.tokens[:, 0] == VOCAB.cls_id).all()
    for split in (train, test):
        for row, review in zip(split.tokens, split.reviews):
            length = len(review.tokens) + 1
            assert VOCAB.decode(row[1:length]) == list(review.tokens)
            assert (row[length:] == VOCAB.pad_id).all()
            assert not (row == VOCAB.unk_id).any()
        assert torch.equal(split.labels, torch.tensor([r.label for r in split.reviews]))
    assert torch.equal(train.mask("contrast"), torch.tensor([r.contrast for r in train.reviews]))
    again, _ = make_review_splits(500, 200, seed=5)
    assert torch.equal(again.tokens, train.tokens)


def test_vocabulary_encode_decode_and_unknown_words():
    ids = VOCAB.encode("Honestly, the plot was not very good")
    assert ids[0] == VOCAB.cls_id
    assert VOCAB.decode(ids[1:]) == ["honestly", ",", "the", "plot", "was", "not", "very", "good"]
    assert VOCAB.encode("the popcorn was good", add_cls=False)[1] == VOCAB.unk_id
    assert VOCAB.words[:3] == (PAD, CLS, UNK)
    batch = VOCAB.batch(["the plot was good", "the film was not good at times"])
    assert batch.shape == (2, 8)  # <cls> + 7 words
    assert batch[0, 5:].eq(VOCAB.pad_id).all()


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="p_negation"):
        generate_review(random.Random(0), p_negation=1.5)
    with pytest.raises(ValueError, match="num"):
        generate_reviews(0)
    with pytest.raises(ValueError, match="max_len=3"):
        VOCAB.batch(["the plot was good"], max_len=3)
    with pytest.raises(ValueError, match="start with"):
        ReviewVocabulary(["a", "b", "c"])
    with pytest.raises(ValueError, match="attribute"):
        make_review_splits(10, 10)[0].mask("sarcastic")
