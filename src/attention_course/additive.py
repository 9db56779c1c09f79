"""Additive attention (Bahdanau, Cho and Bengio 2014), the score used by the first attentive translators.

    score(q, k) = wᵀ tanh(q W_q + k W_k)          a small one-hidden-layer network per (query, key) pair

Unlike the dot product, the query and the keys may have different sizes, and the score is not bilinear.
Weights and outputs then follow as in dot-product attention: masked softmax over keys, weighted sum of values.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attention_course.attention import masked_softmax
from attention_course.checks import check_int

__all__ = ["AdditiveAttention"]


class AdditiveAttention(nn.Module):
    """Bahdanau attention: weights ``softmax_j(wᵀ tanh(q_i W_q + k_j W_k))`` on the values ``v_j``.

    Args:
        query_dim: size of each query (e.g. the decoder's hidden state).
        key_dim: size of each key (e.g. an encoder state).
        hidden_dim: width of the hidden layer inside the score.

    Attributes:
        w_q: ``nn.Linear(query_dim, hidden_dim, bias=False)``.
        w_k: ``nn.Linear(key_dim, hidden_dim, bias=False)``.
        w: ``nn.Linear(hidden_dim, 1, bias=False)``, the vector w that turns each hidden vector into a score.

    Shape: ``forward(query (..., Lq, query_dim), key (..., Lk, key_dim), value (..., Lk, d_v), mask)`` returns
    ``context (..., Lq, d_v)`` and ``weights (..., Lq, Lk)``; a single query per step has ``Lq = 1``.
    ``mask`` broadcastable to ``(..., Lq, Lk)``, True = may attend.
    """

    def __init__(self, query_dim: int, key_dim: int, hidden_dim: int) -> None:
        super().__init__()
        for name, value in (("query_dim", query_dim), ("key_dim", key_dim), ("hidden_dim", hidden_dim)):
            check_int(name, value)
        self.query_dim = query_dim
        self.key_dim = key_dim
        self.w_q = nn.Linear(query_dim, hidden_dim, bias=False)
        self.w_k = nn.Linear(key_dim, hidden_dim, bias=False)
        self.w = nn.Linear(hidden_dim, 1, bias=False)

    def score(self, query: Tensor, key: Tensor) -> Tensor:
        """Unnormalised scores ``(..., Lq, Lk)`` for ``query (..., Lq, query_dim)`` and ``key (..., Lk, key_dim)``.

        Each score is bounded by the l1 norm of ``w``, since ``|tanh| <= 1``.
        """
        self._check_query_and_key(query, key)
        return self.score_projected_keys(query, self.w_k(key))

    def _check_query_and_key(self, query: Tensor, key: Tensor) -> None:
        if query.dim() < 2 or query.size(-1) != self.query_dim:
            raise ValueError(f"query must have shape (..., Lq, query_dim={self.query_dim}), got {tuple(query.shape)}")
        if key.dim() < 2 or key.size(-1) != self.key_dim:
            raise ValueError(f"key must have shape (..., Lk, key_dim={self.key_dim}), got {tuple(key.shape)}")

    def score_projected_keys(self, query: Tensor, projected_keys: Tensor) -> Tensor:
        """Scores ``(..., Lq, Lk)`` from keys already projected, ``projected_keys = w_k(key)`` ``(..., Lk, hidden)``.

        A decoder that attends to the same source at every step projects its keys once and calls this.
        """
        q = self.w_q(query).unsqueeze(-2)  # (..., Lq, 1, hidden)
        k = projected_keys.unsqueeze(-3)  # (..., 1, Lk, hidden)
        return self.w(torch.tanh(q + k)).squeeze(-1)  # (..., Lq, Lk)

    def forward(
        self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Return ``(context (..., Lq, d_v), weights (..., Lq, Lk))``."""
        self._check_query_and_key(query, key)
        if value.dim() < 2 or value.size(-2) != key.size(-2):
            raise ValueError(
                f"value must have shape (..., Lk, d_v) with the key's length, got key {tuple(key.shape)} and "
                f"value {tuple(value.shape)}"
            )
        if query.shape[:-2] != key.shape[:-2] or key.shape[:-2] != value.shape[:-2]:
            raise ValueError(
                f"query, key and value must have the same batch dimensions, got {tuple(query.shape)}, "
                f"{tuple(key.shape)} and {tuple(value.shape)}"
            )
        weights = masked_softmax(self.score(query, key), mask)  # (..., Lq, Lk)
        context = torch.matmul(weights, value)  # (..., Lq, d_v)
        return context, weights
