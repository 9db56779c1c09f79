"""The count-based baselines: interpolated Kneser-Ney n-grams (normalised, hand-computed, vectorised path equal
to the scalar one, discounts from count-of-counts), lzma bits per byte, and the nats-to-bits-per-byte scale."""

import lzma
import math
from collections import Counter

import numpy as np
import pytest
import torch

from attention_course.ngram import (
    MAX_DISCOUNT,
    MIN_DISCOUNT,
    KneserNeyLM,
    bits_per_byte,
    lzma_bits_per_byte,
)

# The hand-computed stream: V = 4, so token 3 never occurs and only the uniform floor gives it mass.
TINY = [0, 1, 0, 2, 0, 1]


def _random_stream(seed, length, high):
    return np.random.default_rng(seed).integers(0, high, size=length)


# ---------------------------------------------------------------------------------------------------------
# Every distribution sums to one
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("order", [1, 2, 3, 4, 5])
def test_probabilities_sum_to_one_in_every_kind_of_context(order):
    V = 7
    train = _random_stream(0, 300, 5)  # ids 0..4 only: 5 and 6 are never seen
    model = KneserNeyLM(order, V).fit(train)
    seen = train[100 : 100 + order - 1].tolist()  # a context that occurs in training
    contexts = {
        "empty": [],
        "seen": seen,
        "partially seen": [6] + seen[1:],  # the oldest token was never seen, the rest was
        "unseen": [6, 5, 6, 5][: order - 1],
        "longer than needed": [1, 2, 3, 4, 0, 1, 2],
        "one token": [int(train[7])],
    }
    for name, context in contexts.items():
        total = sum(model.prob(t, context) for t in range(V))
        assert abs(total - 1.0) < 1e-9, f"{name} context {context}: probabilities sum to {total}"
        assert min(model.prob(t, context) for t in range(V)) > 0, f"{name} context: a zero probability"


def test_a_stream_shorter_than_the_order_still_gives_distributions():
    model = KneserNeyLM(5, 4).fit([1, 2])  # no 3-, 4- or 5-gram at all
    for context in ([], [1], [3, 1, 2, 1]):
        assert abs(sum(model.prob(t, context) for t in range(4)) - 1.0) < 1e-12
    assert np.isfinite(model.token_nats([1, 2, 3, 1, 2])).all()


# ---------------------------------------------------------------------------------------------------------
# Hand-computed cases
# ---------------------------------------------------------------------------------------------------------
def test_bigram_probabilities_match_the_hand_computation():
    # Stream 0 1 0 2 0 1, V = 4.
    # Order 2 (highest) uses raw bigram counts: (0,1): 2, (1,0): 1, (0,2): 1, (2,0): 1.
    #   count-of-counts n1 = 3, n2 = 1  ->  D_2 = 3 / (3 + 2·1) = 0.6
    # Order 1 uses continuation counts N1+(• w) = distinct tokens seen before w:
    #   w=0 after {1, 2}: 2;  w=1 after {0}: 1;  w=2 after {0}: 1;  w=3: 0.  Total N1+(• •) = 4, 3 types.
    #   n1 = 2, n2 = 1  ->  D_1 = 2 / (2 + 2) = 0.5
    # P_1(w) = max(N1+(• w) - 0.5, 0) / 4 + 0.5 · 3 / 4 · (1/4)       (the last term: lambda · uniform)
    floor = 0.5 * 3 / 4 * (1 / 4)  # = 0.09375
    p1 = {0: 1.5 / 4 + floor, 1: 0.5 / 4 + floor, 2: 0.5 / 4 + floor, 3: floor}
    assert sum(p1.values()) == pytest.approx(1.0)
    model = KneserNeyLM(2, 4).fit(TINY)
    assert model.discounts == pytest.approx((0.5, 0.6))
    # Context 0: followed by 1 twice and 2 once -> c(0 •) = 3, N1+(0 •) = 2, lambda = 0.6 · 2 / 3 = 0.4.
    assert model.prob(1, [0]) == pytest.approx((2 - 0.6) / 3 + 0.4 * p1[1], abs=1e-15)  # 0.5541666...
    assert model.prob(2, [0]) == pytest.approx((1 - 0.6) / 3 + 0.4 * p1[2], abs=1e-15)
    assert model.prob(0, [0]) == pytest.approx(0.4 * p1[0], abs=1e-15)  # never seen after 0: backed off only
    assert model.prob(1, [0]) == pytest.approx(0.5541666666666667)
    # Context 1: followed by 0 once -> c(1 •) = 1, N1+(1 •) = 1, lambda = 0.6.
    assert model.prob(0, [1]) == pytest.approx((1 - 0.6) / 1 + 0.6 * p1[0], abs=1e-15)  # 0.68125
    assert model.prob(3, [1]) == pytest.approx(0.6 * p1[3], abs=1e-15)
    # Context 3 was never seen: lambda = 1, the unigram continuation distribution alone.
    for w in range(4):
        assert model.prob(w, [3]) == pytest.approx(p1[w], abs=1e-15)
        assert model.prob(w, []) == pytest.approx(p1[w], abs=1e-15)


