"""What attention heads learn: capture, score and ablate heads (chapter 16).

Elhage et al. (2021) read small attention-only Transformers as sums of paths through their heads; Olsson et
al. (2022) showed that a two-layer model forms *induction heads*, which find the earlier occurrence of the
current token and copy the token that followed it, at the moment in training when its in-context learning
jumps. This module holds the tools chapter 16 uses to see that in the course's own models:

- :class:`AttentionOnlyLM`: token and position embeddings, then blocks of causal self-attention only (no
  feed-forward network, no LayerNorm), read by an unembedding. Every computation is a sum of head paths.
- :func:`repeated_random_tokens`: sequences whose second half repeats the first; nothing but the context
  predicts the second half. :func:`train_on_repeats` trains a model on them.
- :func:`capture_attention`: a context manager that records every head's attention weights from any model
  built from :class:`~attention_course.MultiHeadAttention` (the encoder-decoder and the decoder-only model
  alike) through forward hooks, leaving the outputs unchanged.
- :func:`ablate_heads`: a context manager that zeroes heads' outputs, or replaces them by their mean over a
  reference batch, before the output projection.
- :func:`previous_token_score`, :func:`induction_score`: how much of a head's attention goes to the previous
  token, and to the token after the earlier occurrence of the current one.
- :func:`composition_scores`: Elhage et al.'s Q-, K- and V-composition between the heads of two layers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention_course.checks import check_int
from attention_course.masks import causal_mask
from attention_course.multihead import MultiHeadAttention
from attention_course.runtime import fused_adam

__all__ = [
    "AttentionCapture",
    "AttentionOnlyBlock",
    "AttentionOnlyLM",
    "RepeatsLog",
    "ablate_heads",
    "attention_modules",
    "capture_attention",
    "composition_scores",
    "in_context_learning_score",
    "induction_score",
    "per_position_loss",
    "previous_token_score",
    "repeated_half_loss",
    "repeated_random_tokens",
    "train_on_repeats",
]

ABLATION_MODES = ("zero", "mean")
COMPOSITION_KINDS = ("q", "k", "v")


# ---------------------------------------------------------------------------------------------------------
# An attention-only language model
# ---------------------------------------------------------------------------------------------------------
class AttentionOnlyBlock(nn.Module):
    """One block of an attention-only model: ``x + SelfAttention(x)`` with a causal mask, nothing else.

    No LayerNorm and no feed-forward network, as in Elhage et al.'s attention-only models: each head reads
    the residual stream and adds what it writes to it, so the model is a sum of paths through heads.

    Attributes:
        self_attention: the block's :class:`~attention_course.MultiHeadAttention`.

    Shape: ``forward(x (B, L, d_model), mask) -> (B, L, d_model)``; ``mask`` broadcastable to ``(B, H, L, L)``,
    True = may attend; None means causal.
    """

    def __init__(self, d_model: int, num_heads: int, positions: str | None = None) -> None:
        super().__init__()
        self.self_attention = MultiHeadAttention(d_model, num_heads, positions=positions)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        if mask is None:
            mask = causal_mask(x.size(1), device=x.device)  # (L, L)
        attended, _ = self.self_attention(x, x, x, mask=mask)
        return x + attended


class AttentionOnlyLM(nn.Module):
    """A decoder-only language model made of attention alone: embeddings, attention blocks, an unembedding.

    Args:
        vocab_size: number of tokens V.
        d_model: width of the residual stream.
        num_heads: heads per layer.
        num_layers: attention layers (1 or 2 in chapter 16).
        max_len: the longest sequence (positions have learned vectors).

    Attributes:
        blocks: the :class:`AttentionOnlyBlock` layers; ``blocks[i].self_attention`` is layer ``i``'s attention.

    Shape: ``forward(tokens (B, L)) -> logits (B, L, V)``, position ``t`` predicting token ``t + 1``.
    """

    def __init__(self, vocab_size: int, d_model: int = 64, num_heads: int = 4, num_layers: int = 2,
                 max_len: int = 64, positions: str = "learned") -> None:
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("d_model", d_model), ("num_heads", num_heads),
                            ("num_layers", num_layers), ("max_len", max_len)):
            check_int(name, value)
        self.vocab_size, self.d_model, self.max_len = vocab_size, d_model, max_len
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        if positions not in ("learned", "rotary"):
            raise ValueError(f"positions must be 'learned' or 'rotary', got {positions!r}")
        self.positions = positions
        # Unit-size positions, as large as the tokens: a previous-token head needs to see positions from the
        # first step (GPT-2's small 0.02 init makes them drown in the tokens for hundreds of steps).
        self.position_embedding = nn.Embedding(max_len, d_model) if positions == "learned" else None
        rotary = "rotary" if positions == "rotary" else None
        self.blocks = nn.ModuleList(AttentionOnlyBlock(d_model, num_heads, rotary) for _ in range(num_layers))
        self.unembed = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, tokens: Tensor) -> Tensor:
        if not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.dtype != torch.long:
            got = f"{tuple(tokens.shape)} {tokens.dtype}" if isinstance(tokens, Tensor) else type(tokens).__name__
            raise ValueError(f"tokens must be a (batch, length) int64 tensor, got {got}")
        if tokens.size(1) > self.max_len:
            raise ValueError(f"sequence length {tokens.size(1)} exceeds max_len={self.max_len}")
        x = self.token_embedding(tokens)  # (B, L, d_model)
        if self.position_embedding is not None:
            x = x + self.position_embedding(torch.arange(tokens.size(1), device=tokens.device))
        mask = causal_mask(tokens.size(1), device=tokens.device)
        for block in self.blocks:
            x = block(x, mask)
        return self.unembed(x)  # (B, L, V)


# ---------------------------------------------------------------------------------------------------------
# The repeated-tokens task
# ---------------------------------------------------------------------------------------------------------
def repeated_random_tokens(batch_size: int, half_length: int, vocab_size: int,
                           generator: torch.Generator | None = None) -> Tensor:
    """Sequences of ``half_length`` uniformly random tokens followed by the same tokens again.

    Returns:
        ``(batch_size, 2 * half_length)`` int64; ``tokens[:, half_length:]`` equals ``tokens[:, :half_length]``.
        The first half is ``torch.randint(vocab_size, (batch_size, half_length), generator=generator)``.
    """
    for name, value in (("batch_size", batch_size), ("half_length", half_length), ("vocab_size", vocab_size)):
        check_int(name, value)
    first = torch.randint(vocab_size, (batch_size, half_length), generator=generator)
    return torch.cat([first, first], dim=1)


def per_position_loss(logits: Tensor, tokens: Tensor) -> Tensor:
    """Next-token cross-entropy at every position, averaged over the batch: ``(B, L, V), (B, L) -> (L - 1,)``.

    Entry ``t`` is the loss of predicting ``tokens[:, t + 1]`` from position ``t``.
    """
    if logits.dim() != 3 or tokens.dim() != 2 or logits.shape[:2] != tokens.shape:
        raise ValueError(f"logits must be (B, L, V) and tokens (B, L) with the same B and L; got "
                         f"{tuple(logits.shape)} and {tuple(tokens.shape)}")
    losses = F.cross_entropy(logits[:, :-1].transpose(1, 2).float(), tokens[:, 1:], reduction="none")  # (B, L-1)
    return losses.mean(dim=0)


def repeated_half_loss(logits: Tensor, tokens: Tensor) -> Tensor:
    """Mean loss on the repeated half of :func:`repeated_random_tokens` sequences (a scalar tensor).

    With half length n, positions ``n .. 2n - 2`` predict tokens ``n + 1 .. 2n - 1``, each a copy of the
    token ``n`` places earlier, whose predecessor the current token repeats. (Token ``n`` itself, the first
    repeated one, is left out: nothing tells the model where the repeat starts.)
    """
    if tokens.dim() != 2 or tokens.size(1) % 2 != 0 or tokens.size(1) < 4:
        raise ValueError(f"tokens must be (B, 2n) repeated sequences with n >= 2, got {tuple(tokens.shape)}")
    half = tokens.size(1) // 2
    return per_position_loss(logits, tokens)[half:].mean()


def in_context_learning_score(losses: Tensor, early: int, late: int) -> float:
    """Olsson et al.'s in-context learning score: the loss at a late token minus the loss at an early one.

    Args:
        losses: ``(L - 1,)`` per-position losses (:func:`per_position_loss`).
        early, late: the two positions (``early < late``).

    Returns:
        ``losses[late] - losses[early]`` (negative when the model predicts better with more context).
    """
    if losses.dim() != 1:
        raise ValueError(f"losses must be 1-D (one loss per position), got {tuple(losses.shape)}")
    if not 0 <= early < late < losses.numel():
        raise ValueError(f"need 0 <= early < late < {losses.numel()}, got early={early}, late={late}")
    return float(losses[late] - losses[early])


@dataclass
class RepeatsLog:
    """What :func:`train_on_repeats` records: the loss on the repeated half and on the first half at each
    step (nats per token), and the wall-clock seconds of training."""

    repeated: list[float] = field(default_factory=list)
    first_half: list[float] = field(default_factory=list)
    seconds: float = 0.0


def train_on_repeats(model: nn.Module, steps: int, vocab_size: int, half_lengths: tuple[int, int],
                     batch_size: int = 32, lr: float = 1e-3, generator: torch.Generator | None = None,
                     progress: Callable | None = None) -> RepeatsLog:
    """Train ``model`` with Adam on :func:`repeated_random_tokens`, the loss over every position.

    Each step draws one half length n uniformly from ``half_lengths`` (inclusive) for the whole batch. A fixed
    n would let a single layer solve the task by position alone (attend n - 1 places back); a varying n leaves
    the context as the only way to know what comes next.

    Args:
        model: maps ``(B, L)`` tokens to ``(B, L, V)`` logits (already on its device).
        steps: optimisation steps.
        vocab_size: tokens are drawn from ``0 .. vocab_size - 1``.
        half_lengths: ``(shortest, longest)`` half length; ``2 * longest`` must fit the model.
        batch_size, lr: sequences per step and Adam's learning rate.
        generator: the random source of the data (a CPU generator).
        progress: wraps the step range (e.g. ``tqdm``).
    """
    check_int("steps", steps)
    shortest, longest = half_lengths
    check_int("half_lengths[0]", shortest, minimum=2)
    check_int("half_lengths[1]", longest, minimum=shortest)
    device = next(model.parameters()).device
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, fused=fused_adam(device))
    log = RepeatsLog()
    model.train()
    start = time.perf_counter()
    step_range = range(steps)
    for _ in progress(step_range) if progress is not None else step_range:
        half = int(torch.randint(shortest, longest + 1, (), generator=generator))
        tokens = repeated_random_tokens(batch_size, half, vocab_size, generator).to(device)  # (B, 2n)
        losses = per_position_loss(model(tokens), tokens)  # (2n - 1,)
        optimizer.zero_grad(set_to_none=True)
        losses.mean().backward()
        optimizer.step()
        log.repeated.append(float(losses[half:].mean().detach()))
        log.first_half.append(float(losses[: half - 1].mean().detach()))
    log.seconds = time.perf_counter() - start
    return log


# ---------------------------------------------------------------------------------------------------------
# Capturing attention weights
# ---------------------------------------------------------------------------------------------------------
def attention_modules(model: nn.Module) -> list[tuple[str, MultiHeadAttention]]:
    """Every :class:`~attention_course.MultiHeadAttention` inside ``model``, in registration order, by name.

    For :class:`AttentionOnlyLM` and :class:`~attention_course.DecoderOnlyLM` entry ``i`` is layer ``i``'s
    self-attention; for the encoder-decoder :class:`~attention_course.Transformer` the encoder's layers come
    first, then each decoder layer's self-attention and cross-attention.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    found = [(name, module) for name, module in model.named_modules() if isinstance(module, MultiHeadAttention)]
    if not found:
        raise ValueError(f"{type(model).__name__} contains no attention_course.MultiHeadAttention")
    return found


