"""A decoder-only (GPT-style) language model built from the course's own pieces (chapter 13).

A decoder-only model is the Transformer's decoder without cross-attention: a stack of blocks, each
causal self-attention then a feed-forward network, read by one linear layer that predicts the next token
(Radford et al. 2018, 2019). Compared with chapter 10's decoder layer it drops the second sub-layer, and it
uses the pre-norm wiring of chapter 08 with a final LayerNorm, as GPT-2 does::

    x = token_embedding(ids) + position(0..L-1)
    for each block:  x = x + Dropout(SelfAttention(LayerNorm(x), causal mask))
                     x = x + Dropout(FFN(LayerNorm(x)))
    logits = LayerNorm(x) @ token_embedding.weightᵀ           (weight tying, Press & Wolf 2017)

One block computes the same function as ``nn.TransformerEncoderLayer(norm_first=True)`` given a causal mask
(:meth:`DecoderOnlyBlock.from_torch`). Training minimises :func:`next_token_loss`, the cross-entropy of
each position's prediction against the token that follows it. Generation (:meth:`DecoderOnlyLM.generate`)
samples one token at a time with :func:`~attention_course.sampling.sample_next_token`, and with
``use_cache=True`` feeds only the newest token through the stack, reading earlier keys and values from one
:class:`~attention_course.KVCache` per block (:func:`~attention_course.cached_self_attention`).

Also here: the unigram and bigram baselines a language model must beat (:func:`unigram_cross_entropy`,
:func:`bigram_cross_entropy`), the warm-up + cosine learning-rate schedule, random training windows,
the prefix mask of a decoder-only translator (:func:`prefix_causal_mask`), and a training loop with AdamW,
gradient clipping and (on a GPU) mixed precision (:func:`train_language_model`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention_course.checks import check_int
from attention_course.config import ModelConfig, resolve_config
from attention_course.cost import kv_cache_bytes
from attention_course.feedforward import feed_forward_for
from attention_course.incremental import cached_self_attention
from attention_course.kv_cache import KVCache
from attention_course.layers import EncoderLayer
from attention_course.masks import causal_mask, sliding_window_mask
from attention_course.multihead import MultiHeadAttention
from attention_course.normalization import Dropout, norm_for
from attention_course.positional import LearnedPositionalEmbedding, PositionalEncoding
from attention_course.runtime import autocast_dtype, fused_adam
from attention_course.sampling import sample_next_token

__all__ = [
    "DecoderOnlyBlock",
    "DecoderOnlyLM",
    "LMCache",
    "LMTrainingLog",
    "bigram_cross_entropy",
    "evaluate_lm",
    "next_token_loss",
    "prefix_causal_mask",
    "random_windows",
    "train_language_model",
    "unigram_cross_entropy",
    "warmup_cosine_lr",
]

POSITIONS = ("learned", "sinusoidal", "none")


def _check_tokens(tokens: object, name: str = "tokens") -> None:
    if not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.dtype != torch.long:
        got = f"{tuple(tokens.shape)} {tokens.dtype}" if isinstance(tokens, Tensor) else type(tokens).__name__
        raise ValueError(f"{name} must be a (batch, length) int64 tensor, got {got}")


def _default_mask(length: int, window: int | None, device: torch.device) -> Tensor:
    """The causal mask ``(L, L)``, or the sliding-window one when the config has a window."""
    return causal_mask(length, device=device) if window is None else sliding_window_mask(length, window, device)


# ---------------------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------------------
class DecoderOnlyBlock(nn.Module):
    """One pre-norm block: causal self-attention then a feed-forward network, each with a residual.

    Args:
        d_model: model width.
        num_heads: attention heads.
        d_ff: hidden width of the feed-forward network.
        dropout: dropout on the attention weights, the feed-forward hidden layer and both residual branches.
        config: a :class:`~attention_course.ModelConfig`: the attention options (for example
            ``num_kv_heads`` for grouped-query attention, chapter 15), the normalisation
            (LayerNorm or RMSNorm), the feed-forward network (ReLU, GELU or SwiGLU), biases, and a sliding
            window for the default mask. Default: the 2019 block (LayerNorm, ReLU, biases).

    Attributes:
        self_attention_weights: ``(B, H, L, L)`` weights of the last full forward call (detached), or None.

    Shape: ``forward(x (B, L, d_model), mask) -> (B, L, d_model)``; ``mask`` broadcastable to ``(B, H, L, L)``,
    True = may attend; None means the causal mask (limited to ``config.window`` keys back when set).
    """

    def __init__(
        self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.0,
        config: ModelConfig | None = None,
    ) -> None:
        super().__init__()
        config = resolve_config(config)
        self.config = config
        self.self_attention = MultiHeadAttention(d_model, num_heads, dropout=dropout, config=config)
        self.feed_forward = feed_forward_for(d_model, d_ff, dropout=dropout, config=config)
        self.norm1 = norm_for(d_model, config)
        self.norm2 = norm_for(d_model, config)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.self_attention_weights: Tensor | None = None

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """``x (B, L, d_model)`` -> ``(B, L, d_model)``."""
        if mask is None:
            mask = _default_mask(x.size(1), self.config.window, x.device)  # (L, L): i sees 0..i (or a window)
        h = self.norm1(x)
        attended, weights = self.self_attention(h, h, h, mask=mask)
        self.self_attention_weights = weights.detach()
        x = x + self.dropout1(attended)
        return x + self.dropout2(self.feed_forward(self.norm2(x)))

    def step(self, x: Tensor, cache: KVCache) -> Tensor:
        """The block on new positions only: ``x (B, t_new, d_model)`` -> ``(B, t_new, d_model)``.

        Keys and values of the new positions are appended to ``cache``; queries attend to every cached
        position and causally among the new ones, so the result equals the last ``t_new`` rows of
        :meth:`forward` on the whole sequence.
        """
        x = x + self.dropout1(cached_self_attention(self.self_attention, self.norm1(x), cache))
        return x + self.dropout2(self.feed_forward(self.norm2(x)))

    @classmethod
    def from_torch(cls, module: nn.TransformerEncoderLayer) -> DecoderOnlyBlock:
        """A block computing the same function as ``module`` (which must have ``norm_first=True``).

        PyTorch has no decoder-only layer: its encoder layer, given a causal mask, is one.
        """
        if not isinstance(module, nn.TransformerEncoderLayer):
            raise TypeError(f"expected an nn.TransformerEncoderLayer, got {type(module).__name__}")
        if not module.norm_first:
            raise ValueError("a decoder-only block is pre-norm: build the PyTorch layer with norm_first=True")
        layer = EncoderLayer.from_torch(module)  # copies and checks weights, eps, dropout
        new = cls(layer.self_attention.d_model, layer.self_attention.num_heads,
                  module.linear1.out_features, dropout=module.dropout.p)
        new.self_attention, new.feed_forward = layer.self_attention, layer.feed_forward
        new.norm1, new.norm2 = layer.norm1, layer.norm2
        new.dropout1, new.dropout2 = layer.dropout1, layer.dropout2
        return new.to(device=module.linear1.weight.device).train(module.training)


@dataclass
class LMCache:
    """What generation with a KV cache keeps: one :class:`~attention_course.KVCache` per block and
    the number of positions already processed (where the next token's position starts)."""

    layers: list[KVCache]
    position: int = 0

    def num_bytes(self) -> int:
        """Bytes held by the cached keys and values (measured from the tensors)."""
        return sum(t.numel() * t.element_size() for c in self.layers for t in (c.keys, c.values) if t is not None)


class DecoderOnlyLM(nn.Module):
    """A GPT-style language model: embeddings, a stack of :class:`DecoderOnlyBlock`, a final LayerNorm and a
    (tied) output layer.

    Args:
        vocab_size: number of tokens V.
        d_model: model width.
        num_heads: attention heads per block.
        num_layers: number of blocks.
        d_ff: feed-forward hidden width (default ``4 * d_model``, as in GPT).
        max_len: the longest sequence (context window) the model accepts.
        dropout: dropout everywhere (embeddings, attention weights, residual branches, feed-forward).
        positions: ``"learned"`` (GPT), ``"sinusoidal"`` (chapter 07), or ``"none"`` (for attention that
            encodes positions itself, chapter 14).
        tie_weights: share the output layer's weight with the token embedding (saves ``V * d_model``
            parameters).
        config: a :class:`~attention_course.ModelConfig` for every block, the final normalisation and the
            initialisation: rotary or ALiBi attention (with ``positions="none"`` here), grouped-query heads
            (``num_kv_heads``, chapter 15), RMSNorm, GELU or SwiGLU, bias-free projections, GPT-2's scaled
            initialisation, a sliding window.

    Attributes:
        config: the resolved :class:`~attention_course.ModelConfig`.

    Shapes: ``forward(tokens (B, L), mask=None) -> logits (B, L, V)``; ``mask`` broadcastable to
    ``(B, H, L, L)`` (None: causal).
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 128,
        num_heads: int = 4,
        num_layers: int = 4,
        d_ff: int | None = None,
        max_len: int = 256,
        dropout: float = 0.0,
        positions: str = "learned",
        tie_weights: bool = True,
        config: ModelConfig | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("d_model", d_model), ("num_heads", num_heads),
                            ("num_layers", num_layers), ("max_len", max_len)):
            check_int(name, value)
        if positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}, got {positions!r}")
        d_ff = 4 * d_model if d_ff is None else d_ff
        check_int("d_ff", d_ff)
        config = resolve_config(config)
        self.config = config
        self.vocab_size, self.d_model, self.max_len, self.positions = vocab_size, d_model, max_len, positions
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.token_embedding.weight, std=0.02)  # GPT-2's initialisation
        if positions == "learned":
            self.position = LearnedPositionalEmbedding(max_len, d_model, dropout=dropout)
        elif positions == "sinusoidal":
            self.position = PositionalEncoding(d_model, max_len=max_len, dropout=dropout)
        else:
            self.position = Dropout(dropout)
        self.blocks = nn.ModuleList(
            DecoderOnlyBlock(d_model, num_heads, d_ff, dropout, config=config) for _ in range(num_layers)
        )
        self.norm = norm_for(d_model, config)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        if tie_weights:
            self.lm_head.weight = self.token_embedding.weight  # one (V, d_model) matrix, used twice
        if config.init == "gpt2":
            self.gpt2_init_()

    def gpt2_init_(self) -> None:
        """GPT-2's initialisation: every linear weight and the token embedding ``N(0, 0.02²)`` (GPT's range),
        biases zero, and the two projections of each block that add into the residual stream (attention
        ``w_o``, the feed-forward's last layer) ``N(0, (0.02 / √(2·num_layers))²)``. Radford et al. (2019,
        §2.3) scale "the weights of residual layers" by ``1/√N`` for ``N`` residual layers; Hugging Face's
        GPT-2 and nanoGPT count two per block, as here.

        Each block adds two such terms to the residual stream; with independent terms the stream's variance
        grows by their sum, so shrinking their std by ``√(2·num_layers)`` keeps the output's variance at
        initialisation independent of depth.
        """
        residual_std = 0.02 / math.sqrt(2 * len(self.blocks))
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear):
                    nn.init.normal_(module.weight, std=0.02)
                    if module.bias is not None:
                        nn.init.zeros_(module.bias)
            nn.init.normal_(self.token_embedding.weight, std=0.02)
            for block in self.blocks:
                nn.init.normal_(block.self_attention.w_o.weight, std=residual_std)
                nn.init.normal_(block.feed_forward.output_projection.weight, std=residual_std)

    @property
    def tied(self) -> bool:
        """Whether the output layer and the token embedding share one weight."""
        return self.lm_head.weight is self.token_embedding.weight

    def embed(self, tokens: Tensor, offset: int = 0) -> Tensor:
        """Token embeddings plus the positions ``offset .. offset + L - 1``: ``(B, L)`` -> ``(B, L, d_model)``."""
        if offset + tokens.size(1) > self.max_len:
            raise ValueError(f"positions up to {offset + tokens.size(1)} exceed max_len={self.max_len}")
        x = self.token_embedding(tokens)
        if self.positions == "none":
            return self.position(x)
        return self.position(x, offset=offset)

    def forward(self, tokens: Tensor, mask: Tensor | None = None) -> Tensor:
        """Next-token logits at every position: ``tokens (B, L)`` -> ``(B, L, V)``."""
        _check_tokens(tokens)
        x = self.embed(tokens)
        if mask is None:
            mask = _default_mask(tokens.size(1), self.config.window, tokens.device)
        for block in self.blocks:
            x = block(x, mask)
        return self.lm_head(self.norm(x))

    # --- generation ---------------------------------------------------------------------------------------
    def new_cache(self) -> LMCache:
        """An empty :class:`LMCache` with one KV cache per block."""
        return LMCache([KVCache(window=self.config.window) for _ in self.blocks])  # rolling with a window

    def step(self, tokens: Tensor, cache: LMCache) -> Tensor:
        """Logits for new tokens only, reusing the cached keys and values of earlier ones.

        Args:
            tokens: ``(B, t_new)`` the next tokens (a whole prompt the first time, then one at a time).
            cache: the :class:`LMCache` of this sequence so far; updated in place.

        Returns:
            ``(B, t_new, V)``, equal to the last ``t_new`` rows of ``forward(all tokens so far)``.
        """
        _check_tokens(tokens)
        x = self.embed(tokens, offset=cache.position)  # positions continue where the cache stops
        for block, layer_cache in zip(self.blocks, cache.layers):
            x = block.step(x, layer_cache)
        cache.position += tokens.size(1)
        return self.lm_head(self.norm(x))

    def kv_cache_bytes(self, batch: int, length: int, dtype: torch.dtype = torch.float32) -> int:
        """Memory of a full KV cache by formula (:func:`attention_course.cost.kv_cache_bytes`):
        ``2 (K and V) · layers · kv_heads · d_head · length · batch · bytes per value``."""
        attention = self.blocks[0].self_attention
        kv_heads = getattr(attention, "num_kv_heads", None) or attention.num_heads
        return kv_cache_bytes(len(self.blocks), kv_heads, attention.d_head, length, batch,
                              bytes_per_value=torch.empty((), dtype=dtype).element_size())

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        use_cache: bool = True,
        generator: torch.Generator | None = None,
        eos_id: int | None = None,
    ) -> Tensor:
        """Continue ``prompt_ids`` by ``max_new_tokens`` sampled tokens.

        Each new token is drawn with :func:`~attention_course.sampling.sample_next_token` from the logits
        of the last position. With ``use_cache`` the prompt goes through the model once and each later step
        feeds only the newest token (:meth:`step`); without it, every step re-runs the whole sequence. Both
        draw the same tokens for the same ``generator`` state. Call ``model.eval()`` first.

        Args:
            prompt_ids: ``(B, Lp)`` or ``(Lp,)`` token ids, ``Lp >= 1``.
            max_new_tokens: how many tokens to add (``Lp + max_new_tokens <= max_len``).
            temperature, top_k, top_p: passed to :func:`~attention_course.sampling.sample_next_token`
                (``temperature=0``: greedy).
            use_cache: feed only new tokens, with a key-value cache.
            generator: the random source of the samples.
            eos_id: if given, stop once every row has produced it (later tokens of finished rows are eos).

        Returns:
            ``(B, Lp + n)`` (or ``(Lp + n,)`` for a 1-D prompt) with ``n <= max_new_tokens``.
        """
        squeeze = isinstance(prompt_ids, Tensor) and prompt_ids.dim() == 1
        tokens = prompt_ids.unsqueeze(0) if squeeze else prompt_ids
        _check_tokens(tokens, "prompt_ids")
        if tokens.size(1) < 1:
            raise ValueError("prompt_ids must hold at least one token")
        check_int("max_new_tokens", max_new_tokens, minimum=0)
        if tokens.size(1) + max_new_tokens > self.max_len:
            raise ValueError(f"prompt length {tokens.size(1)} + max_new_tokens {max_new_tokens} exceeds "
                             f"max_len={self.max_len}")
        cache = self.new_cache() if use_cache else None
        finished = torch.zeros(tokens.size(0), dtype=torch.bool, device=tokens.device)
        new = tokens
        for _ in range(max_new_tokens):
            logits = self.step(new, cache) if cache is not None else self(tokens)  # (B, t, V)
            next_token = sample_next_token(logits[:, -1], temperature, top_k, top_p, generator)  # (B,)
            if eos_id is not None:
                next_token = next_token.masked_fill(finished, eos_id)
                finished |= next_token == eos_id
            new = next_token[:, None]
            tokens = torch.cat([tokens, new], dim=1)
            if eos_id is not None and bool(finished.all()):
                break
        return tokens[0] if squeeze else tokens


# ---------------------------------------------------------------------------------------------------------
# Loss, masks and baselines
# ---------------------------------------------------------------------------------------------------------
def next_token_loss(logits: Tensor, tokens: Tensor, ignore_index: int | None = None) -> Tensor:
    """Mean cross-entropy (nats per token) of predicting token ``t + 1`` from position ``t``.

    Position ``t``'s logits are compared with ``tokens[:, t + 1]``; the last position has nothing to predict.
    Targets equal to ``ignore_index`` (padding) are left out of the mean.

    Args:
        logits: ``(B, L, V)``.
        tokens: ``(B, L)`` the same sequences the logits were computed from (or a copy of them in which the
            targets to ignore are set to ``ignore_index``).
        ignore_index: a token id whose targets do not count.
    """
    if logits.dim() != 3 or tokens.dim() != 2 or logits.shape[:2] != tokens.shape:
        raise ValueError(f"logits must be (B, L, V) and tokens (B, L) with the same B, L; got "
                         f"{tuple(logits.shape)} and {tuple(tokens.shape)}")
    predictions = logits[:, :-1]  # (B, L-1, V): positions 0 .. L-2
    targets = tokens[:, 1:]  # (B, L-1): the token after each of them
    return F.cross_entropy(predictions.reshape(-1, logits.size(-1)).float(), targets.reshape(-1),
                           ignore_index=-100 if ignore_index is None else ignore_index)


def prefix_causal_mask(prefix_lengths: Tensor, length: int) -> Tensor:
    """Prefix-LM mask: every position sees the whole prefix, and after it, the positions up to itself.

    Args:
        prefix_lengths: ``(B,)`` how many leading positions of each row form its prefix (the source and the
            separator in decoder-only translation).
        length: the sequence length L.

    Returns:
        ``(B, 1, L, L)`` bool, True = may attend: ``key <= query or key < prefix_length``.
    """
    if prefix_lengths.dim() != 1:
        raise ValueError(f"prefix_lengths must be (batch,), got {tuple(prefix_lengths.shape)}")
    positions = torch.arange(length, device=prefix_lengths.device)
    causal = positions[None, :] <= positions[:, None]  # (L, L)
    in_prefix = positions[None, None, :] < prefix_lengths[:, None, None]  # (B, 1, L): key is in the prefix
    return (causal[None] | in_prefix)[:, None]  # (B, 1, L, L)


def unigram_cross_entropy(train_ids: Tensor, eval_ids: Tensor, vocab_size: int, alpha: float = 1.0) -> float:
    """Nats per token on ``eval_ids`` of the unigram model of ``train_ids`` (token frequencies, add-alpha).

    A model that ignores context entirely: every position gets the same distribution.
    """
    counts = torch.bincount(train_ids.flatten(), minlength=vocab_size).double() + alpha
    log_probs = (counts / counts.sum()).log()
    return float(-log_probs[eval_ids.flatten()].mean())


def bigram_cross_entropy(train_ids: Tensor, eval_ids: Tensor, vocab_size: int, alpha: float = 0.1) -> float:
    """Nats per token on ``eval_ids`` (from its second token) of the bigram model of ``train_ids``.

    ``p(b | a) = (count(a, b) + alpha) / (count(a) + alpha · V)``: a model that sees one token of context.
    """
    train_ids, eval_ids = train_ids.flatten(), eval_ids.flatten()
    pairs = train_ids[:-1] * vocab_size + train_ids[1:]
    counts = torch.bincount(pairs, minlength=vocab_size * vocab_size).double().view(vocab_size, vocab_size)
    log_probs = ((counts + alpha) / (counts.sum(dim=1, keepdim=True) + alpha * vocab_size)).log()
    return float(-log_probs[eval_ids[:-1], eval_ids[1:]].mean())


# ---------------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------------
def warmup_cosine_lr(step: int, warmup: int, total: int, peak: float, final_ratio: float = 0.1) -> float:
    """Learning rate at ``step`` (1-based): linear warm-up to ``peak`` over ``warmup`` steps, then a cosine
    decay to ``final_ratio * peak`` at ``total`` steps (and that value after)."""
    if step <= warmup:
        return peak * step / max(warmup, 1)
    progress = min(1.0, (step - warmup) / max(total - warmup, 1))
    return peak * (final_ratio + (1 - final_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def random_windows(ids: Tensor, batch_size: int, length: int, generator: torch.Generator | None = None) -> Tensor:
    """``batch_size`` random windows of ``length + 1`` consecutive tokens from the 1-D ``ids``: ``(B, length+1)``.

    The extra token is the target of the last position.
    """
    if ids.dim() != 1 or ids.numel() <= length + 1:
        raise ValueError(f"ids must be 1-D and longer than length + 1 = {length + 1}, got {tuple(ids.shape)}")
    starts = torch.randint(0, ids.numel() - length - 1, (batch_size,), generator=generator)
    return torch.stack([ids[s : s + length + 1] for s in starts.tolist()])


@torch.no_grad()
def evaluate_lm(model: DecoderOnlyLM, ids: Tensor, length: int, batch_size: int = 32,
                max_windows: int | None = None) -> float:
    """Mean next-token loss (nats per token) of ``model`` on consecutive, non-overlapping windows of ``ids``."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    num_windows = (ids.numel() - 1) // length
    if max_windows is not None:
        num_windows = min(num_windows, max_windows)
    if num_windows < 1:
        raise ValueError(f"ids has {ids.numel()} tokens, too few for one window of {length + 1}")
    windows = torch.stack([ids[i * length : i * length + length + 1] for i in range(num_windows)])
    total, count = 0.0, 0
    for start in range(0, num_windows, batch_size):
        batch = windows[start : start + batch_size].to(device)
        logits = model(batch)
        total += float(next_token_loss(logits, batch)) * batch.size(0) * length
        count += batch.size(0) * length
    model.train(was_training)
    return total / count