def test_given_discounts_replace_the_estimates():
    model = KneserNeyLM(2, 4, discounts=(0.3, 0.4)).fit(TINY)
    assert model.discounts == (0.3, 0.4)
    p1_of_1 = (1 - 0.3) / 4 + 0.3 * 3 / 4 * (1 / 4)  # continuation count of token 1 is 1 (see above)
    assert model.prob(1, [0]) == pytest.approx((2 - 0.4) / 3 + 0.4 * 2 / 3 * p1_of_1, abs=1e-15)


def test_trigram_uses_continuation_counts_below_the_top_order():
    # Stream 0 1 0 2 0 1, V = 4, order 3.
    # Trigrams (0,1,0), (1,0,2), (0,2,0), (2,0,1): each seen once -> n1 = 4, n2 = 0 -> D_3 = 1, clipped.
    # Order 2, continuation counts N1+(• a b) from the distinct trigrams:
    #   (1,0) after 0, (0,2) after 1, (2,0) after 0, (0,1) after 2: each 1 (the first (0,1), at the start
    #   of the stream, has nothing before it; its raw count would be 2) -> n1 = 4, n2 = 0 -> D_2 clipped too.
    # Order 1 as in the bigram test: D_1 = 0.5, P_1(1) = P_1(2) = 0.5/4 + 0.09375.
    d = MAX_DISCOUNT
    p1 = {1: 0.5 / 4 + 0.09375, 2: 0.5 / 4 + 0.09375}
    model = KneserNeyLM(3, 4).fit(TINY)
    assert model.discounts == pytest.approx((0.5, d, d))
    # P_2(w | 0): continuation counts after 0 are (0,1): 1 and (0,2): 1 -> total 2, 2 types, lambda = d.
    p2 = {w: (1 - d) / 2 + d * 2 / 2 * p1[w] for w in (1, 2)}
    # P_3(2 | 1 0): (1,0) is followed by 2 once -> total 1, 1 type, lambda = d.
    assert model.prob(2, [1, 0]) == pytest.approx((1 - d) / 1 + d * 1 / 1 * p2[2], abs=1e-15)
    # Context (3, 0) was never seen: P_3 = P_2(· | 0).
    assert model.prob(1, [3, 0]) == pytest.approx(p2[1], abs=1e-15)
    # With one token of context the model answers with its order-2 distribution.
    assert model.prob(1, [0]) == pytest.approx(p2[1], abs=1e-15)


def test_order_one_uses_raw_counts():
    # Counts 0: 3, 1: 2, 2: 1, 3: 0 out of N = 6 -> n1 = 1, n2 = 1 -> D_1 = 1/3; 3 types.
    model = KneserNeyLM(1, 4).fit(TINY)
    d = 1 / 3
    assert model.discounts == pytest.approx((d,))
    for w, count in enumerate([3, 2, 1, 0]):
        expected = max(count - d, 0) / 6 + d * 3 / 6 * (1 / 4)
        assert model.prob(w, [2, 1]) == pytest.approx(expected, abs=1e-15)  # the context is ignored


# ---------------------------------------------------------------------------------------------------------
# Discounts from count-of-counts
# ---------------------------------------------------------------------------------------------------------
def test_discount_from_constructed_count_of_counts():
    # Tokens 0, 1, 2 once; 3, 4 twice; 5 four times: n1 = 3, n2 = 2 -> D = 3 / (3 + 2·2) = 3/7.
    stream = [0, 1, 2, 3, 3, 4, 4, 5, 5, 5, 5]
    assert KneserNeyLM(1, 6).fit(stream).discounts == pytest.approx((3 / 7,))
    # Every token seen at least three times: n1 = n2 = 0, nothing to estimate from -> the smallest discount.
    assert KneserNeyLM(1, 2).fit([0, 1] * 3).discounts == (MIN_DISCOUNT,)
    # Only singletons: n1 / (n1 + 0) = 1 -> clipped below one.
    assert KneserNeyLM(1, 3).fit([0, 1, 2]).discounts == (MAX_DISCOUNT,)


def _reference_discounts(stream, order):
    """D_k from plain Python counting: raw counts at the top order, continuation counts below it."""
    discounts = []
    for k in range(1, order + 1):
        if k == order:
            counts = Counter(tuple(stream[i : i + k]) for i in range(len(stream) - k + 1))
        else:
            longer = {tuple(stream[i : i + k + 1]) for i in range(len(stream) - k)}
            counts = Counter(gram[1:] for gram in longer)
        n = Counter(counts.values())
        raw = n[1] / (n[1] + 2 * n[2]) if n[1] + 2 * n[2] else 0.0
        discounts.append(min(max(raw, MIN_DISCOUNT), MAX_DISCOUNT))
    return tuple(discounts)


