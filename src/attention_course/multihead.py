"""Multi-head attention (Vaswani et al. 2017, §3.2.2).

    head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)        each head works in d_head = d_model / h dimensions
    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O

The h per-head projections are stored as one ``(d_model, d_model)`` linear layer each for queries, keys and
values; :meth:`MultiHeadAttention.split_heads` reshapes their output so that all heads run in one batched
matrix product, and :meth:`MultiHeadAttention.merge_heads` concatenates the heads again.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attention_course.attention import scaled_dot_product_attention

__all__ = ["MultiHeadAttention"]


class MultiHeadAttention(nn.Module):
    """Multi-head attention with separate query, key, value and output projections.

    Args:
        d_model: model width (features per token); must be divisible by ``num_heads``.
        num_heads: number of heads h; each head has ``d_head = d_model // num_heads`` features.
        dropout: dropout probability on the attention weights (as in ``nn.MultiheadAttention``), active in
            training mode only.
        bias: whether the four projections have a bias.

    Attributes:
        w_q: the query projection, ``nn.Linear(d_model, d_model)``. Row-vector convention:
            ``Q = query @ w_q.weight.T + w_q.bias``.
        w_k: the key projection, ``nn.Linear(d_model, d_model)``.
        w_v: the value projection, ``nn.Linear(d_model, d_model)``.
        w_o: the output projection applied to the merged heads, ``nn.Linear(d_model, d_model)``.

    Shapes (B = batch, Lq = query length, Lk = key/value length):
        ``forward(query (B, Lq, d_model), key (B, Lk, d_model), value (B, Lk, d_model), mask)`` returns
        ``output (B, Lq, d_model)`` and the per-head attention weights ``(B, H, Lq, Lk)``.
        Self-attention passes the same tensor three times; cross-attention passes the decoder states as
        ``query`` and the encoder output as ``key`` and ``value``.
    """

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0, bias: bool = True) -> None:
        super().__init__()
        for name, value in (("d_model", d_model), ("num_heads", num_heads)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if d_model % num_heads != 0:
            raise ValueError(
                f"d_model={d_model} is not divisible by num_heads={num_heads}: each head needs "
                "d_model / num_heads features"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_head = d_model // num_heads
        self.dropout = float(dropout)
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform projection weights and zero biases, close to ``nn.MultiheadAttention``'s init."""
        for linear in (self.w_q, self.w_k, self.w_v, self.w_o):
            nn.init.xavier_uniform_(linear.weight)
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)

    def split_heads(self, x: Tensor) -> Tensor:
        """``(B, L, d_model) -> (B, H, L, d_head)``: head ``i`` gets features ``i*d_head:(i+1)*d_head``."""
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, self.d_head).transpose(1, 2)

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

    def forward(self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Attend from ``query`` to ``key``/``value``.

        Args:
            query: ``(B, Lq, d_model)``.
            key: ``(B, Lk, d_model)``.
            value: ``(B, Lk, d_model)``.
            mask: optional bool tensor broadcastable to ``(B, H, Lq, Lk)``, True = may attend; e.g. a
                causal mask ``(Lq, Lk)`` or a padding mask ``(B, 1, 1, Lk)``.

        Returns:
            ``(output, weights)``: ``(B, Lq, d_model)`` and the per-head weights ``(B, H, Lq, Lk)``.
        """
        self._check_inputs(query, key, value)
        q = self.split_heads(self.w_q(query))  # (B, H, Lq, d_head)
        k = self.split_heads(self.w_k(key))  # (B, H, Lk, d_head)
        v = self.split_heads(self.w_v(value))  # (B, H, Lk, d_head)
        dropout_p = self.dropout if self.training else 0.0
        heads, weights = scaled_dot_product_attention(q, k, v, mask=mask, dropout_p=dropout_p)
        output = self.w_o(self.merge_heads(heads))  # (B, Lq, d_model)
        return output, weights

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
        new = cls(d_model, module.num_heads, dropout=module.dropout, bias=bias).to(
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
        return f"d_model={self.d_model}, num_heads={self.num_heads}, d_head={self.d_head}, dropout={self.dropout}"
