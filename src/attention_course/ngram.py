"""The count-based baselines every language model of the course must beat (chapter 13).

Two floors: an interpolated Kneser-Ney n-gram model (:class:`KneserNeyLM`), the best of the classical
count-based language models, and a general-purpose compressor (:func:`lzma_bits_per_byte`). A neural model
that does not beat both has learned nothing a counter or ``xz`` could not. :func:`bits_per_byte` puts a
model's nats per token on the compressor's scale, which does not depend on the tokenizer.

The n-gram model works on integer token ids of any vocabulary, with orders 1 to 5 and more (order n sees
n - 1 tokens of context). Fitting and scoring are vectorised with numpy: every k-gram is encoded as one
int64 key in base V (``key = ((w1·V + w2)·V + ...)·V + wk``, 60 bits for a 5-gram when V ≤ 4096), counts
come from ``numpy.unique`` over sorted keys and look-ups from ``numpy.searchsorted``.

Measured (numpy 2.2, one core of a busy 2-core machine, V = 2048, order 5, CPU time): fitting on 3.3 M
tokens takes 0.4 s for Zipf-distributed phrases with repeats (0.7 s for i.i.d. Zipf tokens, 2.1 M distinct
5-grams); scoring 65 k tokens takes 0.06-0.13 s.
"""

from __future__ import annotations

import lzma
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from attention_course.checks import check_int

__all__ = ["KneserNeyLM", "bits_per_byte", "lzma_bits_per_byte"]

# An estimated discount is clipped into [MIN_DISCOUNT, MAX_DISCOUNT]. D = 0 would leave a seen context no
# mass for the tokens it was never followed by (an infinite loss on the first surprise); D = 1 would give
# every n-gram seen once no probability of its own at that order.
MIN_DISCOUNT = 0.01
MAX_DISCOUNT = 0.99


@dataclass
class _Level:
    """The counts of one order k of the model: k-grams and their (k-1)-token contexts, as sorted int64 keys.

    ``counts`` are raw counts c(h w) at the highest order and continuation counts N1+(• h w) below it;
    ``context_totals[j]`` is the sum of ``counts`` over the k-grams of context ``context_keys[j]`` and
    ``context_types[j]`` how many distinct tokens follow it (with a non-zero count).
    """

    keys: np.ndarray  # (G,) sorted k-gram keys
    counts: np.ndarray  # (G,)
    context_keys: np.ndarray  # (C,) sorted (k-1)-gram keys
    context_totals: np.ndarray  # (C,)
    context_types: np.ndarray  # (C,)
    discount: float