@dataclass
class LMTrainingLog:
    """What :func:`train_language_model` records: the loss and learning rate of each step, the
    ``(step, validation loss)`` pairs, the wall-clock seconds and the autocast dtype used (None on CPU)."""

    losses: list[float] = field(default_factory=list)
    learning_rates: list[float] = field(default_factory=list)
    valid: list[tuple[int, float]] = field(default_factory=list)
    seconds: float = 0.0
    amp_dtype: torch.dtype | None = None


def train_language_model(
    model: DecoderOnlyLM,
    train_ids: Tensor,
    steps: int,
    batch_size: int = 32,
    length: int = 64,
    lr: float = 3e-3,
    warmup: int = 50,
    weight_decay: float = 0.1,
    clip: float = 1.0,
    generator: torch.Generator | None = None,
    valid_ids: Tensor | None = None,
    eval_every: int = 0,
    progress: Callable | None = None,
) -> LMTrainingLog:
    """Train with AdamW, a warm-up + cosine schedule, gradient clipping and, on a GPU, mixed precision.

    Each step draws :func:`random_windows` of ``length + 1`` tokens, computes :func:`next_token_loss`, and
    updates. Weight decay applies to matrices only (not to biases, LayerNorm gains or positions' 1-D
    parameters), as in GPT-2. On CUDA the forward pass runs under ``torch.autocast`` in bfloat16 where the GPU
    runs it natively, in float16 with a gradient scaler on older GPUs
    (``attention_course.runtime.autocast_dtype``); on a CPU everything stays float32.

    Args:
        model: the model (already on its device).
        train_ids: 1-D token ids.
        steps: optimisation steps.
        batch_size, length: windows per step and their length.
        lr, warmup, weight_decay, clip: peak learning rate, warm-up steps, AdamW's decoupled weight decay,
            the largest gradient norm.
        generator: the random source of the windows.
        valid_ids, eval_every: if both are given, record :func:`evaluate_lm` every ``eval_every`` steps.
        progress: wraps the step range (e.g. ``tqdm``).

    Returns:
        An :class:`LMTrainingLog`.
    """
    check_int("steps", steps)
    device = next(model.parameters()).device
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95),
                                  fused=fused_adam(device))
    amp_dtype = autocast_dtype(device)  # bfloat16 only where the GPU runs it natively; None on a CPU
    scaler = torch.amp.GradScaler("cuda", enabled=amp_dtype == torch.float16)
    log = LMTrainingLog(amp_dtype=amp_dtype)
    train_ids = train_ids.to(device)
    model.train()
    start = time.perf_counter()
    step_range = range(1, steps + 1)
    for step in progress(step_range) if progress is not None else step_range:
        for group in optimizer.param_groups:
            group["lr"] = warmup_cosine_lr(step, warmup, steps, lr)
        batch = random_windows(train_ids, batch_size, length, generator)  # (B, length + 1)
        with torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
            loss = next_token_loss(model(batch), batch)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        scaler.step(optimizer)
        scaler.update()
        log.losses.append(loss.item())
        log.learning_rates.append(optimizer.param_groups[0]["lr"])
        if valid_ids is not None and eval_every and (step % eval_every == 0 or step == steps):
            log.valid.append((step, evaluate_lm(model, valid_ids, length)))
            model.train()
    log.seconds = time.perf_counter() - start
    return log
