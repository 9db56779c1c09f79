"""Multi-head attention (Vaswani et al. 2017, §3.2.2).

    head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)        each head works in d_head = d_model / h dimensions
    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O

The h per-head projections are stored as one ``(d_model, d_model)`` linear layer each for queries, keys and
values; :meth:`MultiHeadAttention.split_heads` reshapes their output so that all heads run in one batched
matrix product, and :meth:`MultiHeadAttention.merge_heads` concatenates the heads again.

Options of chapters 14 and 15, all off by default (the paper's layer):

- ``positions="rotary"`` rotates queries and keys by their positions (:func:`~attention_course.apply_rotary`);
  ``positions="alibi"`` adds ALiBi's linear distance bias to the scores (:func:`~attention_course.alibi_bias`).
- ``num_kv_heads`` < ``num_heads``: grouped-query attention (``1``: multi-query), with key and value
  projections of ``num_kv_heads * d_head`` columns (:func:`~attention_course.grouped_query_attention`).
- ``config=ModelConfig(...)``: all of these options as one object (:mod:`attention_course.config`), with
  the rotary pairing (``"interleaved"`` or Llama's ``"half"``) and a sliding window for cached decoding.
- ``forward(..., cache=KVCache())``: incremental decoding, the new positions' keys and values appended to
  the cache; :meth:`MultiHeadAttention.attend` takes precomputed keys and values (a decoder's
  cross-attention computes those of the encoder output once).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attention_course.alibi import alibi_bias_at, alibi_slopes
from attention_course.checks import check_int
from attention_course.config import ModelConfig, resolve_config
from attention_course.grouped_query import grouped_query_attention
from attention_course.kv_cache import KVCache
from attention_course.masks import window_mask
from attention_course.rotary import apply_rotary

__all__ = ["POSITION_SCHEMES", "MultiHeadAttention"]

POSITION_SCHEMES = (None, "rotary", "alibi")


def _refuse_rank3_mask(mask: Tensor | None, batch: int, num_heads: int) -> None:
    """Raise on a rank-3 mask: broadcasting would read ``(B, Lq, Lk)`` as ``(H, Lq, Lk)``, per head."""
    if isinstance(mask, Tensor) and mask.dim() == 3:
        raise ValueError(
            f"a mask of rank 3, shape {tuple(mask.shape)}, is ambiguous for multi-head attention with batch "
            f"{batch} and {num_heads} heads: broadcast against the scores (B, H, Lq, Lk) its first dimension "
            "would be read as the heads, not the batch. Give it rank 4: mask[:, None] of shape (B, 1, Lq, Lk) "
            "for one mask per batch item, or mask[None] of shape (1, H, Lq, Lk) for one per head (or a rank-2 "
            "(Lq, Lk) mask shared by all)"
        )


def _with_contract_keywords(config: ModelConfig, bias: bool, num_kv_heads: int | None) -> ModelConfig:
    """Fold the two keywords of the public signature (``bias``, ``num_kv_heads``) into ``config``.

    A keyword left at its default defers to the config; one that was set is used, unless the config sets the
    same option to something else, which is an error naming both rather than a silent choice.
    """
    changes = {}
    for name, value, default in (("bias", bias, True), ("num_kv_heads", num_kv_heads, None)):
        if value == default:
            continue
        configured = getattr(config, name)
        if configured != default and configured != value:
            raise ValueError(f"MultiHeadAttention: {name}={value!r} was given both as an argument and, "
                             f"differently, in config ({name}={configured!r}); give it in one place")
        changes[name] = value
    return config.replace(**changes) if changes else config


class MultiHeadAttention(nn.Module):
    """Multi-head attention with separate query, key, value and output projections.

    Args:
        d_model: model width (features per token); must be divisible by ``num_heads``.
        num_heads: number of heads h; each head has ``d_head = d_model // num_heads`` features.
        dropout: dropout probability on the attention weights (as in ``nn.MultiheadAttention``), active in
            training mode only.
        bias: whether the four projections have a bias (the course's public signature; the same as
            ``config.bias``: give it in one place).
        num_kv_heads: key/value heads (the same as ``config.num_kv_heads``: give it in one place).
        config: a :class:`~attention_course.ModelConfig` with the layer's options (default: all off):
            ``bias`` (whether the four projections have a bias); ``num_kv_heads`` (key/value heads, default
            ``num_heads``: multi-head attention; must divide ``num_heads``; fewer gives grouped-query
            attention, ``1`` multi-query attention); ``positions`` (``None``: positions, if any, were added
            to the input; ``"rotary"``: rotate queries and keys by their positions; ``"alibi"``: add
            ``-m_h·|i - j|`` to head h's scores); ``rotary_base`` and ``rotary_pairing``; ``window``.
            For example ``MultiHeadAttention(64, 8, config=ModelConfig(num_kv_heads=2))``.

    Attributes:
        config: the resolved :class:`~attention_course.ModelConfig` (what the layer was built with).
        w_q: the query projection, ``nn.Linear(d_model, d_model)``. Row-vector convention:
            ``Q = query @ w_q.weight.T + w_q.bias``.
        w_k: the key projection, ``nn.Linear(d_model, num_kv_heads * d_head)``.
        w_v: the value projection, ``nn.Linear(d_model, num_kv_heads * d_head)``.
        w_o: the output projection applied to the merged heads, ``nn.Linear(d_model, d_model)``.

    Shapes (B = batch, Lq = query length, Lk = key/value length):
        ``forward(query (B, Lq, d_model), key (B, Lk, d_model), value (B, Lk, d_model), mask)`` returns
        ``output (B, Lq, d_model)`` and the per-head attention weights ``(B, H, Lq, Lk)``.
        Self-attention passes the same tensor three times; cross-attention passes the decoder states as
        ``query`` and the encoder output as ``key`` and ``value``.
    """

    alibi_slopes: Tensor

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        num_kv_heads: int | None = None,
        config: ModelConfig | None = None,
    ) -> None:
        super().__init__()
        check_int("d_model", d_model)
        check_int("num_heads", num_heads)
        if d_model % num_heads != 0:
            raise ValueError(
                f"d_model={d_model} is not divisible by num_heads={num_heads}: each head needs "
                "d_model / num_heads features"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        config = _with_contract_keywords(resolve_config(config), bias=bias, num_kv_heads=num_kv_heads)
        self.config = config
        bias, positions, rotary_base = config.bias, config.positions, config.rotary_base
        num_kv_heads = num_heads if config.num_kv_heads is None else config.num_kv_heads
        check_int("num_kv_heads", num_kv_heads)
        if num_heads % num_kv_heads != 0:
            raise ValueError(f"num_heads={num_heads} is not divisible by num_kv_heads={num_kv_heads}: each "
                             "key/value head serves a group of num_heads / num_kv_heads query heads")
        if positions not in POSITION_SCHEMES:
            raise ValueError(f"positions must be one of {POSITION_SCHEMES}, got {positions!r}")
        self.d_model = d_model
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.d_head = d_model // num_heads
        if positions == "rotary" and self.d_head % 2 != 0:
            raise ValueError(f"positions='rotary' needs an even d_head (features rotate in pairs), got "
                             f"d_head={self.d_head}")
        self.positions = positions
        self.rotary_base = float(rotary_base)
        self.rotary_pairing = config.rotary_pairing
        self.dropout = float(dropout)
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, num_kv_heads * self.d_head, bias=bias)
        self.w_v = nn.Linear(d_model, num_kv_heads * self.d_head, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)
        # A buffer: it follows .to(device) but is not trained (ALiBi's slopes are fixed).
        self.register_buffer("alibi_slopes", alibi_slopes(num_heads), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform projection weights and zero biases.

        Each projection gets std ``√(2 / (fan_in + fan_out))``, ``√(1/d_model)`` for the square ones. This is
        *larger* than ``nn.MultiheadAttention``'s init: it applies Xavier to the stacked ``(3d, d)`` input
        projection (std ``√(1/(2d))``, so ours is √2 ≈ 1.4x larger) and leaves the output projection at
        ``nn.Linear``'s default (std ``1/√(3d)``, ours √3 ≈ 1.7x larger). :meth:`from_torch` copies weights,
        so equivalence tests do not depend on the init.
        """
        for linear in (self.w_q, self.w_k, self.w_v, self.w_o):
            nn.init.xavier_uniform_(linear.weight)
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)

    def split_heads(self, x: Tensor) -> Tensor:
        """``(B, L, heads * d_head) -> (B, heads, L, d_head)``: head ``i`` gets features ``i*d_head:(i+1)*d_head``.

        ``heads`` is ``num_heads`` for queries and ``num_kv_heads`` for keys and values (the same unless the
        layer uses grouped-query attention).
        """
        batch, length, features = x.shape
        return x.view(batch, length, features // self.d_head, self.d_head).transpose(1, 2)

    def merge_heads(self, x: Tensor) -> Tensor:
        """``(B, H, L, d_head) -> (B, L, d_model)``: the inverse of :meth:`split_heads` (concatenate heads)."""
        batch, _, length, _ = x.shape
        return x.transpose(1, 2).reshape(batch, length, self.d_model)

    def _check_inputs(self, query: Tensor, key: Tensor, value: Tensor) -> None:
        for name, tensor in (("query", query), ("key", key), ("value", value)):
            if tensor.dim() != 3 or tensor.size(-1) != self.d_model:
                raise ValueError(
                    f"{name} must have shape (batch, length, d_model={self.d_model}), got {tuple(tensor.shape)}"
                )
        if not query.size(0) == key.size(0) == value.size(0):
            raise ValueError(
                f"query, key and value must have the same batch size, got shapes {tuple(query.shape)}, "
                f"{tuple(key.shape)} and {tuple(value.shape)}"
            )
        if key.size(1) != value.size(1):
            raise ValueError(
                f"key and value must have the same length, got shapes {tuple(key.shape)} and {tuple(value.shape)}"
            )

    def project_kv(self, key: Tensor, value: Tensor, positions: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Per-head keys and values, ``(B, Lk, d_model)`` -> ``(B, Hkv, Lk, d_head)`` each.

        With ``positions="rotary"`` the keys are rotated by ``positions`` (default ``arange(Lk)``); these are
        what a KV cache stores, and what :meth:`attend` takes.
        """
        keys = self.split_heads(self.w_k(key))  # (B, Hkv, Lk, d_head)
        values = self.split_heads(self.w_v(value))  # (B, Hkv, Lk, d_head)
        if self.positions == "rotary":
            keys = apply_rotary(keys, positions, self.rotary_base, self.rotary_pairing)
        return keys, values

    def attend(
        self,
        query: Tensor,
        keys: Tensor,
        values: Tensor,
        mask: Tensor | None = None,
        query_positions: Tensor | None = None,
        key_positions: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Attend from ``query (B, Lq, d_model)`` to precomputed per-head ``keys``/``values`` ``(B, Hkv, Lk, d_head)``.

        Args:
            query: ``(B, Lq, d_model)``, projected here.
            keys, values: from :meth:`project_kv` (or a :class:`~attention_course.KVCache`).
            mask: bool, broadcastable to ``(B, H, Lq, Lk)``, True = may attend; of rank 2 or 4 (a rank-3
                mask is refused, see :meth:`forward`).
            query_positions: ``(Lq,)`` positions of the queries (rotary and ALiBi); default ``arange(Lq)``.
            key_positions: ``(Lk,)`` positions of the keys (ALiBi); default ``arange(Lk)``.

        Returns:
            ``(output (B, Lq, d_model), weights (B, H, Lq, Lk))``.
        """
        if query.dim() != 3 or query.size(-1) != self.d_model:
            raise ValueError(f"query must have shape (batch, length, d_model={self.d_model}), got "
                             f"{tuple(query.shape)}")
        expected = (query.size(0), self.num_kv_heads, self.d_head)
        for name, tensor in (("keys", keys), ("values", values)):
            if tensor.dim() != 4 or (tensor.size(0), tensor.size(1), tensor.size(3)) != expected:
                raise ValueError(f"{name} must have shape (batch={expected[0]}, kv_heads={expected[1]}, length, "
                                 f"d_head={expected[2]}), got {tuple(tensor.shape)}")
        _refuse_rank3_mask(mask, query.size(0), self.num_heads)
        q = self.split_heads(self.w_q(query))  # (B, H, Lq, d_head)
        if query_positions is None:
            query_positions = torch.arange(query.size(1), device=query.device)
        bias = None
        if self.positions == "rotary":
            q = apply_rotary(q, query_positions, self.rotary_base, self.rotary_pairing)
        elif self.positions == "alibi":
            if key_positions is None:
                key_positions = torch.arange(keys.size(2), device=query.device)
            bias = alibi_bias_at(self.alibi_slopes, query_positions, key_positions).to(q.dtype)  # (H, Lq, Lk)
        dropout_p = self.dropout if self.training else 0.0
        heads, weights = grouped_query_attention(q, keys, values, mask=mask, dropout_p=dropout_p, bias=bias)
        return self.w_o(self.merge_heads(heads)), weights  # (B, Lq, d_model), (B, H, Lq, Lk)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Attend from ``query`` to ``key``/``value``.

        Args:
            query: ``(B, Lq, d_model)``.
            key: ``(B, Lk, d_model)``.
            value: ``(B, Lk, d_model)``.
            mask: optional bool tensor broadcastable to ``(B, H, Lq, Lk)``, True = may attend; e.g. a
                causal mask ``(Lq, Lk)`` or a padding mask ``(B, 1, 1, Lk)``. A mask of rank 3 is refused with a
                ``ValueError``: broadcasting would read ``(B, Lq, Lk)`` as one mask per *head*, which is right
                only when B happens to equal H. Write ``mask[:, None]`` ``(B, 1, Lq, Lk)`` for one mask per
                batch item, or ``mask[None]`` ``(1, H, Lq, Lk)`` for one per head.
            cache: a :class:`~attention_course.KVCache` for causal self-attention, one token (or a few) at a
                time: ``query``, ``key`` and ``value`` are the *new* positions ``p .. p + t - 1`` (``p =
                cache.position``); their keys and values are appended to the cache and the queries attend to
                everything the cache holds. With ``mask=None`` the mask is built here: causal, and limited to
                the cache's window if it has one. A given mask must broadcast to ``(B, H, t, len(keys))``.

        Returns:
            ``(output, weights)``: ``(B, Lq, d_model)`` and the per-head weights ``(B, H, Lq, Lk)`` (with a
            cache, ``Lk`` counts the cached positions too).
        """
        self._check_inputs(query, key, value)
        if cache is None:
            keys, values = self.project_kv(key, value)  # (B, Hkv, Lk, d_head)
            return self.attend(query, keys, values, mask)
        if not isinstance(cache, KVCache):
            raise TypeError(f"cache must be an attention_course.KVCache, got {type(cache).__name__}")
        if query.size(1) != key.size(1):
            raise ValueError(f"with a cache, query, key and value are the same new positions (self-attention), "
                             f"got query length {query.size(1)} and key length {key.size(1)}")
        new = query.size(1)
        query_positions = torch.arange(cache.position, cache.position + new, device=query.device)  # (t,)
        keys, values = cache.append(*self.project_kv(key, value, query_positions))  # (B, Hkv, Lk, d_head)
        key_positions = torch.arange(cache.position - keys.size(2), cache.position, device=query.device)
        if mask is None:
            windows = [w for w in (cache.window, self.config.window) if w is not None]
            allowed = window_mask(query_positions, key_positions, min(windows) if windows else None)  # (t, Lk)
            mask = None if bool(allowed.all()) else allowed
        return self.attend(query, keys, values, mask, query_positions, key_positions)

    @classmethod
    def from_torch(cls, module: nn.MultiheadAttention) -> MultiHeadAttention:
        """Build a :class:`MultiHeadAttention` equal to ``module`` (same weights, dropout, dtype and device).

        ``nn.MultiheadAttention`` stores W^Q, W^K, W^V stacked in one ``in_proj_weight`` of shape
        ``(3 d_model, d_model)``; they are split into ``w_q``, ``w_k``, ``w_v``. ``batch_first`` only changes
        the layout of ``module``'s inputs, not its weights, so either value works. Remember that
        ``module``'s masks use True = blocked while this class uses True = may attend.

        Raises:
            TypeError: ``module`` is not an ``nn.MultiheadAttention``.
            ValueError: ``module`` has ``kdim``/``vdim`` different from ``embed_dim``, ``add_bias_kv`` or
                ``add_zero_attn``, which this class does not implement.
        """
        if not isinstance(module, nn.MultiheadAttention):
            raise TypeError(f"expected an nn.MultiheadAttention, got {type(module).__name__}")
        d_model = module.embed_dim
        if module.kdim != d_model or module.vdim != d_model:
            raise ValueError(
                f"only kdim == vdim == embed_dim is supported, got embed_dim={d_model}, kdim={module.kdim}, "
                f"vdim={module.vdim}"
            )
        if module.bias_k is not None or module.add_zero_attn:
            raise ValueError("add_bias_kv=True and add_zero_attn=True are not supported")
        bias = module.in_proj_bias is not None
        weight = module.in_proj_weight
        new = cls(d_model, module.num_heads, dropout=module.dropout, config=ModelConfig(bias=bias)).to(
            device=weight.device, dtype=weight.dtype
        )
        with torch.no_grad():
            for linear, w in zip((new.w_q, new.w_k, new.w_v), weight.chunk(3, dim=0)):
                linear.weight.copy_(w)
            new.w_o.weight.copy_(module.out_proj.weight)
            if bias:
                for linear, b in zip((new.w_q, new.w_k, new.w_v), module.in_proj_bias.chunk(3, dim=0)):
                    linear.bias.copy_(b)
                new.w_o.bias.copy_(module.out_proj.bias)
        new.train(module.training)
        return new

    def extra_repr(self) -> str:
        text = f"d_model={self.d_model}, num_heads={self.num_heads}, d_head={self.d_head}, dropout={self.dropout}"
        if self.num_kv_heads != self.num_heads:
            text += f", num_kv_heads={self.num_kv_heads}"
        return text + (f", positions={self.positions!r}" if self.positions is not None else "")