def _lookup(sorted_keys: np.ndarray, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each query, its index in ``sorted_keys`` and whether it is there: ``(index (Q,), found (Q,))``.

    Where ``found`` is False the index is a valid but meaningless position (so it can still be gathered).
    """
    if sorted_keys.size == 0:
        return np.zeros(queries.shape, dtype=np.int64), np.zeros(queries.shape, dtype=bool)
    index = np.minimum(np.searchsorted(sorted_keys, queries), sorted_keys.size - 1)
    return index, sorted_keys[index] == queries


def _ngram_keys(ids: np.ndarray, n: int, vocab_size: int) -> np.ndarray:
    """The base-V key of every n-gram of the 1-D ``ids``, in order: ``(len(ids) - n + 1,)`` int64."""
    count = ids.size - n + 1
    if count <= 0:
        return np.zeros(0, dtype=np.int64)
    keys = ids[:count].copy()
    for j in range(1, n):
        keys = keys * vocab_size + ids[j : j + count]
    return keys


def _estimate_discount(counts: np.ndarray) -> float:
    """D = n1 / (n1 + 2 n2) from the count-of-counts (n_r = number of n-grams counted exactly r times),
    clipped into [MIN_DISCOUNT, MAX_DISCOUNT]; no n-gram counted once or twice gives MIN_DISCOUNT."""
    n1, n2 = int(np.count_nonzero(counts == 1)), int(np.count_nonzero(counts == 2))
    raw = n1 / (n1 + 2 * n2) if n1 + 2 * n2 > 0 else 0.0
    return min(max(raw, MIN_DISCOUNT), MAX_DISCOUNT)


def _build_level(keys: np.ndarray, counts: np.ndarray, vocab_size: int, discount: float | None) -> _Level:
    """A :class:`_Level` from sorted unique k-gram ``keys`` and their ``counts``."""
    # Keys are sorted, so key // V (the context, i.e. the k-gram minus its last token) is sorted too, and
    # the k-grams of one context form one contiguous run.
    context_keys, starts, types = np.unique(keys // vocab_size, return_index=True, return_counts=True)
    totals = np.add.reduceat(counts, starts) if counts.size else np.zeros(0, dtype=np.int64)
    if discount is None:
        discount = _estimate_discount(counts)
    return _Level(keys, counts, context_keys, totals, types, discount)


def _as_ids(ids: object, vocab_size: int, name: str) -> np.ndarray:
    """``ids`` (a 1-D torch tensor, numpy array or sequence of ints) as a 1-D int64 numpy array in [0, V)."""
    if isinstance(ids, torch.Tensor):
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise TypeError(f"{name} must hold integer token ids, got a tensor of dtype {ids.dtype}")
        ids = ids.detach().cpu().numpy()
    array = np.asarray(ids)
    if array.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integer token ids, got dtype {array.dtype}")
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one stream of token ids), got shape {tuple(array.shape)}")
    if array.size and (array.min() < 0 or array.max() >= vocab_size):
        position = int(np.flatnonzero((array < 0) | (array >= vocab_size))[0])
        raise ValueError(f"{name} must hold ids in [0, vocab_size={vocab_size}), got {int(array[position])} "
                         f"at position {position}")
    return array.astype(np.int64, copy=False)


class KneserNeyLM:
    """Interpolated Kneser-Ney n-gram language model (Kneser & Ney 1995; Chen & Goodman 1998) on token ids.

    Args:
        order: n, the length of the longest n-gram; the model sees ``order - 1`` tokens of context.
        vocab_size: V; token ids lie in ``[0, V)``. ``V ** order`` must fit in 63 bits (order 5: V ≤ 6208).
        discounts: the absolute discounts ``(D_1, ..., D_n)``, each in (0, 1), one per order (``D_1`` for
            unigrams). Default: estimated in :meth:`fit` from each order's count-of-counts,
            ``D_k = n1 / (n1 + 2 n2)`` (n_r = number of k-grams whose count, as used at order k, is r),
            clipped into ``[MIN_DISCOUNT, MAX_DISCOUNT]``.

    The model, with ``h`` a context of k - 1 tokens and ``h'`` the same context without its oldest token::

        P_0(w)     = 1 / V                                              (uniform: no token has probability 0)
        P_k(w | h) = max(c_k(h w) - D_k, 0) / c_k(h •)  +  D_k · N1+(h •) / c_k(h •) · P_{k-1}(w | h')
                   = P_{k-1}(w | h')          when c_k(h •) = 0 (context never seen: its lambda is 1)

    where ``c_k(h •) = Σ_w c_k(h w)`` and ``N1+(h •)`` is the number of distinct tokens w with ``c_k(h w) > 0``.
    The counts differ by order: the highest order n uses raw counts, ``c_n(h w) = count(h w)`` in the
    training stream; every lower order uses continuation counts, ``c_k(g) = N1+(• g)``, the number of
    distinct tokens seen just before the k-gram g. A unigram is thus likely in a new context in proportion
    to how many contexts it followed, not how often it occurred. A k-gram seen only at the very start of
    the training stream has no token before it and so no continuation count.

    Each order sums to one over the vocabulary: the discounted counts sum to ``1 - D_k N1+(h •) / c_k(h •)``,
    exactly the weight given to the lower order. ``prob(w, context)`` is ``P_n`` given at least
    ``order - 1`` context tokens (only the last ``order - 1`` are used) and ``P_k`` given ``k - 1 < order - 1``.
    """

    def __init__(self, order: int, vocab_size: int, discounts: Sequence[float] | None = None) -> None:
        for name, value in (("order", order), ("vocab_size", vocab_size)):
            check_int(name, value)
        if vocab_size**order > 2**63 - 1:
            raise ValueError(f"order={order} with vocab_size={vocab_size} needs n-gram keys of "
                             f"{math.ceil(order * math.log2(vocab_size))} bits; at most 63 fit in int64")
        if discounts is not None:
            discounts = tuple(discounts)
            if len(discounts) != order:
                raise ValueError(f"discounts must hold one value per order ({order}), got {len(discounts)}: "
                                 f"{discounts!r}")
            for k, d in enumerate(discounts, start=1):
                if isinstance(d, bool) or not isinstance(d, numbers.Real) or not 0.0 < d < 1.0:
                    raise ValueError(f"discounts must lie in (0, 1), got D_{k} = {d!r}")
            discounts = tuple(float(d) for d in discounts)
        self.order = order
        self.vocab_size = vocab_size
        self._given_discounts = discounts
        self._levels: list[_Level] = []  # _levels[k - 1] holds order k

    # -----------------------------------------------------------------------------------------------------
    # Fitting
    # -----------------------------------------------------------------------------------------------------
    def fit(self, train_ids: object) -> KneserNeyLM:
        """Count the n-grams of ``train_ids`` (1-D integer ids, one stream) and estimate the discounts."""
        ids = _as_ids(train_ids, self.vocab_size, "train_ids")
        if ids.size == 0:
            raise ValueError("train_ids is empty: there is nothing to count")
        n, V = self.order, self.vocab_size
        given = self._given_discounts
        levels = []
        for k in range(1, n + 1):
            if k == n:  # highest order: raw counts of the k-grams
                keys, counts = np.unique(_ngram_keys(ids, k, V), return_counts=True)
            else:  # lower orders: N1+(• g) = distinct (k+1)-grams that end in g
                longer = np.unique(_ngram_keys(ids, k + 1, V))
                keys, counts = np.unique(longer % V**k, return_counts=True)  # drop the first token
            level = _build_level(keys, counts.astype(np.int64), V, None if given is None else given[k - 1])
            levels.append(level)
        self._levels = levels
        return self

    @property
    def discounts(self) -> tuple[float, ...]:
        """``(D_1, ..., D_n)``: the discount of each order, as given or as estimated by :meth:`fit`."""
        if self._levels:
            return tuple(level.discount for level in self._levels)
        if self._given_discounts is not None:
            return self._given_discounts
        raise RuntimeError("the discounts are estimated by fit(); call fit(train_ids) first")

    def _check_fitted(self) -> None:
        if not self._levels:
            raise RuntimeError(f"this {type(self).__name__} has not been fitted: call fit(train_ids) first")

    # -----------------------------------------------------------------------------------------------------
    # Probabilities
    # -----------------------------------------------------------------------------------------------------
    def prob(self, token: int, context: Sequence[int] = ()) -> float:
        """P(token | context), one scalar; only the last ``order - 1`` tokens of ``context`` are used."""
        self._check_fitted()
        V = self.vocab_size
        for name, value in [("token", token)] + [(f"context[{i}]", c) for i, c in enumerate(context)]:
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < V:
                raise ValueError(f"{name} must be a token id in [0, vocab_size={V}), got {value!r}")
        context = [int(c) for c in context][max(0, len(context) - (self.order - 1)) :]
        p = 1.0 / V
        for k in range(1, len(context) + 2):  # order k reads the last k - 1 context tokens
            level = self._levels[k - 1]
            h = 0
            for c in context[len(context) - (k - 1) :]:
                h = h * V + c
            j, seen = _lookup(level.context_keys, np.array([h]))
            if not seen[0]:
                continue  # unseen context: all weight on the lower order
            i, found = _lookup(level.keys, np.array([h * V + int(token)]))
            count = int(level.counts[i[0]]) if found[0] else 0
            total, types, d = int(level.context_totals[j[0]]), int(level.context_types[j[0]]), level.discount
            p = max(count - d, 0.0) / total + d * types / total * p
        return p

    def token_nats(self, eval_ids: object) -> np.ndarray:
        """-ln P of each token of ``eval_ids`` from its second on, given up to ``order - 1`` tokens before it.

        Returns ``(N - 1,)`` float64 nats for ``eval_ids`` of length N; entry i - 1 scores ``eval_ids[i]``
        given ``eval_ids[max(0, i - order + 1) : i]``, exactly as :meth:`prob` would.
        """
        self._check_fitted()
        ids = _as_ids(eval_ids, self.vocab_size, "eval_ids")
        if ids.size < 2:
            raise ValueError(f"eval_ids needs at least 2 tokens (the first is only context), got {ids.size}")
        V = self.vocab_size
        targets = np.arange(1, ids.size)  # positions predicted
        p = np.full(targets.size, 1.0 / V)
        gram = ids[targets]  # key of the k-gram ending at each target, built up one order at a time
        for k in range(1, self.order + 1):
            level = self._levels[k - 1]
            if k > 1:
                # Order k needs k - 1 tokens of context: targets before position k - 1 stop here (their
                # earliest token would be ids[-1]); clip the index and mask them out below.
                gram = ids[np.maximum(targets - (k - 1), 0)] * V**(k - 1) + gram
            if level.keys.size == 0:
                continue  # no k-gram in training (a stream shorter than k): every context is unseen
            usable = targets >= k - 1
            j, seen = _lookup(level.context_keys, gram // V)
            i, found = _lookup(level.keys, gram)
            count = np.where(found, level.counts[i], 0)
            total = level.context_totals[j].astype(np.float64)
            types = level.context_types[j]
            d = level.discount
            update = usable & seen
            with np.errstate(divide="ignore", invalid="ignore"):  # total is 0 only where update is False
                interpolated = np.maximum(count - d, 0.0) / total + d * types / total * p
            p = np.where(update, interpolated, p)
        return -np.log(p)

    def cross_entropy(self, eval_ids: object) -> float:
        """Mean nats per token of ``eval_ids`` (from its second token): the mean of :meth:`token_nats`."""
        return float(self.token_nats(eval_ids).mean())

    def __repr__(self) -> str:
        fitted = f", discounts={tuple(round(d, 3) for d in self.discounts)}" if self._levels else ""
        return f"{type(self).__name__}(order={self.order}, vocab_size={self.vocab_size}{fitted})"


# ---------------------------------------------------------------------------------------------------------
# A compressor, and the common scale
# ---------------------------------------------------------------------------------------------------------
def lzma_bits_per_byte(text: str | bytes) -> float:
    """Bits per byte of ``text`` compressed by lzma at its strongest setting (``preset=9 | PRESET_EXTREME``).

    ``8 · len(compressed) / len(data)``, with ``str`` encoded as UTF-8. The compressed size includes the
    container's fixed overhead (about 60 bytes), which matters only for short texts. This setting needs
    about 674 MiB of memory while it compresses (xz's documented figure for ``-9``).
    """
    if isinstance(text, str):
        data = text.encode("utf-8")
    elif isinstance(text, (bytes, bytearray)):
        data = bytes(text)
    else:
        raise TypeError(f"text must be str or bytes, got {type(text).__name__}")
    if not data:
        raise ValueError("text is empty: bits per byte is undefined for 0 bytes")
    return 8 * len(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME)) / len(data)


def bits_per_byte(nats_per_token: float, num_tokens: int, num_bytes: int) -> float:
    """A mean loss of ``nats_per_token`` over ``num_tokens`` predicted tokens that cover ``num_bytes`` bytes
    of text, in bits per byte: ``nats_per_token · num_tokens / ln 2 / num_bytes``.

    Total nats over total bytes, so models with different tokenizers (or lzma) can be compared.
    """
    if isinstance(nats_per_token, bool) or not isinstance(nats_per_token, numbers.Real) \
            or not math.isfinite(nats_per_token) or nats_per_token < 0:
        raise ValueError(f"nats_per_token must be a finite number >= 0, got {nats_per_token!r}")
    for name, value in (("num_tokens", num_tokens), ("num_bytes", num_bytes)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    return nats_per_token * num_tokens / math.log(2) / num_bytes