@pytest.mark.parametrize("order", [2, 3, 4])
def test_discounts_match_plain_python_counting(order):
    # A skewed distribution over 16 tokens, so that every order has n-grams counted once and twice.
    probs = 1 / np.arange(1, 17) ** 1.5
    stream = np.random.default_rng(1).choice(16, size=400, p=probs / probs.sum()).tolist()
    expected = _reference_discounts(stream, order)
    assert all(MIN_DISCOUNT < d < MAX_DISCOUNT for d in expected)  # the test exercises the formula itself
    assert KneserNeyLM(order, 16).fit(stream).discounts == pytest.approx(expected, abs=1e-15)


# ---------------------------------------------------------------------------------------------------------
# The vectorised scorer equals the scalar one
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("order", [1, 2, 3, 4, 5])
def test_token_nats_equal_minus_log_prob_at_every_position(order):
    V = 6
    # Training holds a run of 1s, and eval starts with one: a scorer that gave the first tokens more context
    # than they have (reading before the stream's start) would find those contexts and answer differently.
    train = np.concatenate([_random_stream(2, 250, 4), [1] * 6, _random_stream(3, 250, 4)])
    model = KneserNeyLM(order, V).fit(train)
    eval_ids = np.concatenate([[1] * 5, _random_stream(4, 75, V)])  # ids 4 and 5 were never seen in training
    nats = model.token_nats(eval_ids)
    assert nats.shape == (79,)
    ids = eval_ids.tolist()
    expected = [-math.log(model.prob(ids[i], ids[max(0, i - order + 1) : i])) for i in range(1, len(ids))]
    np.testing.assert_allclose(nats, expected, rtol=1e-12, atol=0)
    assert model.cross_entropy(eval_ids) == pytest.approx(float(np.mean(expected)), rel=1e-12)


def test_tensor_array_and_list_inputs_agree():
    stream = _random_stream(4, 200, 5)
    as_array = KneserNeyLM(3, 5).fit(stream).token_nats(stream[:50])
    as_tensor = KneserNeyLM(3, 5).fit(torch.from_numpy(stream)).token_nats(torch.from_numpy(stream[:50]))
    as_list = KneserNeyLM(3, 5).fit(stream.astype(np.int32).tolist()).token_nats(stream[:50].tolist())
    np.testing.assert_array_equal(as_array, as_tensor)
    np.testing.assert_array_equal(as_array, as_list)


# ---------------------------------------------------------------------------------------------------------
# What the orders buy
# ---------------------------------------------------------------------------------------------------------
def test_higher_order_learns_long_deterministic_repeats():
    # 50 random tokens from V = 64 (no repeated 3-gram inside them), repeated: three tokens of context
    # determine the next one, one token of context almost does, no context leaves ~log(distinct) nats.
    rng = np.random.default_rng(5)
    cycle = rng.integers(0, 64, size=50)
    trigrams = {tuple(np.roll(cycle, -i)[:3]) for i in range(50)}
    assert len(trigrams) == 50
    train, eval_ids = np.tile(cycle, 40), np.tile(cycle, 4)
    ce = {order: KneserNeyLM(order, 64).fit(train).cross_entropy(eval_ids) for order in (1, 2, 4)}
    assert ce[1] > 3.0, ce
    assert ce[2] < ce[1], ce
    assert ce[4] < 0.1 and ce[4] < ce[1] / 30, ce


def test_order_one_approaches_the_entropy_of_an_iid_stream():
    V = 16
    probs = 1 / np.arange(1, V + 1)
    probs /= probs.sum()
    entropy = float(-(probs * np.log(probs)).sum())  # ≈ 2.38 nats
    rng = np.random.default_rng(6)
    train, eval_ids = rng.choice(V, size=200_000, p=probs), rng.choice(V, size=20_000, p=probs)
    model = KneserNeyLM(1, V).fit(train)
    assert model.cross_entropy(eval_ids) == pytest.approx(entropy, abs=0.03)
    # Context does not help an i.i.d. stream: a trigram model is no better (and barely worse).
    trigram = KneserNeyLM(3, V).fit(train).cross_entropy(eval_ids)
    assert entropy - 0.03 < trigram < entropy + 0.1