class AttentionCapture:
    """The attention weights that :func:`capture_attention` recorded, one entry per attention module.

    Index it by position in :func:`attention_modules` (``capture[0]``: the first layer) or by module name
    (``capture["blocks.1.self_attention"]``); each entry is the ``(B, H, Lq, Lk)`` weights of that module's
    most recent call, detached. :meth:`stack` gives all of them as one ``(layers, B, H, L, L)`` tensor.
    """

    def __init__(self, names: Sequence[str]) -> None:
        self.names = list(names)
        self.weights: dict[str, Tensor] = {}

    def _name(self, layer: int | str) -> str:
        if isinstance(layer, str):
            if layer not in self.names:
                raise KeyError(f"no attention module named {layer!r}; the model has {self.names}")
            return layer
        if isinstance(layer, bool) or not isinstance(layer, int) or not -len(self.names) <= layer < len(self.names):
            raise KeyError(f"layer must be a module name or an index below {len(self.names)}, got {layer!r}")
        return self.names[layer]

    def __getitem__(self, layer: int | str) -> Tensor:
        name = self._name(layer)
        if name not in self.weights:
            raise KeyError(f"{name!r} has not run since the capture started: call the model first")
        return self.weights[name]

    def __len__(self) -> int:
        return len(self.names)

    def stack(self) -> Tensor:
        """All captured weights as one ``(layers, B, H, Lq, Lk)`` tensor (every module must have run, with the
        same shapes: a decoder-only or attention-only model)."""
        tensors = [self[i] for i in range(len(self.names))]
        shapes = {tuple(t.shape) for t in tensors}
        if len(shapes) != 1:
            raise ValueError(f"the captured weights have different shapes {sorted(shapes)}; index them one by one")
        return torch.stack(tensors)


