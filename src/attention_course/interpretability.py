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

Then the methods that say which component *causes* an output (as in ARENA and TransformerLens), for the
attention-only model and :class:`~attention_course.DecoderOnlyLM` in every configuration (GPT-2's LayerNorm and
learned positions; Llama's RMSNorm, SwiGLU, rotary positions and grouped-query heads), through forward hooks
on the models' own modules:

- :func:`run_with_cache`: one forward pass with every activation kept (:class:`ActivationCache`): the residual
  stream before, between and after each block's sublayers, every head's pattern and its output as its own
  contribution to the stream, every MLP's output, the final norm's input.
- :func:`direct_logit_attribution`: each head's, MLP's and embedding's direct share of a logit difference,
  through the final norm frozen at its scale (:class:`LogitAttribution`); :func:`logit_lens`: the prediction
  read from the stream after every block.
- :func:`patch`: activation patching (a residual-stream position, a head's output, an attention pattern);
  :func:`path_patch`: one head's output seen only by one later head's queries, keys or values.
- :func:`copying_score`, :func:`copying_fraction`: Olsson et al.'s OV-circuit test of whether a head copies;
  :func:`prefix_matching_score` is :func:`induction_score` under Olsson et al.'s name.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention_course.checks import check_int
from attention_course.config import ModelConfig
from attention_course.language_model import DecoderOnlyLM
from attention_course.masks import causal_mask
from attention_course.multihead import MultiHeadAttention
from attention_course.normalization import LayerNorm, RMSNorm
from attention_course.runtime import fused_adam

__all__ = [
    "AttentionCapture",
    "AttentionOnlyBlock",
    "AttentionOnlyLM",
    "RepeatsLog",
    "ActivationCache",
    "LogitAttribution",
    "ablate_heads",
    "attention_modules",
    "capture_attention",
    "composition_scores",
    "copying_fraction",
    "copying_score",
    "direct_logit_attribution",
    "in_context_learning_score",
    "induction_score",
    "logit_lens",
    "patch",
    "path_patch",
    "per_position_loss",
    "prefix_matching_score",
    "previous_token_score",
    "repeated_half_loss",
    "repeated_random_tokens",
    "run_with_cache",
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
        self.self_attention = MultiHeadAttention(d_model, num_heads, config=ModelConfig(positions=positions))

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

    This is Olsson et al.'s (2022) *prefix-matching score* (attention to the key whose previous token
    matches the query's token), also available as :func:`prefix_matching_score`.

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


# Olsson et al. (2022) call the induction score above the *prefix-matching score*: attention from a token to
# the token after its earlier occurrences (the key whose previous token matches the query). One function, two
# names, so that the chapter can use the paper's word without a second copy of the algorithm.
prefix_matching_score = induction_score


# ---------------------------------------------------------------------------------------------------------
# Which component causes an output: a cached forward pass
# ---------------------------------------------------------------------------------------------------------
# Everything below works on the course's two decoder-only families through forward hooks on their own modules
# (the models' code paths are unchanged): the attention-only toy and DecoderOnlyLM in any configuration
# (LayerNorm or RMSNorm, ReLU/GELU/SwiGLU, learned, sinusoidal, rotary or ALiBi positions, grouped-query heads,
# tied or untied output). The hooks read, and where asked replace, five things:
#
#   block input and output          resid_pre[l], resid_post[l]            (B, L, d_model)
#   the attention's input and mask  attn_in[l] (after norm1), masks[l]
#   the heads before w_o mixes them z[l]                                   (B, H, L, d_head)
#   values (for pattern patching)   w_v's output                           (B, L, Hkv * d_head)
#   the feed-forward output         mlp_out[l]                             (B, L, d_model)
PATCH_SITES = ("resid_pre", "resid_post", "mlp_out", "head", "pattern")
PATH_INPUTS = ("q", "k", "v")
_Edit = Callable[[Tensor, dict], Tensor]


@dataclass
class _Layout:
    """The parts of a model that play the same roles in both families (None where a family has no such part)."""

    embedding: nn.Embedding
    blocks: list[nn.Module]
    attentions: list[MultiHeadAttention]
    pre_norms: list[nn.Module | None]  # applied to the stream before attention (norm1), or None
    mid_norms: list[nn.Module] | None  # norm2: its input is resid_mid
    mlps: list[nn.Module] | None
    final_norm: nn.Module | None
    unembed: nn.Linear

    @property
    def num_layers(self) -> int:
        return len(self.blocks)


def _layout(model: object) -> _Layout:
    if isinstance(model, AttentionOnlyLM):
        blocks = list(model.blocks)
        return _Layout(model.token_embedding, blocks, [b.self_attention for b in blocks], [None] * len(blocks),
                       None, None, None, model.unembed)
    if isinstance(model, DecoderOnlyLM):
        blocks = list(model.blocks)
        return _Layout(model.token_embedding, blocks, [b.self_attention for b in blocks], [b.norm1 for b in blocks],
                       [b.norm2 for b in blocks], [b.feed_forward for b in blocks], model.norm, model.lm_head)
    raise TypeError(f"model must be an AttentionOnlyLM or a DecoderOnlyLM, got {type(model).__name__}")


def _norm_kind(norm: nn.Module) -> tuple[str, float]:
    """``("layernorm" | "rmsnorm", eps)`` of a final or pre-attention normalisation."""
    if isinstance(norm, LayerNorm):
        return "layernorm", norm.eps
    if isinstance(norm, RMSNorm):
        return "rmsnorm", norm.eps
    raise TypeError(f"unsupported normalisation {type(norm).__name__}: expected the course's LayerNorm or RMSNorm")


def _check_tokens(name: str, tokens: object) -> Tensor:
    if not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.dtype != torch.long:
        got = f"{tuple(tokens.shape)} {tokens.dtype}" if isinstance(tokens, Tensor) else type(tokens).__name__
        raise ValueError(f"{name} must be a (batch, length) int64 tensor, got {got}")
    return tokens


def _check_pair(clean_tokens: object, corrupted_tokens: object) -> None:
    _check_tokens("clean_tokens", clean_tokens)
    _check_tokens("corrupted_tokens", corrupted_tokens)
    if clean_tokens.shape != corrupted_tokens.shape:
        raise ValueError(f"clean_tokens {tuple(clean_tokens.shape)} and corrupted_tokens "
                         f"{tuple(corrupted_tokens.shape)} must have the same shape: patching moves activations "
                         "between the two runs position by position")


def _check_index(name: str, value: object, size: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if not 0 <= value < size:
        raise ValueError(f"{name} must be in 0..{size - 1}, got {value}")
    return value


@contextmanager
def _evaluating(model: nn.Module) -> Iterator[None]:
    """Eval mode (no dropout) and no gradients while inside; the model's mode is restored afterwards."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


@dataclass
class ActivationCache:
    """Every activation of one forward pass that the causal methods read (detached, from eval mode).

    ``B`` batch, ``L`` positions, ``H`` heads, ``d`` = ``d_model``; lists hold one entry per layer ``l``.
    The residual stream is a sum of what each part writes into it::

        resid_pre[0] = embed + pos_embed
        resid_mid[l] = resid_pre[l] + attn_out[l],      attn_out[l] = head_out[l].sum(heads) + attn_bias[l]
        resid_post[l] = resid_mid[l] + mlp_out[l]       (attention-only: resid_post[l] = resid_pre[l] + attn_out[l])
        resid_pre[l + 1] = resid_post[l],               final_in = resid_post[-1]

    Attributes:
        tokens: ``(B, L)`` the input.
        embed: ``(B, L, d)`` token embeddings.
        pos_embed: ``(B, L, d)`` what the positions add to them (zeros for rotary, ALiBi or no positions).
        resid_pre: ``(B, L, d)`` the stream entering block ``l``.
        resid_post: ``(B, L, d)`` the stream leaving block ``l``.
        resid_mid: ``(B, L, d)`` between attention and feed-forward network (None for an attention-only model).
        attn_in: ``(B, L, d)`` what attention reads: ``norm1(resid_pre[l])`` (the stream itself without a norm).
        pattern: ``(B, H, L, L)`` attention weights, queries on rows.
        z: ``(B, H, L, d_head)`` each head's attention-weighted values, before ``w_o`` mixes the heads.
        head_out: ``(B, H, L, d)`` each head's contribution to the stream, ``z[:, h] @ W_O[h]`` with
            ``W_O[h] = w_o.weight[:, h*d_head:(h+1)*d_head].T`` (the per-head split of the output projection).
        attn_bias: ``(d,)`` the output projection's bias, which belongs to no head (zeros without one).
        attn_out: ``(B, L, d)`` the attention sublayer's output.
        mlp_out: ``(B, L, d)`` the feed-forward network's output (None for an attention-only model).
        final_in: ``(B, L, d)`` the final norm's input (the unembedding's, without a final norm).
        masks: the boolean mask each layer's attention used (True = may attend).

    ``cache["pattern", 1]`` is ``cache.pattern[1]``; ``cache["final_in"]`` is ``cache.final_in``.
    """

    tokens: Tensor
    embed: Tensor
    pos_embed: Tensor
    resid_pre: list[Tensor]
    attn_in: list[Tensor]
    pattern: list[Tensor]
    z: list[Tensor]
    head_out: list[Tensor]
    attn_bias: list[Tensor]
    attn_out: list[Tensor]
    resid_mid: list[Tensor] | None
    mlp_out: list[Tensor] | None
    resid_post: list[Tensor]
    final_in: Tensor
    masks: list[Tensor | None]

    @property
    def num_layers(self) -> int:
        return len(self.resid_pre)

    def __getitem__(self, key: str | tuple[str, int]) -> Tensor:
        name, layer = (key, None) if isinstance(key, str) else key
        names = [f.name for f in fields(self)]
        if name not in names:
            raise KeyError(f"no activation named {name!r}; the cache holds {names}")
        value = getattr(self, name)
        if value is None:
            raise KeyError(f"this model has no {name!r} (an attention-only model has no feed-forward network)")
        return value if layer is None else value[layer]


def _run(model: nn.Module, tokens: Tensor, edits: Mapping[tuple[str, int], list[_Edit]] | None = None
         ) -> tuple[Tensor, dict[str, dict[int, Tensor]]]:
    """``model(tokens)`` in eval mode with hooks that record (and, for keys in ``edits``, replace) activations.

    ``edits[(kind, layer)]`` is a list of functions ``(value, recorded) -> new value`` applied in turn, for
    ``kind`` in ``resid_pre``, ``resid_post``, ``z``, ``mlp_out``; ``recorded`` holds what this run has
    recorded so far (``recorded["v"][l]``: layer l's values). Returns the logits and the recordings.
    """
    lay = _layout(model)
    edits = dict(edits or {})
    recorded: dict[str, dict[int, Tensor]] = {}

    def keep(kind: str, layer: int, value: Tensor) -> Tensor | None:
        """Record ``value`` after any edits; return the new value, or None when nothing was edited."""
        new = value
        for edit in edits.get((kind, layer), []):
            new = edit(new, recorded)
        recorded.setdefault(kind, {})[layer] = new
        return None if new is value else new

    def block_in(layer: int) -> Callable:
        def hook(module: nn.Module, args: tuple) -> tuple | None:
            new = keep("resid_pre", layer, args[0])
            return None if new is None else (new, *args[1:])
        return hook

    def block_out(layer: int) -> Callable:
        return lambda module, args, output: keep("resid_post", layer, output)

    def attention_in(layer: int) -> Callable:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            recorded.setdefault("attn_in", {})[layer] = args[0]
            recorded.setdefault("masks", {})[layer] = kwargs.get("mask", args[3] if len(args) > 3 else None)
        return hook

    def attention_out(layer: int) -> Callable:
        def hook(module: nn.Module, args: tuple, output: tuple[Tensor, Tensor]) -> None:
            recorded.setdefault("attn_out", {})[layer] = output[0]
            recorded.setdefault("pattern", {})[layer] = output[1]
        return hook

    def values(layer: int, attention: MultiHeadAttention) -> Callable:
        def hook(module: nn.Module, args: tuple, output: Tensor) -> None:
            recorded.setdefault("v", {})[layer] = attention.split_heads(output)  # (B, Hkv, L, d_head)
        return hook

    def heads(layer: int, attention: MultiHeadAttention) -> Callable:
        def hook(module: nn.Module, args: tuple) -> tuple | None:
            merged = args[0]  # (B, L, H * d_head)
            z = merged.unflatten(-1, (attention.num_heads, attention.d_head)).transpose(1, 2)  # (B, H, L, d_head)
            new = keep("z", layer, z)
            return None if new is None else (attention.merge_heads(new),)
        return hook

    def feed_forward(layer: int) -> Callable:
        return lambda module, args, output: keep("mlp_out", layer, output)

    def record(kind: str, layer: int = 0) -> Callable:
        def hook(module: nn.Module, args: tuple) -> None:
            recorded.setdefault(kind, {})[layer] = args[0]
        return hook

    def embedding(module: nn.Module, args: tuple, output: Tensor) -> None:
        recorded["embed"] = {0: output}

    final = lay.final_norm if lay.final_norm is not None else lay.unembed  # its input is final_in
    handles = [lay.embedding.register_forward_hook(embedding), final.register_forward_pre_hook(record("final_in"))]
    for layer, (block, attention) in enumerate(zip(lay.blocks, lay.attentions)):
        handles += [block.register_forward_pre_hook(block_in(layer)),
                    block.register_forward_hook(block_out(layer)),
                    attention.register_forward_pre_hook(attention_in(layer), with_kwargs=True),
                    attention.register_forward_hook(attention_out(layer)),
                    attention.w_v.register_forward_hook(values(layer, attention)),
                    attention.w_o.register_forward_pre_hook(heads(layer, attention))]
        if lay.mlps is not None:
            handles += [lay.mlps[layer].register_forward_hook(feed_forward(layer)),
                        lay.mid_norms[layer].register_forward_pre_hook(record("resid_mid", layer))]
    try:
        with _evaluating(model):
            logits = model(tokens)
    finally:
        for handle in handles:
            handle.remove()
    return logits, recorded


def run_with_cache(model: nn.Module, tokens: Tensor) -> tuple[Tensor, ActivationCache]:
    """Run ``model`` on ``tokens`` and keep every activation that says what each part wrote.

    The model runs in eval mode (no dropout) without gradients, through its own ``forward``; forward hooks on
    its modules record the activations, so the logits are the model's own.

    Args:
        model: an :class:`AttentionOnlyLM` or a :class:`~attention_course.DecoderOnlyLM`.
        tokens: ``(B, L)`` int64 token ids.

    Returns:
        ``(logits (B, L, V), cache)``: the :class:`ActivationCache` of the run.
    """
    lay = _layout(model)
    _check_tokens("tokens", tokens)
    logits, rec = _run(model, tokens)
    per_layer = {kind: [rec[kind][layer] for layer in range(lay.num_layers)]
                 for kind in ("resid_pre", "resid_post", "attn_in", "masks", "attn_out", "pattern", "z")}
    head_out, attn_bias = [], []
    for z, attention in zip(per_layer["z"], lay.attentions):
        w_o = _per_head(attention.w_o, attention.num_heads, rows=False)  # (H, d_head, d)
        head_out.append(torch.einsum("bhld,hdm->bhlm", z, w_o.to(z.dtype)))  # (B, H, L, d)
        bias = attention.w_o.bias
        attn_bias.append(torch.zeros(attention.d_model, dtype=z.dtype, device=z.device) if bias is None
                         else bias.detach().to(z.dtype))
    has_mlp = lay.mlps is not None
    embed = rec["embed"][0]
    cache = ActivationCache(
        tokens=tokens, embed=embed, pos_embed=per_layer["resid_pre"][0] - embed,
        resid_pre=per_layer["resid_pre"], attn_in=per_layer["attn_in"], pattern=per_layer["pattern"],
        z=per_layer["z"], head_out=head_out, attn_bias=attn_bias, attn_out=per_layer["attn_out"],
        resid_mid=[rec["resid_mid"][layer] for layer in range(lay.num_layers)] if has_mlp else None,
        mlp_out=[rec["mlp_out"][layer] for layer in range(lay.num_layers)] if has_mlp else None,
        resid_post=per_layer["resid_post"], final_in=rec["final_in"][0], masks=per_layer["masks"])
    return logits, cache


# ---------------------------------------------------------------------------------------------------------
# Direct logit attribution and the logit lens
# ---------------------------------------------------------------------------------------------------------
@dataclass
class LogitAttribution:
    """Each part's direct contribution to a logit difference (:func:`direct_logit_attribution`); ``B`` batch.

    Attributes:
        embed: ``(B,)`` the token embedding's.
        pos_embed: ``(B,)`` the position embedding's (zero for rotary, ALiBi or no positions).
        heads: ``(B, layers, H)`` each head's.
        attn_bias: ``(B, layers)`` each attention output bias's.
        mlps: ``(B, layers)`` each feed-forward network's (None for an attention-only model).
        norm_bias: ``(B,)`` the constant term: the final LayerNorm's bias (zero for RMSNorm or no norm).
        logit_diff: ``(B,)`` the model's actual ``logit[answer] - logit[wrong]``; :meth:`total` equals it.
    """

    embed: Tensor
    pos_embed: Tensor
    heads: Tensor
    attn_bias: Tensor
    mlps: Tensor | None
    norm_bias: Tensor
    logit_diff: Tensor

    def total(self) -> Tensor:
        """``(B,)`` the sum of every part (equal to ``logit_diff`` up to rounding)."""
        parts = self.embed + self.pos_embed + self.heads.sum(dim=(1, 2)) + self.attn_bias.sum(dim=1) + self.norm_bias
        return parts if self.mlps is None else parts + self.mlps.sum(dim=1)


def _token_ids(name: str, value: object, batch: int, vocab: int, device: torch.device) -> Tensor:
    """An int or a ``(B,)`` integer tensor of token ids -> ``(B,)`` int64."""
    if isinstance(value, bool) or not isinstance(value, (int, Tensor)):
        raise TypeError(f"{name} must be an int or a (batch,) integer tensor, got {type(value).__name__}")
    ids = torch.full((batch,), value, dtype=torch.long) if isinstance(value, int) else value
    if ids.is_floating_point() or ids.dtype == torch.bool or tuple(ids.shape) != (batch,):
        raise ValueError(f"{name} must be an int or a (batch={batch},) integer tensor, got "
                         f"{tuple(ids.shape)} {ids.dtype}")
    if bool(((ids < 0) | (ids >= vocab)).any()):
        raise ValueError(f"{name} holds token ids outside 0..{vocab - 1}: {ids.tolist()}")
    return ids.long().to(device)


def _read_positions(position: object, batch: int, length: int, device: torch.device) -> Tensor:
    """None (the last position), an int or a ``(B,)`` integer tensor -> ``(B,)`` int64 in ``0 .. L - 1``."""
    if position is None:
        position = length - 1
    if isinstance(position, bool) or not isinstance(position, (int, Tensor)):
        raise TypeError(f"position must be None, an int or a (batch,) integer tensor, got {type(position).__name__}")
    ids = torch.full((batch,), position, dtype=torch.long) if isinstance(position, int) else position
    if ids.is_floating_point() or tuple(ids.shape) != (batch,):
        raise ValueError(f"position must be an int or a (batch={batch},) integer tensor, got {tuple(ids.shape)}")
    if bool(((ids < -length) | (ids >= length)).any()):
        raise ValueError(f"position must be in -{length}..{length - 1} (sequence length {length}), got "
                         f"{ids.tolist()}")
    return (ids.long() % length).to(device)


def direct_logit_attribution(cache: ActivationCache, model: nn.Module, answer: int | Tensor,
                             wrong: int | Tensor | None = None, position: int | Tensor | None = None
                             ) -> LogitAttribution:
    """How much each part of the model adds, directly, to ``logit[answer] - logit[wrong]`` at one position.

    The logits read ``final_norm(final_in) @ W_Uᵀ`` and ``final_in`` is a sum of parts (embeddings, every head's
    ``head_out``, the attention biases, every MLP's output). A part's *direct* contribution is what reaches the
    logits along the residual stream, not through later layers. The final normalisation is not linear, so it
    is **frozen at its scale** (TransformerLens's convention): the scale ``s`` (LayerNorm: ``√(var(x) + eps)``,
    RMSNorm: ``√(mean(x²) + eps)``) is computed once, from the full stream ``x = final_in``, and each part ``c``
    is read as ``((c - mean(c)) / s) · g · (W_U[answer] - W_U[wrong])`` with the norm's gain ``g`` (no mean
    subtracted for RMSNorm; no norm at all for the attention-only model). Every step is then linear, so the
    parts plus the LayerNorm bias's term ``b · (W_U[answer] - W_U[wrong])`` (reported as ``norm_bias``) sum to
    the model's logit difference exactly. A part's reading is what it adds *given* the scale the whole stream
    set; its effect through the scale, and through later layers, is not counted (that is what patching
    measures).

    Args:
        cache: from :func:`run_with_cache` on ``model``.
        model: the model the cache came from.
        answer: the token whose logit counts positively: an int or ``(B,)`` ids.
        wrong: the token whose logit is subtracted: an int or ``(B,)`` ids; None reads ``logit[answer]`` alone.
        position: the position read: None (the last), an int, or ``(B,)`` positions, one per sequence.

    Returns:
        A :class:`LogitAttribution` (batch-first; ``total()`` equals ``logit_diff``).
    """
    lay = _layout(model)
    if not isinstance(cache, ActivationCache):
        raise TypeError(f"cache must be an ActivationCache from run_with_cache, got {type(cache).__name__}")
    if cache.num_layers != lay.num_layers or cache.final_in.size(-1) != lay.embedding.embedding_dim:
        raise ValueError(f"the cache ({cache.num_layers} layers, d_model={cache.final_in.size(-1)}) was not made by "
                         f"this model ({lay.num_layers} layers, d_model={lay.embedding.embedding_dim})")
    batch, length, _ = cache.final_in.shape
    device = cache.final_in.device
    vocab = lay.unembed.out_features
    rows = torch.arange(batch, device=device)
    cols = _read_positions(position, batch, length, device)  # (B,)
    answers = _token_ids("answer", answer, batch, vocab, device)  # (B,)
    wrongs = None if wrong is None else _token_ids("wrong", wrong, batch, vocab, device)

    def difference(table: Tensor) -> Tensor:  # (V, ...) -> (B, ...): the answer's row minus the wrong one's
        return table[answers] if wrongs is None else table[answers] - table[wrongs]

    direction = difference(lay.unembed.weight.detach())  # (B, d)
    x = cache.final_in[rows, cols]  # (B, d): the full stream at the read positions
    constant = torch.zeros(batch, dtype=x.dtype, device=device)
    centre, reader = False, direction
    if lay.final_norm is not None:
        kind, eps = _norm_kind(lay.final_norm)
        centre = kind == "layernorm"
        spread = x - x.mean(dim=-1, keepdim=True) if centre else x
        scale = (spread.pow(2).mean(dim=-1, keepdim=True) + eps).sqrt()  # (B, 1): frozen from now on
        reader = direction * lay.final_norm.weight.detach() / scale  # (B, d)
        bias = getattr(lay.final_norm, "bias", None)
        if bias is not None:
            constant = constant + direction @ bias.detach()
    if lay.unembed.bias is not None:
        constant = constant + difference(lay.unembed.bias.detach())

    def read(part: Tensor) -> Tensor:  # (B, ..., d) -> (B, ...)
        if centre:
            part = part - part.mean(dim=-1, keepdim=True)
        return torch.einsum("b...d,bd->b...", part, reader)

    layers = range(lay.num_layers)
    with torch.no_grad():
        logits = lay.unembed(lay.final_norm(x) if lay.final_norm is not None else x)  # (B, V)
        actual = logits[rows, answers] if wrongs is None else logits[rows, answers] - logits[rows, wrongs]  # (B,)
        return LogitAttribution(
            embed=read(cache.embed[rows, cols]),
            pos_embed=read(cache.pos_embed[rows, cols]),
            heads=torch.stack([read(cache.head_out[layer][rows, :, cols]) for layer in layers], dim=1),
            attn_bias=torch.stack([read(cache.attn_bias[layer].expand(batch, -1)) for layer in layers], dim=1),
            mlps=None if cache.mlp_out is None else torch.stack([read(cache.mlp_out[layer][rows, cols])
                                                                 for layer in layers], dim=1),
            norm_bias=constant, logit_diff=actual)


def logit_lens(cache: ActivationCache, model: nn.Module) -> Tensor:
    """The next-token log-probabilities read from the residual stream after the embedding and after each block.

    Each reading passes the stream through the model's own final norm (with the stream's own scale) and its
    unembedding, as if the remaining blocks were skipped (nostalgebraist 2020). The last reading is the model's
    output.

    Args:
        cache: from :func:`run_with_cache` on ``model``.
        model: the model the cache came from.

    Returns:
        ``(layers + 1, B, L, V)`` log-probabilities: entry 0 reads ``resid_pre[0]``, entry ``l + 1`` reads
        ``resid_post[l]``; the last equals ``log_softmax(model(tokens))``.
    """
    lay = _layout(model)
    if not isinstance(cache, ActivationCache):
        raise TypeError(f"cache must be an ActivationCache from run_with_cache, got {type(cache).__name__}")
    if cache.num_layers != lay.num_layers:
        raise ValueError(f"the cache has {cache.num_layers} layers, the model {lay.num_layers}")
    streams = torch.stack([cache.resid_pre[0], *cache.resid_post])  # (layers + 1, B, L, d)
    with torch.no_grad():
        normed = lay.final_norm(streams) if lay.final_norm is not None else streams
        return torch.log_softmax(lay.unembed(normed).float(), dim=-1)  # (layers + 1, B, L, V)


# ---------------------------------------------------------------------------------------------------------
# Activation patching and path patching
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Site:
    kind: str
    layer: int
    head: int | None
    positions: list[int] | None  # None: every position


def _check_positions(positions: object, length: int, site: tuple) -> list[int] | None:
    if positions is None:
        return None
    if isinstance(positions, Tensor):
        positions = positions.tolist() if positions.dim() == 1 and not positions.is_floating_point() else positions
    if isinstance(positions, int) and not isinstance(positions, bool):
        positions = [positions]
    if not isinstance(positions, (list, tuple)) or any(isinstance(p, bool) or not isinstance(p, int)
                                                       for p in positions):
        raise TypeError(f"site {site!r}: positions must be None, an int or a sequence of ints")
    if any(not -length <= p < length for p in positions):
        raise ValueError(f"site {site!r}: positions must be in -{length}..{length - 1} (sequence length {length})")
    return sorted({p % length for p in positions})


def _parse_site(site: object, lay: _Layout, length: int) -> _Site:
    """``(kind, layer[, head][, positions])`` -> a checked :class:`_Site`."""
    if not isinstance(site, tuple) or not site or not isinstance(site[0], str):
        raise TypeError(f"a site is a tuple (kind, layer[, head][, positions]) with kind in {PATCH_SITES}, "
                        f"got {site!r}")
    kind, *rest = site
    if kind not in PATCH_SITES:
        raise ValueError(f"site kind must be one of {PATCH_SITES}, got {kind!r}")
    needed = 2 if kind in ("head", "pattern") else 1  # layer (and head)
    if not needed <= len(rest) <= needed + 1:
        layout = "(kind, layer, head[, positions])" if needed == 2 else "(kind, layer[, positions])"
        raise ValueError(f"a {kind!r} site is {layout}, got {site!r}")
    layer = _check_index(f"site {site!r}: layer", rest[0], lay.num_layers)
    head = _check_index(f"site {site!r}: head", rest[1], lay.attentions[layer].num_heads) if needed == 2 else None
    if kind == "mlp_out" and lay.mlps is None:
        raise ValueError(f"site {site!r}: an attention-only model has no MLP to patch")
    positions = _check_positions(rest[needed] if len(rest) > needed else None, length, site)
    return _Site(kind, layer, head, positions)


def _edit(site: _Site, clean: ActivationCache, lay: _Layout) -> tuple[tuple[str, int], _Edit]:
    """The hook key and the edit that writes ``site``'s clean activation into another run."""
    where = slice(None) if site.positions is None else site.positions  # positions (queries for a pattern)
    layer, head = site.layer, site.head
    if site.kind in ("resid_pre", "resid_post", "mlp_out"):
        source = getattr(clean, site.kind)[layer]  # (B, L, d)

        def stream(value: Tensor, recorded: dict) -> Tensor:
            value = value.clone()
            value[:, where] = source[:, where]
            return value

        return (site.kind, layer), stream
    if site.kind == "head":
        source = clean.z[layer]  # (B, H, L, d_head); head_out is linear in z, so patching z patches head_out

        def head_output(value: Tensor, recorded: dict) -> Tensor:
            value = value.clone()
            value[:, head, where] = source[:, head, where]
            return value

        return ("z", layer), head_output
    attention = lay.attentions[layer]
    group = attention.num_heads // attention.num_kv_heads  # head h reads value head h // group
    pattern = clean.pattern[layer][:, head]  # (B, L, L)

    def attention_pattern(value: Tensor, recorded: dict) -> Tensor:
        mixed = pattern.to(value.dtype) @ recorded["v"][layer][:, head // group]  # (B, L, d_head): this run's values
        value = value.clone()
        value[:, head, where] = mixed[:, where]
        return value

    return ("z", layer), attention_pattern


def _metric_value(metric: Callable[[Tensor], object], logits: Tensor, run: str) -> float:
    value = metric(logits)
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(f"metric must return a scalar, got a tensor of shape {tuple(value.shape)} on the "
                             f"{run} run")
        return float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"metric must return a float or a one-element tensor, got {type(value).__name__}")
    return float(value)


def _recovered(metric: Callable[[Tensor], object], clean: Tensor, corrupted: Tensor, patched: Tensor) -> float:
    """``(metric(patched) - metric(corrupted)) / (metric(clean) - metric(corrupted))``."""
    if not callable(metric):
        raise TypeError(f"metric must be a function of the logits (B, L, V), got {type(metric).__name__}")
    m_clean = _metric_value(metric, clean, "clean")
    m_corrupted = _metric_value(metric, corrupted, "corrupted")
    if m_clean == m_corrupted:
        raise ValueError(f"the metric is {m_clean} on both the clean and the corrupted run: there is nothing to "
                         "recover; choose inputs (or a metric) that tell them apart")
    share = (_metric_value(metric, patched, "patched") - m_corrupted) / (m_clean - m_corrupted)
    return share + 0.0  # -0.0 (nothing recovered, a negative denominator) prints as 0.0


def patch(model: nn.Module, clean_tokens: Tensor, corrupted_tokens: Tensor, site: tuple | Sequence[tuple],
          metric: Callable[[Tensor], object]) -> float:
    """Activation patching: run the corrupted input with one activation taken from the clean run.

    A site names what is copied from the clean run into the corrupted run, everything downstream of it
    recomputed:

    - ``("resid_pre", layer[, positions])``, ``("resid_post", layer[, positions])``: the residual stream
      entering / leaving block ``layer``;
    - ``("mlp_out", layer[, positions])``: a feed-forward network's output (not in an attention-only model);
    - ``("head", layer, head[, positions])``: one head's output (its ``z``, hence its ``head_out``);
    - ``("pattern", layer, head[, positions])``: one head's attention weights (rows = query positions),
      applied to the corrupted run's own values (for grouped-query attention, value head ``h // (H / H_kv)``).

    ``positions`` is an int, a sequence of ints (negative counts from the end) or None for every position. A
    list of sites is patched together, in one run.

    Args:
        model: an :class:`AttentionOnlyLM` or a :class:`~attention_course.DecoderOnlyLM`.
        clean_tokens, corrupted_tokens: ``(B, L)`` int64, of the same shape.
        site: one site or a list of sites.
        metric: ``logits (B, L, V) -> scalar`` (a float or a one-element tensor), e.g. a mean logit difference.

    Returns:
        The recovered share ``(metric(patched) - metric(corrupted)) / (metric(clean) - metric(corrupted))``:
        1 when the site carries everything that separates the runs, 0 when it carries nothing of it.

    Raises:
        ValueError: tokens of different shapes, an unknown site kind, a layer, head or position out of range,
            or a metric that is the same on both runs.
    """
    lay = _layout(model)
    _check_pair(clean_tokens, corrupted_tokens)
    sites = [site] if isinstance(site, tuple) else site
    if not isinstance(sites, (list, tuple)):
        raise TypeError(f"site must be a site tuple or a list of them, got {type(site).__name__}")
    parsed = [_parse_site(s, lay, clean_tokens.size(1)) for s in sites]
    clean_logits, clean = run_with_cache(model, clean_tokens)
    corrupted_logits, _ = _run(model, corrupted_tokens)
    edits: dict[tuple[str, int], list[_Edit]] = {}
    for s in parsed:
        key, edit = _edit(s, clean, lay)
        edits.setdefault(key, []).append(edit)
    patched_logits, _ = _run(model, corrupted_tokens, edits)
    return _recovered(metric, clean_logits, corrupted_logits, patched_logits)


def _check_head(name: str, value: object, lay: _Layout) -> tuple[int, int]:
    if not isinstance(value, tuple) or len(value) != 2:
        raise TypeError(f"{name} must be a (layer, head) tuple, got {value!r}")
    layer = _check_index(f"{name} layer", value[0], lay.num_layers)
    return layer, _check_index(f"{name} head", value[1], lay.attentions[layer].num_heads)


def _head_z(attention: MultiHeadAttention, q_in: Tensor, k_in: Tensor, v_in: Tensor, mask: Tensor | None
            ) -> Tensor:
    """Every head's ``z`` ``(B, H, L, d_head)`` when queries, keys and values are computed from different inputs
    ``(B, L, d)``: the module's own projections and kernel, read at its output projection's input."""
    keys, values = attention.project_kv(k_in, v_in)  # (B, Hkv, L, d_head) each
    captured: dict[str, Tensor] = {}
    handle = attention.w_o.register_forward_pre_hook(lambda module, args: captured.update(z=args[0]))
    try:
        attention.attend(q_in, keys, values, mask)
    finally:
        handle.remove()
    return captured["z"].unflatten(-1, (attention.num_heads, attention.d_head)).transpose(1, 2)


def path_patch(model: nn.Module, clean_tokens: Tensor, corrupted_tokens: Tensor, sender: tuple[int, int],
               receiver: tuple[int, int], receiver_input: str, metric: Callable[[Tensor], object]) -> float:
    """Path patching (Wang et al. 2022): the sender head's clean output, seen by the receiver head's one input.

    On the corrupted run, the receiver head's queries, keys or values (``receiver_input``) are computed from
    the corrupted stream plus the difference the sender head makes between the two runs::

        receiver input = norm1(corrupted resid_pre[receiver layer]
                               + clean head_out[sender] - corrupted head_out[sender])

    while its other two inputs, and every other head, keep their corrupted values. So only the direct path
    sender -> residual stream -> receiver's input is patched: not the sender's effect through other heads or
    MLPs in between. The receiver's new output then flows through the rest of the model as usual. (For
    grouped-query attention the patched keys or values are used by the receiver only, not by the other heads
    of its group.)

    Args:
        model: an :class:`AttentionOnlyLM` or a :class:`~attention_course.DecoderOnlyLM`.
        clean_tokens, corrupted_tokens: ``(B, L)`` int64, of the same shape.
        sender, receiver: ``(layer, head)``; the sender's layer must come before the receiver's.
        receiver_input: ``"q"``, ``"k"`` or ``"v"``.
        metric: ``logits (B, L, V) -> scalar``.

    Returns:
        The recovered share, as :func:`patch` defines it.
    """
    lay = _layout(model)
    _check_pair(clean_tokens, corrupted_tokens)
    sender_layer, sender_head = _check_head("sender", sender, lay)
    receiver_layer, receiver_head = _check_head("receiver", receiver, lay)
    if sender_layer >= receiver_layer:
        raise ValueError(f"the sender (layer {sender_layer}) must be in an earlier layer than the receiver "
                         f"(layer {receiver_layer}): a head only reads what earlier layers wrote")
    if receiver_input not in PATH_INPUTS:
        raise ValueError(f"receiver_input must be one of {PATH_INPUTS}, got {receiver_input!r}")
    clean_logits, clean = run_with_cache(model, clean_tokens)
    corrupted_logits, corrupted = run_with_cache(model, corrupted_tokens)
    difference = clean.head_out[sender_layer][:, sender_head] - corrupted.head_out[sender_layer][:, sender_head]
    attention, norm = lay.attentions[receiver_layer], lay.pre_norms[receiver_layer]
    with _evaluating(model):
        stream = corrupted.resid_pre[receiver_layer] + difference  # (B, L, d)
        patched_input = norm(stream) if norm is not None else stream
        plain = corrupted.attn_in[receiver_layer]
        q_in, k_in, v_in = (patched_input if name == receiver_input else plain for name in PATH_INPUTS)
        z = _head_z(attention, q_in, k_in, v_in, corrupted.masks[receiver_layer])[:, receiver_head]  # (B, L, d_head)

    def receive(value: Tensor, recorded: dict) -> Tensor:
        value = value.clone()
        value[:, receiver_head] = z
        return value

    patched_logits, _ = _run(model, corrupted_tokens, {("z", receiver_layer): [receive]})
    return _recovered(metric, clean_logits, corrupted_logits, patched_logits)


# ---------------------------------------------------------------------------------------------------------
# The OV circuit: does a head copy?
# ---------------------------------------------------------------------------------------------------------
def _fold_norm(norm: nn.Module | None, rows: Tensor) -> Tensor:
    """Rows written into the stream, as a norm's linear part reads them: centred (LayerNorm), times the gain."""
    if norm is None:
        return rows
    kind, _ = _norm_kind(norm)
    if kind == "layernorm":
        rows = rows - rows.mean(dim=-1, keepdim=True)
    return rows * norm.weight.detach().double()


def _ov_factors(model: nn.Module, layer: int, head: int) -> tuple[Tensor, Tensor]:
    """The full OV circuit ``M = A @ B`` of one head, as ``A (V, d_head)`` and ``B (d_head, V)`` in float64."""
    lay = _layout(model)
    _check_index("layer", layer, lay.num_layers)
    attention = lay.attentions[layer]
    _check_index("head", head, attention.num_heads)
    group = attention.num_heads // attention.num_kv_heads  # grouped-query: head h reads value head h // group
    w_v = _per_head(attention.w_v, attention.num_kv_heads, rows=True)[head // group].double()  # (d, d_head)
    w_o = _per_head(attention.w_o, attention.num_heads, rows=False)[head].double()  # (d_head, d)
    embed = lay.embedding.weight.detach().double()  # (V, d)
    unembed = lay.unembed.weight.detach().double().T  # (d, V)
    return _fold_norm(lay.pre_norms[layer], embed) @ w_v, _fold_norm(lay.final_norm, w_o) @ unembed


def copying_score(model: nn.Module, layer: int, head: int) -> float:
    """Olsson et al.'s (2022) copying score of one head: the eigenvalue balance of its full OV circuit.

    The full OV circuit ``M = W_E W_V^h W_O^h W_U`` (``V × V``, row vector convention) says how much attending
    to token ``i`` raises the logit of token ``j``, along the direct path embedding -> head -> unembedding.
    A head that copies has mostly positive eigenvalues; the score is ``Σ λ / Σ |λ|`` over the eigenvalues
    (the real part of the sum, as in Olsson et al. and ARENA): 1 for a perfect copier, -1 for a head that
    suppresses what it attends to, near 0 for a random head. The nonzero eigenvalues of ``A B`` are those of
    ``B A``, so the ``d_head × d_head`` product is used.

    Simplifications, as usual: positions, the biases of the value and output projections and of the norms
    are left out, and each normalisation contributes its linear part only (LayerNorm: centring and gain;
    RMSNorm: gain), without the division by each token's scale. Rotary positions act on queries and keys
    only, so they do not enter the OV circuit. Grouped-query attention: head ``h`` reads value head
    ``h // (H / H_kv)``.

    Returns:
        The score, in ``[-1, 1]``.

    Raises:
        ValueError: a layer or head out of range, or an OV circuit whose eigenvalues are all zero.
    """
    left, right = _ov_factors(model, layer, head)
    eigenvalues = torch.linalg.eigvals(right @ left)  # (d_head,) complex: the nonzero eigenvalues of M
    size = float(eigenvalues.abs().sum())
    if size == 0.0:
        raise ValueError(f"head {head} of layer {layer} has an OV circuit whose eigenvalues are all zero: no "
                         "copying score")
    return float(eigenvalues.sum().real) / size


def copying_fraction(model: nn.Module, layer: int, head: int, k: int = 1) -> float:
    """The share of tokens whose own logit is among the top ``k`` of their row of the full OV circuit.

    Row ``i`` of ``M`` (:func:`copying_score`, with the same simplifications) is the logit change when the
    head attends to token ``i``; token ``i`` counts when fewer than ``k`` other tokens' entries are at least
    its own (ties do not count as copying: an all-zero row does not).

    Returns:
        A share in ``[0, 1]``: 1 for a head that raises each attended token above every other.
    """
    check_int("k", k)
    left, right = _ov_factors(model, layer, head)
    vocab = left.size(0)
    copied = 0
    for start in range(0, vocab, 1024):  # rows in chunks: M is V × V
        rows = left[start : start + 1024] @ right  # (chunk, V)
        own = rows.gather(1, torch.arange(start, start + rows.size(0), device=rows.device)[:, None])  # (chunk, 1)
        copied += int(((rows >= own).sum(dim=1) - 1 < k).sum())
    return copied / vocab