# ---------------------------------------------------------------------------------------------------------
# lzma and bits per byte
# ---------------------------------------------------------------------------------------------------------
def test_lzma_compresses_repetition_and_not_noise():
    repetitive = "the cat sat on the mat. " * 2000
    noise = np.random.default_rng(7).bytes(50_000)
    assert lzma_bits_per_byte(repetitive) < 0.1
    assert lzma_bits_per_byte(noise) > 7.9  # random bytes carry 8 bits each; lzma adds framing
    # str is measured as its UTF-8 bytes: "é" is two bytes.
    text = "café " * 500
    data = text.encode("utf-8")
    assert len(data) == 6 * 500
    assert lzma_bits_per_byte(text) == 8 * len(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME)) / 3000


def test_bits_per_byte_closed_forms():
    # A byte-level model that spreads its mass uniformly: ln 256 nats per byte = 8 bits per byte.
    assert bits_per_byte(math.log(256), 1000, 1000) == pytest.approx(8.0)
    # 3 bits per token, 100 tokens over 300 bytes: 300 bits / 300 bytes.
    assert bits_per_byte(3 * math.log(2), 100, 300) == pytest.approx(1.0)
    # Doubling the bytes a token covers halves bits per byte.
    assert bits_per_byte(2.0, 50, 400) == pytest.approx(bits_per_byte(2.0, 50, 200) / 2)
    assert bits_per_byte(0.0, 10, 10) == 0.0


# ---------------------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------------------
def test_bad_constructor_arguments_are_named():
    with pytest.raises(ValueError, match="order must be at least 1, got 0"):
        KneserNeyLM(0, 10)
    with pytest.raises(TypeError, match="order must be an int, got bool True"):
        KneserNeyLM(True, 10)
    with pytest.raises(TypeError, match="vocab_size must be an int, got float 2.5"):
        KneserNeyLM(2, 2.5)
    with pytest.raises(ValueError, match=r"order=6 with vocab_size=4096 needs n-gram keys of 72 bits"):
        KneserNeyLM(6, 4096)
    with pytest.raises(ValueError, match=r"one value per order \(3\), got 2"):
        KneserNeyLM(3, 10, discounts=(0.5, 0.5))
    with pytest.raises(ValueError, match=r"discounts must lie in \(0, 1\), got D_2 = 1.0"):
        KneserNeyLM(2, 10, discounts=(0.5, 1.0))
    with pytest.raises(ValueError, match=r"got D_1 = 0"):
        KneserNeyLM(2, 10, discounts=(0, 0.5))


def test_bad_token_streams_are_named():
    model = KneserNeyLM(2, 5)
    with pytest.raises(ValueError, match=r"train_ids must hold ids in \[0, vocab_size=5\), got 7 at position 2"):
        model.fit([1, 2, 7, 3])
    with pytest.raises(ValueError, match=r"got -1 at position 0"):
        model.fit(np.array([-1, 2]))
    with pytest.raises(ValueError, match=r"train_ids must be 1-D .* got shape \(2, 3\)"):
        model.fit(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(TypeError, match="train_ids must hold integer token ids, got a tensor of dtype torch.float32"):
        model.fit(torch.zeros(4))
    with pytest.raises(TypeError, match="got dtype float64"):
        model.fit(np.zeros(4))
    with pytest.raises(ValueError, match="train_ids is empty"):
        model.fit(np.zeros(0, dtype=np.int64))
    model.fit([0, 1, 2, 3, 4])
    with pytest.raises(ValueError, match=r"eval_ids must hold ids in \[0, vocab_size=5\), got 5 at position 1"):
        model.token_nats([0, 5])
    with pytest.raises(ValueError, match="eval_ids needs at least 2 tokens .* got 1"):
        model.cross_entropy([3])
    with pytest.raises(ValueError, match=r"token must be a token id in \[0, vocab_size=5\), got 9"):
        model.prob(9, [1])
    with pytest.raises(ValueError, match=r"context\[1\] must be a token id .* got -2"):
        model.prob(1, [1, -2])


def test_using_an_unfitted_model_says_to_fit_first():
    model = KneserNeyLM(3, 10)
    for use in (lambda: model.prob(1, [2]), lambda: model.token_nats([1, 2, 3]), lambda: model.discounts):
        with pytest.raises(RuntimeError, match=r"fit\(train_ids\) first"):
            use()


def test_bad_baseline_arguments_are_named():
    with pytest.raises(ValueError, match="text is empty"):
        lzma_bits_per_byte("")
    with pytest.raises(TypeError, match="text must be str or bytes, got list"):
        lzma_bits_per_byte([1, 2])
    with pytest.raises(ValueError, match="nats_per_token must be a finite number >= 0, got -0.5"):
        bits_per_byte(-0.5, 10, 10)
    with pytest.raises(ValueError, match="nats_per_token .* got nan"):
        bits_per_byte(float("nan"), 10, 10)
    with pytest.raises(ValueError, match="num_tokens must be a positive int, got 0"):
        bits_per_byte(1.0, 0, 10)
    with pytest.raises(ValueError, match="num_bytes must be a positive int, got -3"):
        bits_per_byte(1.0, 10, -3)