@contextmanager
def capture_attention(model: nn.Module) -> Iterator[AttentionCapture]:
    """Record every attention module's weights while the ``with`` block runs; outputs are unchanged.

    A forward hook on each :class:`~attention_course.MultiHeadAttention` (which returns ``(output, weights)``)
    keeps a detached copy of the weights of its latest call. The hooks are removed on leaving the block, even
    after an error.

    Example:
        >>> with capture_attention(model) as attention:
        ...     model(tokens)
        >>> attention[1].shape                                    # layer 1: (B, H, L, L)
    """
    modules = attention_modules(model)
    capture = AttentionCapture([name for name, _ in modules])
    handles = []

    def recorder(name: str) -> Callable:
        def hook(module: nn.Module, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
            capture.weights[name] = output[1].detach()

        return hook

    try:
        for name, module in modules:
            handles.append(module.register_forward_hook(recorder(name)))
        yield capture
    finally:
        for handle in handles:
            handle.remove()


# ---------------------------------------------------------------------------------------------------------
# Ablating heads
# ---------------------------------------------------------------------------------------------------------
def _output_projection(module: MultiHeadAttention) -> nn.Linear:
    projection = getattr(module, "w_o", None)
    if not isinstance(projection, nn.Linear):
        raise TypeError("ablate_heads needs the attention module's output projection w_o (an nn.Linear applied "
                        "to the concatenated heads)")
    return projection


def _resolve_heads(model: nn.Module, heads: Mapping[int | str, Sequence[int]]
                   ) -> list[tuple[str, MultiHeadAttention, list[int]]]:
    if not isinstance(heads, Mapping):
        raise TypeError(f"heads must be a mapping {{layer: [head, ...]}}, got {type(heads).__name__}")
    modules = attention_modules(model)
    by_name = dict(modules)
    chosen = []
    for layer, indices in heads.items():
        if isinstance(layer, str):
            if layer not in by_name:
                raise ValueError(f"no attention module named {layer!r}; the model has {list(by_name)}")
            name = layer
        elif isinstance(layer, int) and not isinstance(layer, bool) and 0 <= layer < len(modules):
            name = modules[layer][0]
        else:
            raise ValueError(f"layer {layer!r} is not an index in 0..{len(modules) - 1} or a module name")
        module = by_name[name]
        indices = [indices] if isinstance(indices, int) else list(indices)
        for head in indices:
            if isinstance(head, bool) or not isinstance(head, int) or not 0 <= head < module.num_heads:
                raise ValueError(f"head {head!r} of layer {layer!r} is not in 0..{module.num_heads - 1}")
        _output_projection(module)
        chosen.append((name, module, sorted(set(indices))))
    return chosen


@torch.no_grad()
def _mean_head_outputs(model: nn.Module, modules: list[MultiHeadAttention],
                       reference: Tensor | tuple) -> list[Tensor]:
    """Each module's per-head output, averaged over the reference batch and its positions: ``(H, d_head)``."""
    sums: dict[int, Tensor] = {}
    counts: dict[int, int] = {}

    def summer(index: int, module: MultiHeadAttention) -> Callable:
        def hook(projection: nn.Module, inputs: tuple[Tensor]) -> None:
            heads = inputs[0].reshape(-1, module.num_heads, module.d_head).double()  # (B*L, H, d_head)
            sums[index] = sums.get(index, 0) + heads.sum(dim=0)
            counts[index] = counts.get(index, 0) + heads.size(0)

        return hook

    handles = [_output_projection(m).register_forward_pre_hook(summer(i, m)) for i, m in enumerate(modules)]
    was_training = model.training
    model.eval()
    try:
        model(*reference) if isinstance(reference, tuple) else model(reference)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    if len(sums) != len(modules):
        raise ValueError("the reference batch did not run every ablated module; pass inputs that reach them")
    return [sums[i] / counts[i] for i in range(len(modules))]


@contextmanager
def ablate_heads(model: nn.Module, heads: Mapping[int | str, Sequence[int]], mode: str = "zero",
                 reference: Tensor | tuple | None = None) -> Iterator[None]:
    """Knock heads out while the ``with`` block runs.

    Each chosen head's output (its attention-weighted values, ``(B, L, d_head)``) is replaced before the output
    projection ``w_o`` mixes the heads: by zeros (``mode="zero"``: the head writes only ``w_o``'s bias) or by
    its mean over ``reference`` (``mode="mean"``: the head writes what it writes on average, so the rest of
    the model still sees a typical input, only not this one's information). The other heads are untouched.

    Args:
        model: a model built from :class:`~attention_course.MultiHeadAttention`.
        heads: ``{layer: [head, ...]}``; a layer is an index in :func:`attention_modules` or a module name.
        mode: ``"zero"`` or ``"mean"``.
        reference: for ``mode="mean"``, the inputs whose mean head outputs are used (a tensor passed to
            ``model``, or a tuple of its positional arguments); the mean is over batch and positions.
    """
    if mode not in ABLATION_MODES:
        raise ValueError(f"mode must be one of {ABLATION_MODES}, got {mode!r}")
    if mode == "mean" and reference is None:
        raise ValueError("mode='mean' needs a reference batch to average each head's output over")
    if mode == "zero" and reference is not None:
        raise ValueError("reference is only used with mode='mean'")
    chosen = _resolve_heads(model, heads)
    means = _mean_head_outputs(model, [m for _, m, _ in chosen], reference) if mode == "mean" else None

    def replacer(index: int, module: MultiHeadAttention, indices: list[int]) -> Callable:
        def hook(projection: nn.Module, inputs: tuple[Tensor]) -> tuple[Tensor]:
            merged = inputs[0]  # (B, L, H * d_head), head h in features h*d_head .. (h+1)*d_head - 1
            per_head = merged.reshape(*merged.shape[:-1], module.num_heads, module.d_head).clone()
            for head in indices:
                if means is None:
                    per_head[..., head, :] = 0.0
                else:
                    per_head[..., head, :] = means[index][head].to(per_head.dtype)
            return (per_head.reshape(merged.shape),)

        return hook

    handles = []
    try:
        for index, (_, module, indices) in enumerate(chosen):
            handles.append(_output_projection(module).register_forward_pre_hook(replacer(index, module, indices)))
        yield
    finally:
        for handle in handles:
            handle.remove()


# ---------------------------------------------------------------------------------------------------------
# Scores
# ---------------------------------------------------------------------------------------------------------
def _check_weights(weights: object) -> None:
    if not isinstance(weights, Tensor) or not weights.is_floating_point():
        raise TypeError(f"weights must be a floating-point tensor, got {type(weights).__name__}"
                        + (f" of dtype {weights.dtype}" if isinstance(weights, Tensor) else ""))
    if weights.dim() != 4 or weights.size(-1) != weights.size(-2):
        raise ValueError(f"weights must have shape (batch, heads, L, L) (self-attention), got "
                         f"{tuple(weights.shape)}")
    if weights.size(-1) < 2:
        raise ValueError(f"weights need at least 2 positions to have a previous token, got L={weights.size(-1)}")


def previous_token_score(weights: Tensor) -> Tensor:
    """Each head's mean attention from position ``i`` to position ``i - 1``.

    Args:
        weights: ``(B, H, L, L)`` self-attention weights (rows sum to 1).

    Returns:
        ``(H,)``: the weight on the previous token, averaged over the batch and the queries ``1 .. L - 1``.
        1 for a head that always attends to the previous token; ``1/L`` on average for uniform weights.
    """
    _check_weights(weights)
    previous = weights.diagonal(offset=-1, dim1=-2, dim2=-1)  # (B, H, L - 1): weights[..., i, i - 1]
    return previous.mean(dim=(0, 2))


def induction_score(weights: Tensor, tokens: Tensor) -> Tensor:
    """Each head's mean attention from a repeated token to the token that followed its earlier occurrence.

    For query ``i`` whose token occurred before, at positions ``j < i``, the induction targets are the keys
    ``j + 1``: an induction head looks there to copy the token that came next last time. A query's score is
    its total weight on its targets; the head's score averages it over every query (in the batch) that has
    an earlier occurrence.

    Args:
        weights: ``(B, H, L, L)`` self-attention weights.
        tokens: ``(B, L)`` the token ids the weights were computed from.

    Returns:
        ``(H,)``: 1 for a perfect induction head; about ``1/L`` for uniform weights over ``L`` keys.

    Raises:
        ValueError: shapes that do not fit, or no token in ``tokens`` that occurs twice.
    """
    _check_weights(weights)
    if not isinstance(tokens, Tensor) or tokens.dtype not in (torch.int64, torch.int32) or tokens.dim() != 2:
        raise ValueError(f"tokens must be a (batch, L) integer tensor, got "
                         f"{tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__}")
    batch, _, length, _ = weights.shape
    if tuple(tokens.shape) != (batch, length):
        raise ValueError(f"tokens must have shape (batch={batch}, L={length}) to match weights "
                         f"{tuple(weights.shape)}, got {tuple(tokens.shape)}")
    tokens = tokens.to(weights.device)
    positions = torch.arange(length, device=weights.device)
    same = tokens[:, :, None] == tokens[:, None, :]  # (B, L, L): query i's token equals key j's
    earlier = same & (positions[None, :] < positions[:, None])  # (B, Lq, Lk): j < i
    targets = torch.zeros_like(earlier)
    targets[:, :, 1:] = earlier[:, :, :-1]  # key j + 1 is a target when key j is an earlier occurrence
    has_target = targets.any(dim=-1)  # (B, L)
    if not bool(has_target.any()):
        raise ValueError("no token occurs twice in tokens: the induction score needs repeated tokens")
    on_targets = (weights * targets[:, None].to(weights.dtype)).sum(dim=-1)  # (B, H, L)
    chosen = has_target[:, None].expand_as(on_targets)
    return (on_targets * chosen).sum(dim=(0, 2)) / has_target.sum()


def _per_head(linear: nn.Linear, heads: int, rows: bool) -> Tensor:
    """Per-head slices of a projection, as ``(heads, d_model, d_head)`` (rows=True: w_q/w_k/w_v, x @ W) or
    ``(heads, d_head, d_model)`` (rows=False: w_o)."""
    weight = linear.weight.detach()  # (out, in)
    if rows:
        d_head = weight.size(0) // heads
        return weight.view(heads, d_head, weight.size(1)).transpose(1, 2)  # (h, d_model, d_head)
    d_head = weight.size(1) // heads
    return weight.view(weight.size(0), heads, d_head).permute(1, 2, 0)  # (h, d_head, d_model)


def _circuits(module: MultiHeadAttention) -> tuple[Tensor, Tensor]:
    """Each head's QK matrix ``W_Q W_Kᵀ`` and OV matrix ``W_V W_O``, both ``(H, d_model, d_model)``.

    Row-vector convention: head h's score of query x_i and key x_j is ``x_i W_QK x_jᵀ``; it writes
    ``x_j W_OV`` (times its weight) for the key it attends to.
    """
    heads, groups = module.num_heads, module.num_heads // module.num_kv_heads
    w_q = _per_head(module.w_q, heads, rows=True)
    w_k = _per_head(module.w_k, module.num_kv_heads, rows=True).repeat_interleave(groups, dim=0)
    w_v = _per_head(module.w_v, module.num_kv_heads, rows=True).repeat_interleave(groups, dim=0)
    w_o = _per_head(module.w_o, heads, rows=False)
    return w_q @ w_k.transpose(1, 2), w_v @ w_o


def composition_scores(first: MultiHeadAttention, second: MultiHeadAttention, kind: str = "k") -> Tensor:
    """Elhage et al.'s composition scores between every head of an earlier layer and a later one.

    How much of head h2's (``second``) query, key or value input can come from what head h1 (``first``)
    writes: ``||M||_F / (||A||_F ||B||_F)`` with, in the row-vector convention,

    - K-composition: ``M = W_QK^{h2} (W_OV^{h1})ᵀ`` (h2's keys read h1's output),
    - Q-composition: ``M = W_OV^{h1} W_QK^{h2}`` (h2's queries read it),
    - V-composition: ``M = W_OV^{h1} W_OV^{h2}`` (h2's values read it).

    Biases are left out, as in the paper. Random matrices of width d score about ``1/√d``.

    Returns:
        ``(H2, H1)``: row h2 of ``second``, column h1 of ``first``.
    """
    if not isinstance(first, MultiHeadAttention) or not isinstance(second, MultiHeadAttention):
        raise TypeError("first and second must be attention_course.MultiHeadAttention modules")
    if first.d_model != second.d_model:
        raise ValueError(f"the two layers must share d_model, got {first.d_model} and {second.d_model}")
    if kind not in COMPOSITION_KINDS:
        raise ValueError(f"kind must be one of {COMPOSITION_KINDS}, got {kind!r}")
    qk1, ov1 = _circuits(first)  # (H1, d, d)
    qk2, ov2 = _circuits(second)  # (H2, d, d)
    a, b = (qk2, ov1) if kind in ("q", "k") else (ov2, ov1)
    if kind == "k":
        product = qk2[:, None] @ ov1[None].transpose(-2, -1)  # (H2, H1, d, d)
    elif kind == "q":
        product = ov1[None] @ qk2[:, None]
    else:
        product = ov1[None] @ ov2[:, None]
    norms = a.flatten(1).norm(dim=1)[:, None] * b.flatten(1).norm(dim=1)[None, :]  # (H2, H1)
    return product.flatten(2).norm(dim=2) / norms
