"""A GRU encoder–decoder with optional additive attention: the model chapter 1 uses to show why attention exists.

Two designs share every part except the *context* the decoder reads at each step:

- without attention (Cho et al. 2014; Sutskever et al. 2014), the encoder's final state is the only thing the
  decoder ever sees of the source: one fixed vector, however long the sentence;
- with attention (Bahdanau, Cho and Bengio 2014), the decoder scores every encoder state against its own
  state at each step and reads a fresh weighted mix of them: ``c_t = Σ_j α_{t,j} h_j``.

One decoder step, with ``y_{t-1}`` the previous output token and ``s_{t-1}`` the previous decoder state:

    c_t      = summary                                   (no attention)
    c_t, α_t = AdditiveAttention(s_{t-1}, H, H)          (attention: H holds the encoder states)
    s_t      = GRUCell([embed(y_{t-1}); c_t], s_{t-1})
    logits_t = Linear([s_t; c_t; embed(y_{t-1})])

Token sequences are right-padded with ``pad_id``; masks follow the course convention (True = may attend).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from attention_course.additive import AdditiveAttention
from attention_course.attention import masked_softmax
from attention_course.checks import check_int
from attention_course.runtime import fused_adam

__all__ = [
    "AttentionGRUDecoder",
    "DecoderMemory",
    "GRUEncoder",
    "Seq2SeqGRU",
    "sequence_accuracy",
    "train_seq2seq",
]


def _check_tokens(tokens: object, name: str, vocab_size: int) -> None:
    """Raise unless ``tokens`` is a 2-D integer tensor ``(batch, length)`` with ids in ``[0, vocab_size)``."""
    if not isinstance(tokens, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of token ids, got {type(tokens).__name__}")
    if tokens.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name} must hold integer token ids (torch.long), got dtype {tokens.dtype}")
    if tokens.dim() != 2 or tokens.size(0) == 0 or tokens.size(1) == 0:
        raise ValueError(f"{name} must have shape (batch, length) with both sizes >= 1, got {tuple(tokens.shape)}")
    low, high = int(tokens.min()), int(tokens.max())
    if low < 0 or high >= vocab_size:
        raise ValueError(f"{name} holds token ids in [{low}, {high}], outside the vocabulary [0, {vocab_size})")


def source_lengths(src: Tensor, pad_id: int) -> Tensor:
    """Lengths ``(B,)`` of right-padded sequences ``src (B, S)``; raise if a row is empty or padded on the left.

    Raises:
        ValueError: a row that is all padding, or a padding token followed by a real token.
    """
    real = src != pad_id  # (B, S)
    lengths = real.sum(dim=1)  # (B,)
    if bool((lengths == 0).any()):
        row = int((lengths == 0).nonzero()[0])
        raise ValueError(f"row {row} of the source is all padding (pad_id={pad_id}); every source needs a token")
    # Right padding means the real tokens are exactly the first `length` positions.
    expected = torch.arange(src.size(1), device=src.device) < lengths.unsqueeze(1)  # (B, S)
    if not torch.equal(real, expected):
        row = int((real != expected).any(dim=1).nonzero()[0])
        raise ValueError(
            f"row {row} of the source has a padding token (pad_id={pad_id}) before a real token: "
            f"{src[row].tolist()}; sequences must be right-padded"
        )
    return lengths


class GRUEncoder(nn.Module):
    """Embedding and a bidirectional GRU: one state per source token, plus a summary of the whole source.

    Each state ``h_j = [h→_j; h←_j]`` concatenates a forward pass (which has read tokens ``1..j``) and a
    backward pass (which has read tokens ``j..S``), so it describes token j in its full context.

    Args:
        vocab_size: number of source token ids.
        embed_dim: size of the token embeddings.
        hidden_dim: size of each direction's GRU state; states have ``output_dim = 2 * hidden_dim``.
        pad_id: the padding token id (its embedding is fixed at zero).

    Shape: ``forward(src (B, S))`` returns ``states (B, S, 2·hidden_dim)`` (zero at padding positions) and
    ``summary (B, 2·hidden_dim)``, the forward pass's final state next to the backward pass's final state.
    """

    def __init__(self, vocab_size: int, embed_dim: int, hidden_dim: int, pad_id: int = 0) -> None:
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("embed_dim", embed_dim), ("hidden_dim", hidden_dim)):
            check_int(name, value)
        if not 0 <= pad_id < vocab_size:
            raise ValueError(f"pad_id must be a token id in [0, {vocab_size}), got {pad_id}")
        self.vocab_size = vocab_size
        self.pad_id = pad_id
        self.output_dim = 2 * hidden_dim
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=pad_id)
        self.gru = nn.GRU(embed_dim, hidden_dim, batch_first=True, bidirectional=True)

    def forward(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """Encode right-padded token ids ``src (B, S)``; return ``(states (B, S, 2H), summary (B, 2H))``."""
        _check_tokens(src, "src", self.vocab_size)
        lengths = source_lengths(src, self.pad_id)
        embedded = self.embedding(src)  # (B, S, E)
        # Packing makes each direction start and stop at the real tokens: the backward pass starts at the last
        # real token, not at the padding, and the final states belong to the real ends of each sequence.
        packed = pack_padded_sequence(embedded, lengths.cpu(), batch_first=True, enforce_sorted=False)
        packed_states, final = self.gru(packed)  # final: (2, B, H), forward then backward
        states, _ = pad_packed_sequence(packed_states, batch_first=True, total_length=src.size(1))  # (B, S, 2H)
        summary = torch.cat([final[0], final[1]], dim=-1)  # (B, 2H)
        return states, summary


class DecoderMemory(NamedTuple):
    """What the decoder reads of the source, prepared once per source batch by :meth:`AttentionGRUDecoder.prepare`.

    Attributes:
        states: ``(B, S, memory_dim)`` encoder states: the attention's keys and values.
        summary: ``(B, memory_dim)`` encoder summary: the context when there is no attention.
        mask: ``(B, S)`` boolean, True where the source has a real token.
        projected_keys: ``(B, S, attention_dim)`` the keys times ``W_k``, or None without attention.
    """

    states: Tensor
    summary: Tensor
    mask: Tensor
    projected_keys: Tensor | None


class AttentionGRUDecoder(nn.Module):
    """A GRU decoder that reads the source through a context vector, fixed or recomputed by attention.

    Args:
        vocab_size: number of target token ids.
        embed_dim: size of the target token embeddings.
        hidden_dim: size of the decoder state.
        memory_dim: size of the encoder states (and of the summary).
        attention: True: additive attention over the encoder states at every step (Bahdanau et al.);
            False: the encoder summary is the context at every step (the fixed-vector bottleneck).
        attention_dim: width of the hidden layer inside the additive score (default ``hidden_dim``).

    Shapes: ``tokens (B, T)``, ``states (B, S, memory_dim)``, ``summary (B, memory_dim)``,
    ``mask (B, S)`` (True = a real source token); see :meth:`forward` and :meth:`step`.
    """

    def __init__(
        self,
        vocab_size: int,
        embed_dim: int,
        hidden_dim: int,
        memory_dim: int,
        attention: bool = True,
        attention_dim: int | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("embed_dim", embed_dim), ("hidden_dim", hidden_dim),
                            ("memory_dim", memory_dim)):
            check_int(name, value)
        if not isinstance(attention, bool):
            raise TypeError(f"attention must be True or False, got {attention!r}")
        self.vocab_size = vocab_size
        self.hidden_dim = hidden_dim
        self.memory_dim = memory_dim
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        # s_0 = tanh(W summary + b): a learned map of the whole summary (both directions' final states).
        # Bahdanau et al. (2014, appendix A.2.2) start from the backward encoder's state alone,
        # s_0 = tanh(W_s h<-_1); using both directions gives both designs here the same starting information.
        self.init_state = nn.Linear(memory_dim, hidden_dim)
        # The query (decoder state, hidden_dim) and the keys (encoder states, memory_dim) differ in size:
        # exactly the case additive attention handles without an extra projection.
        self.attention = AdditiveAttention(hidden_dim, memory_dim, attention_dim or hidden_dim) if attention else None
        self.cell = nn.GRUCell(embed_dim + memory_dim, hidden_dim)
        self.output = nn.Linear(hidden_dim + memory_dim + embed_dim, vocab_size)

    def prepare(self, states: Tensor, summary: Tensor, mask: Tensor) -> DecoderMemory:
        """Check the encoder outputs and project the keys once for all decoding steps.

        Args:
            states: ``(B, S, memory_dim)``; summary: ``(B, memory_dim)``; mask: ``(B, S)`` boolean.
        """
        if states.dim() != 3 or states.size(-1) != self.memory_dim:
            raise ValueError(f"states must have shape (B, S, memory_dim={self.memory_dim}), got {tuple(states.shape)}")
        if summary.shape != (states.size(0), self.memory_dim):
            raise ValueError(f"summary must have shape {(states.size(0), self.memory_dim)}, got {tuple(summary.shape)}")
        if mask.shape != states.shape[:2] or mask.dtype != torch.bool:
            raise ValueError(
                f"mask must be a boolean tensor of shape {tuple(states.shape[:2])}, got {mask.dtype} "
                f"{tuple(mask.shape)}"
            )
        # W_k h_j does not depend on the decoder step: computing it once instead of at every step is the saving
        # Bahdanau et al. (2014, appendix A.1.2) point out, and most of the cost of a step otherwise.
        keys = None if self.attention is None else self.attention.w_k(states)  # (B, S, A)
        return DecoderMemory(states, summary, mask, keys)

    def attend(self, state: Tensor, memory: DecoderMemory) -> tuple[Tensor, Tensor]:
        """Additive attention of the decoder state over the source: ``(context (B, memory_dim), weights (B, S))``.

        The same computation as ``self.attention(state[:, None], memory.states, memory.states, mask)``
        (a unit test checks it), through ``AdditiveAttention.score_projected_keys`` with the keys' projection
        taken once from :meth:`prepare`.
        """
        attention = self.attention
        if attention is None:
            raise ValueError("this decoder was built with attention=False; it has no attention to compute")
        # w^T tanh(W_q s + W_k h_j) for one query per sentence, with W_k h_j computed once in prepare().
        scores = attention.score_projected_keys(state.unsqueeze(1), memory.projected_keys).squeeze(1)  # (B, S)
        weights = masked_softmax(scores, memory.mask)  # (B, S)
        context = torch.bmm(weights.unsqueeze(1), memory.states).squeeze(1)  # (B, 1, S) @ (B, S, M) -> (B, M)
        return context, weights

    def initial_state(self, summary: Tensor) -> Tensor:
        """The first decoder state ``(B, hidden_dim)`` from the encoder summary ``(B, memory_dim)``."""
        return torch.tanh(self.init_state(summary))

    def advance(
        self, embedded: Tensor, state: Tensor, memory: DecoderMemory
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Move the decoder state one step: read the context, then update the GRU.

        Args:
            embedded: ``(B, embed_dim)`` the embedded previous output token.
            state: ``(B, hidden_dim)`` the previous decoder state ``s_{t-1}``.
            memory: the prepared source, from :meth:`prepare`.

        Returns:
            The new state ``s_t (B, hidden_dim)``, the context ``c_t (B, memory_dim)`` and the attention
            weights ``(B, S)`` (None without attention).
        """
        if self.attention is None:
            context, weights = memory.summary, None  # (B, M): the same vector at every step
        else:
            context, weights = self.attend(state, memory)  # (B, M), (B, S): the query is the previous state
        state = self.cell(torch.cat([embedded, context], dim=-1), state)  # (B, H)
        return state, context, weights

    def step(
        self, prev_tokens: Tensor, state: Tensor, memory: DecoderMemory
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """One decoding step, as in generation.

        Args:
            prev_tokens: ``(B,)`` the previous output tokens (BOS at the first step).
            state: ``(B, hidden_dim)`` the previous decoder state ``s_{t-1}``.
            memory: the prepared source, from :meth:`prepare`.

        Returns:
            ``logits (B, vocab_size)``, the new state ``(B, hidden_dim)``, and the attention weights
            ``(B, S)`` over the source (None without attention).
        """
        embedded = self.embedding(prev_tokens)  # (B, E)
        state, context, weights = self.advance(embedded, state, memory)
        logits = self.output(torch.cat([state, context, embedded], dim=-1))  # (B, V)
        return logits, state, weights

    def forward(self, tgt_in: Tensor, memory: DecoderMemory) -> tuple[Tensor, Tensor | None]:
        """Teacher forcing: feed the true previous tokens ``tgt_in (B, T)`` (BOS first).

        Returns:
            ``logits (B, T, vocab_size)`` and ``weights (B, T, S)`` (None without attention).
        """
        _check_tokens(tgt_in, "tgt_in", self.vocab_size)
        if memory.states.size(0) != tgt_in.size(0):
            raise ValueError(
                f"tgt_in has batch size {tgt_in.size(0)} but the source states have {memory.states.size(0)}"
            )
        embedded = self.embedding(tgt_in)  # (B, T, E): every input token is known in advance
        state = self.initial_state(memory.summary)  # (B, H)
        states, contexts, all_weights = [], [], []
        for t in range(tgt_in.size(1)):  # the recurrence is sequential: s_t needs s_{t-1}
            state, context, weights = self.advance(embedded[:, t], state, memory)
            states.append(state)
            contexts.append(context)
            all_weights.append(weights)
        # The output layer needs no recurrence: apply it to all steps at once, as step() does to one.
        features = torch.cat([torch.stack(states, 1), torch.stack(contexts, 1), embedded], dim=-1)  # (B, T, H+M+E)
        stacked_weights = None if self.attention is None else torch.stack(all_weights, dim=1)  # (B, T, S)
        return self.output(features), stacked_weights  # (B, T, V)


class Seq2SeqGRU(nn.Module):
    """A GRU encoder–decoder, with or without additive attention.

    Args:
        src_vocab_size, tgt_vocab_size: vocabulary sizes (ids include the special tokens).
        hidden_dim: size of the decoder state and of each encoder direction.
        attention: use additive attention (True) or only the encoder summary (False).
        embed_dim: size of the token embeddings (default ``hidden_dim // 2``).
        pad_id: padding id, shared by source and target.

    Shape: ``forward(src (B, S), tgt_in (B, T))`` returns ``logits (B, T, tgt_vocab_size)`` and the attention
    weights ``(B, T, S)`` (None without attention); :meth:`greedy_decode` generates without a target.
    """

    def __init__(
        self,
        src_vocab_size: int,
        tgt_vocab_size: int,
        hidden_dim: int = 64,
        attention: bool = True,
        embed_dim: int | None = None,
        pad_id: int = 0,
    ) -> None:
        super().__init__()
        check_int("hidden_dim", hidden_dim)
        embed_dim = embed_dim if embed_dim is not None else max(1, hidden_dim // 2)
        self.pad_id = pad_id
        self.encoder = GRUEncoder(src_vocab_size, embed_dim, hidden_dim, pad_id)
        self.decoder = AttentionGRUDecoder(tgt_vocab_size, embed_dim, hidden_dim, self.encoder.output_dim, attention)

    @property
    def uses_attention(self) -> bool:
        """Whether the decoder attends over the encoder states."""
        return self.decoder.attention is not None

    def forward(self, src: Tensor, tgt_in: Tensor) -> tuple[Tensor, Tensor | None]:
        """Logits ``(B, T, V)`` for each target position given the true previous tokens, and the weights."""
        if tgt_in.dim() != 2 or src.dim() != 2 or tgt_in.size(0) != src.size(0):
            raise ValueError(
                f"src (B, S) and tgt_in (B, T) must share the batch size, got {tuple(src.shape)} and "
                f"{tuple(tgt_in.shape)}"
            )
        memory = self.encode(src)
        return self.decoder(tgt_in, memory)

    def encode(self, src: Tensor) -> DecoderMemory:
        """Encode ``src (B, S)`` and prepare it for the decoder."""
        states, summary = self.encoder(src)  # (B, S, M), (B, M)
        return self.decoder.prepare(states, summary, src != self.pad_id)

    @torch.no_grad()
    def greedy_decode(self, src: Tensor, max_len: int, bos_id: int, eos_id: int) -> tuple[Tensor, Tensor | None]:
        """Generate by always taking the most probable next token, until every row has produced EOS.

        Args:
            src: ``(B, S)`` right-padded source token ids.
            max_len: the most tokens to generate per row (EOS included).
            bos_id, eos_id: the begin- and end-of-sequence ids of the target vocabulary.

        Returns:
            ``tokens (B, 1 + T)`` with ``T <= max_len``: ``bos_id``, then each row's output up to and including
            its EOS, then ``pad_id`` (the convention of :func:`attention_course.decoding.greedy_decode`); and
            ``weights (B, T, S)``, row t holding where generated token t (``tokens[:, 1 + t]``) looked in the
            source (zero after the row's EOS), or None without attention.
        """
        check_int("max_len", max_len)
        vocab = self.decoder.vocab_size
        for name, token in (("bos_id", bos_id), ("eos_id", eos_id)):
            if not 0 <= token < vocab:
                raise ValueError(f"{name} must be a target token id in [0, {vocab}), got {token}")
        memory = self.encode(src)
        state = self.decoder.initial_state(memory.summary)
        prev = torch.full((src.size(0),), bos_id, dtype=torch.long, device=src.device)  # (B,)
        finished = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
        tokens, weights = [], []
        for _ in range(max_len):
            logits, state, step_weights = self.decoder.step(prev, state, memory)
            prev = logits.argmax(dim=-1)  # (B,)
            tokens.append(prev.masked_fill(finished, self.pad_id))
            if step_weights is not None:
                weights.append(step_weights.masked_fill(finished.unsqueeze(1), 0.0))
            finished = finished | (prev == eos_id)
            if bool(finished.all()):
                break
        stacked_weights = torch.stack(weights, dim=1) if weights else None  # (B, T, S)
        start = torch.full((src.size(0), 1), bos_id, dtype=torch.long, device=src.device)  # (B, 1)
        return torch.cat([start, torch.stack(tokens, dim=1)], dim=1), stacked_weights


def sequence_accuracy(predicted: Tensor, target: Tensor, pad_id: int = 0) -> tuple[Tensor, Tensor]:
    """Per-row token accuracy and exact match of generated sequences against the targets.

    Args:
        predicted: ``(N, T1)`` generated ids without the leading BOS (for example
            ``Seq2SeqGRU.greedy_decode(...)[0][:, 1:]``).
        target: ``(N, T2)`` reference ids (ending with EOS), right-padded with ``pad_id``.

    Returns:
        ``token_accuracy (N,)``: the fraction of the target's non-padding positions where the prediction has
        the same token; ``exact (N,)``: True where every one of them matches. Positions beyond the prediction's
        length count as wrong; extra predicted tokens after the target ends are ignored (the target ends with
        EOS, which the prediction must have matched).
    """
    if predicted.dim() != 2 or target.dim() != 2 or predicted.size(0) != target.size(0):
        raise ValueError(
            f"predicted (N, T1) and target (N, T2) must be 2-D with the same N, got {tuple(predicted.shape)} and "
            f"{tuple(target.shape)}"
        )
    length = target.size(1)
    if predicted.size(1) < length:  # too short: pad with an id no target position holds (-1), so it never matches
        predicted = F.pad(predicted, (0, length - predicted.size(1)), value=-1)
    predicted = predicted[:, :length]
    real = target != pad_id  # (N, T2)
    correct = (predicted == target) & real
    counts = real.sum(dim=1).clamp(min=1)
    return correct.sum(dim=1) / counts, correct.sum(dim=1) == real.sum(dim=1)


def _batches(num_examples: int, batch_size: int, generator: torch.Generator) -> Iterator[Tensor]:
    """Endless random mini-batches of example indices, reshuffled every epoch."""
    while True:
        order = torch.randperm(num_examples, generator=generator)
        for start in range(0, num_examples - batch_size + 1, batch_size):
            yield order[start:start + batch_size]


def train_seq2seq(
    model: Seq2SeqGRU,
    src: Tensor,
    tgt_in: Tensor,
    tgt_out: Tensor,
    steps: int,
    batch_size: int = 64,
    lr: float = 3e-3,
    clip_norm: float = 1.0,
    seed: int = 0,
    progress: bool = True,
    description: str = "training",
) -> list[float]:
    """Train with teacher forcing and cross-entropy (padding ignored), Adam and gradient clipping.

    Args:
        model: the model, already on its device; the data are moved there batch by batch.
        src: ``(N, S)`` source ids; tgt_in: ``(N, T)`` BOS + target; tgt_out: ``(N, T)`` target + EOS.
        steps: number of optimisation steps.
        batch_size: examples per step (at most N).
        lr: Adam learning rate; clip_norm: the largest gradient norm allowed per step.
        seed: seeds the order of the mini-batches.
        progress: show a progress bar (tqdm).

    Returns:
        The training loss at every step.
    """
    from tqdm.auto import tqdm

    check_int("steps", steps)
    check_int("batch_size", batch_size)
    if not src.size(0) == tgt_in.size(0) == tgt_out.size(0):
        raise ValueError(
            f"src, tgt_in and tgt_out must have the same number of examples, got {tuple(src.shape)}, "
            f"{tuple(tgt_in.shape)} and {tuple(tgt_out.shape)}"
        )
    if tgt_in.shape != tgt_out.shape:
        raise ValueError(f"tgt_in and tgt_out must have the same shape, got {tuple(tgt_in.shape)} and "
                         f"{tuple(tgt_out.shape)}")
    if batch_size > src.size(0):
        raise ValueError(f"batch_size {batch_size} is larger than the {src.size(0)} training examples")
    device = next(model.parameters()).device
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, fused=fused_adam(device))
    batches = _batches(src.size(0), batch_size, torch.Generator().manual_seed(seed))
    losses = []
    model.train()
    for _ in tqdm(range(steps), desc=description, disable=not progress):
        index = next(batches)
        # Trim the batch to its longest source and target: shorter loops, same result.
        batch_src = src[index]
        batch_src = batch_src[:, : int((batch_src != model.pad_id).sum(1).max())].to(device)
        real_target = int((tgt_out[index] != model.pad_id).sum(1).max())
        batch_in, batch_out = tgt_in[index, :real_target].to(device), tgt_out[index, :real_target].to(device)
        logits, _ = model(batch_src, batch_in)  # (b, T, V)
        loss = F.cross_entropy(logits.transpose(1, 2), batch_out, ignore_index=model.pad_id)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    return losses
