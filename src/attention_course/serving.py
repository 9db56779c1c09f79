"""Serving a decoder-only model to many requests at once (chapter 17).

Three ideas make serving affordable, and all three are about attention's key-value cache:

- :class:`PagedKVCache` stores every sequence's keys and values in fixed-size blocks drawn from one pool,
  found through a per-sequence block table (PagedAttention, Kwon et al. 2023). Memory is taken as a
  sequence grows, not reserved for the longest possible one, and sequences that share a prompt share its
  blocks (reference counts; a shared block is copied before it is written: copy on write).
- :func:`serve_continuous` schedules at the granularity of one decoding step (iteration-level scheduling,
  Orca: Yu et al. 2022): a finished request leaves the batch at once and a waiting one takes its place.
  :func:`serve_static` is the baseline that runs a batch until its longest request is done.
- :func:`speculative_generate` lets a small draft model propose ``draft_length`` tokens that the target
  model checks in one call; the accept/reject rule keeps the target's output distribution exactly
  (Leviathan et al. 2023; Chen et al. 2023).

The model is the course's :class:`~attention_course.DecoderOnlyLM`. :func:`paged_forward` runs it on new
tokens of several sequences at once, each at its own position, reading earlier keys and values from the paged
cache: either gathered from the blocks into a padded tensor, with the model's own attention
(``MultiHeadAttention.attend``), or read block by block where they lie (:func:`paged_attention`, an online
softmax over the block table, as vLLM's kernel does).

:func:`serve_continuous` admits requests knowing their output lengths: an oracle baseline. The scheduler
that does not know them (:func:`~attention_course.serve_preemptive`), static batching with a contiguous
reservation (:func:`~attention_course.serve_reserved`) and prefix caching
(:class:`~attention_course.PrefixCache`) are in :mod:`attention_course.serving_scheduler`; drafts for
speculative decoding and the power of its distribution test in :mod:`attention_course.serving_draft`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from attention_course.checks import check_int
from attention_course.rotary import apply_rotary
from attention_course.sampling import sample_next_token, top_k_filter, top_p_filter
from attention_course.tiled import tiled_attention_step

__all__ = [
    "OutOfBlocksError",
    "PagedKVCache",
    "Request",
    "ServingLog",
    "SpeculativeResult",
    "block_and_offset",
    "paged_attention",
    "paged_forward",
    "paged_generate",
    "serve_continuous",
    "serve_static",
    "speculative_accept",
    "speculative_generate",
]


class OutOfBlocksError(RuntimeError):
    """The paged cache has too few free blocks for a request (the scheduler must wait or evict)."""


def block_and_offset(position: int, block_size: int) -> tuple[int, int]:
    """Which entry of a block table holds token ``position``, and where in that block: ``divmod``.

    Token ``p`` of a sequence lives in the ``p // block_size``-th block of its table, at slot
    ``p % block_size``.
    """
    check_int("position", position, minimum=0)
    check_int("block_size", block_size)
    return position // block_size, position % block_size


# ---------------------------------------------------------------------------------------------------------
# The paged cache
# ---------------------------------------------------------------------------------------------------------
class PagedKVCache:
    """Keys and values of many sequences in fixed-size blocks from one pool (PagedAttention's layout).

    Args:
        num_layers: attention layers of the model (each has its own storage).
        num_kv_heads: key/value heads per layer.
        d_head: width of one head.
        block_size: token positions per block.
        num_blocks: blocks in the pool (the memory is allocated here, once).
        dtype, device: of the storage.

    Attributes:
        keys: ``(num_layers, num_blocks, num_kv_heads, block_size, d_head)``, the pool of keys.
        values: the pool of values, of the same shape.
        block_tables: sequence id -> list of block ids; position ``p`` is in ``table[p // block_size]``.
        lengths: sequence id -> positions written.
        ref_counts: ``(num_blocks,)`` how many sequences' tables hold each block (0 = free).

    A sequence is created with :meth:`allocate` (or :meth:`fork`, which shares its parent's blocks), grown
    with :meth:`reserve` + :meth:`write` (or :meth:`append`, both at once), read with :meth:`gather`, and
    given back with :meth:`free`. A block shared by several sequences is copied before it is written.
    """

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        d_head: int,
        block_size: int = 16,
        num_blocks: int = 64,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        for name, value in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads), ("d_head", d_head),
                            ("block_size", block_size), ("num_blocks", num_blocks)):
            check_int(name, value)
        self.num_layers, self.num_kv_heads, self.d_head = num_layers, num_kv_heads, d_head
        self.block_size, self.num_blocks = block_size, num_blocks
        shape = (num_layers, num_blocks, num_kv_heads, block_size, d_head)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.ref_counts = torch.zeros(num_blocks, dtype=torch.long)
        self.free_blocks: list[int] = list(range(num_blocks - 1, -1, -1))  # a stack: pop() gives block 0 first
        self.block_tables: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}

    @classmethod
    def for_model(cls, model: torch.nn.Module, block_size: int = 16, num_blocks: int = 64) -> PagedKVCache:
        """A pool shaped for a :class:`~attention_course.DecoderOnlyLM` (its layers, heads, dtype, device)."""
        attention = _blocks(model)[0].self_attention
        weight = next(model.parameters())
        kv_heads = getattr(attention, "num_kv_heads", None) or attention.num_heads
        return cls(len(_blocks(model)), kv_heads, attention.d_head, block_size, num_blocks,
                   dtype=weight.dtype, device=weight.device)

    # --- bookkeeping --------------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_blocks)

    def bytes_per_block(self) -> int:
        """Bytes of keys and values one block holds, over all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.block_size * self.d_head * self.keys.element_size()

    def blocks_needed(self, length: int) -> int:
        """Blocks a sequence of ``length`` positions occupies: ``ceil(length / block_size)``."""
        return -(-length // self.block_size)

    def _check_sequence(self, seq_id: int) -> None:
        if seq_id not in self.block_tables:
            raise KeyError(f"sequence {seq_id!r} is not in the cache (allocate it first); "
                           f"sequences held: {sorted(self.block_tables)}")

    def _take_block(self) -> int:
        if not self.free_blocks:
            raise OutOfBlocksError(f"no free block left: all {self.num_blocks} blocks of {self.block_size} "
                                   f"positions are in use by {len(self.block_tables)} sequences")
        block = self.free_blocks.pop()
        self.ref_counts[block] = 1
        return block

    def _release_block(self, block: int) -> None:
        self.ref_counts[block] -= 1
        if int(self.ref_counts[block]) == 0:
            self.free_blocks.append(block)

    def allocate(self, seq_id: int) -> None:
        """Start an empty sequence (no block is taken until it has positions)."""
        if seq_id in self.block_tables:
            raise ValueError(f"sequence {seq_id!r} is already in the cache")
        self.block_tables[seq_id] = []
        self.lengths[seq_id] = 0

    def fork(self, parent_id: int, child_id: int) -> None:
        """Start ``child_id`` as a copy of ``parent_id`` that shares all its blocks (no keys are copied).

        Requests with the same prompt share the prompt's blocks this way; the first one to write into a
        shared block gets its own copy of it (:meth:`reserve`).
        """
        self._check_sequence(parent_id)
        if child_id in self.block_tables:
            raise ValueError(f"sequence {child_id!r} is already in the cache")
        self.block_tables[child_id] = list(self.block_tables[parent_id])
        self.lengths[child_id] = self.lengths[parent_id]
        for block in self.block_tables[child_id]:
            self.ref_counts[block] += 1

    def free(self, seq_id: int) -> None:
        """Forget a sequence; its blocks return to the free list once no other sequence holds them."""
        self._check_sequence(seq_id)
        for block in self.block_tables.pop(seq_id):
            self._release_block(block)
        del self.lengths[seq_id]

    def reserve(self, seq_id: int, num_new: int) -> int:
        """Make room for ``num_new`` more positions of ``seq_id``; return the first new position.

        Takes new blocks from the free list as needed, and copies the last block first if another sequence
        shares it (copy on write). Nothing changes when the blocks run out.

        Raises:
            OutOfBlocksError: fewer free blocks than needed.
        """
        self._check_sequence(seq_id)
        check_int("num_new", num_new)
        table, start = self.block_tables[seq_id], self.lengths[seq_id]
        needed = self.blocks_needed(start + num_new) - len(table)
        shared_tail = start % self.block_size != 0 and int(self.ref_counts[table[-1]]) > 1
        if needed + shared_tail > self.num_free_blocks:
            raise OutOfBlocksError(
                f"sequence {seq_id!r} needs {needed + shared_tail} more blocks for {num_new} positions, but "
                f"only {self.num_free_blocks} of {self.num_blocks} are free")
        if shared_tail:  # copy on write: the partly filled last block is someone else's too
            old, new = table[-1], self._take_block()
            self.keys[:, new] = self.keys[:, old]
            self.values[:, new] = self.values[:, old]
            self._release_block(old)
            table[-1] = new
        table.extend(self._take_block() for _ in range(needed))
        self.lengths[seq_id] = start + num_new
        return start

    def _slots(self, seq_id: int, start: int, count: int) -> tuple[Tensor, Tensor]:
        positions = torch.arange(start, start + count)
        table = torch.tensor(self.block_tables[seq_id], dtype=torch.long)
        return table[positions // self.block_size], positions % self.block_size  # (count,), (count,)

    def write(self, layer: int, seq_id: int, start: int, keys: Tensor, values: Tensor) -> None:
        """Store ``keys``/``values`` ``(num_kv_heads, t, d_head)`` of one layer at positions ``start..start+t-1``
        (already reserved)."""
        self._check_sequence(seq_id)
        expected = (self.num_kv_heads, keys.size(1) if keys.dim() == 3 else -1, self.d_head)
        for name, tensor in (("keys", keys), ("values", values)):
            if tensor.dim() != 3 or tuple(tensor.shape) != expected:
                raise ValueError(f"{name} must have shape (num_kv_heads={self.num_kv_heads}, t, "
                                 f"d_head={self.d_head}) with the same t, got {tuple(tensor.shape)}")
        if start < 0 or start + keys.size(1) > self.lengths[seq_id]:
            raise ValueError(f"positions {start}..{start + keys.size(1) - 1} of sequence {seq_id!r} are not "
                             f"reserved (it has {self.lengths[seq_id]})")
        blocks, offsets = self._slots(seq_id, start, keys.size(1))
        for block in set(blocks.tolist()):
            if int(self.ref_counts[block]) > 1:
                raise ValueError(f"block {block} is shared; reserve() copies it before it can be written")
        self.keys[layer, blocks, :, offsets] = keys.transpose(0, 1).to(self.keys.dtype)  # (t, Hkv, d_head)
        self.values[layer, blocks, :, offsets] = values.transpose(0, 1).to(self.values.dtype)

    def append(self, seq_id: int, keys: Tensor, values: Tensor) -> int:
        """Reserve and write new positions for every layer at once.

        Args:
            keys, values: ``(num_layers, num_kv_heads, t, d_head)``.

        Returns:
            The first new position.
        """
        ok = (keys.dim() == 4 and keys.shape == values.shape and keys.size(0) == self.num_layers
              and keys.size(1) == self.num_kv_heads and keys.size(3) == self.d_head)
        if not ok:  # checked before anything is reserved
            raise ValueError(f"keys and values must both have shape (num_layers={self.num_layers}, "
                             f"num_kv_heads={self.num_kv_heads}, t, d_head={self.d_head}), got "
                             f"{tuple(keys.shape)} and {tuple(values.shape)}")
        start = self.reserve(seq_id, keys.size(2))
        for layer in range(self.num_layers):
            self.write(layer, seq_id, start, keys[layer], values[layer])
        return start

    def gather(self, layer: int, seq_id: int) -> tuple[Tensor, Tensor]:
        """One layer's keys and values of a sequence, in order: ``(num_kv_heads, length, d_head)`` each."""
        self._check_sequence(seq_id)
        blocks, offsets = self._slots(seq_id, 0, self.lengths[seq_id])
        return (self.keys[layer, blocks, :, offsets].transpose(0, 1),
                self.values[layer, blocks, :, offsets].transpose(0, 1))

    def gather_batch(self, layer: int, seq_ids: Sequence[int]) -> tuple[Tensor, Tensor, Tensor]:
        """Keys and values of several sequences, padded to the longest.

        Returns:
            ``keys, values (B, num_kv_heads, L_max, d_head)`` and ``valid (B, L_max)`` bool, True at the
            positions each sequence really has.
        """
        lengths = [self.lengths[s] for s in seq_ids] if all(s in self.lengths for s in seq_ids) else None
        if lengths is None:
            missing = [s for s in seq_ids if s not in self.lengths]
            raise KeyError(f"sequences {missing} are not in the cache")
        longest = max(lengths)
        shape = (len(seq_ids), self.num_kv_heads, longest, self.d_head)
        keys = self.keys.new_zeros(shape)
        values = self.values.new_zeros(shape)
        for row, seq_id in enumerate(seq_ids):
            k, v = self.gather(layer, seq_id)
            keys[row, :, : k.size(1)], values[row, :, : v.size(1)] = k, v
        valid = torch.arange(longest)[None, :] < torch.tensor(lengths)[:, None]
        return keys, values, valid.to(self.keys.device)

    def slots_used(self) -> int:
        """Positions the used blocks can hold (``used blocks x block_size``): the memory paging takes."""
        return self.num_used_blocks * self.block_size


# ---------------------------------------------------------------------------------------------------------
# The model on a paged cache
# ---------------------------------------------------------------------------------------------------------
def _position_scheme(block: torch.nn.Module) -> str | None:
    """The position scheme of a block's attention (None, "rotary" or "alibi")."""
    return getattr(block.self_attention, "positions", None)


def _blocks(model: torch.nn.Module) -> Sequence[torch.nn.Module]:
    blocks = getattr(model, "blocks", None)
    if blocks is None or not hasattr(model, "embed") or not hasattr(model, "lm_head"):
        raise TypeError(f"model must be an attention_course.DecoderOnlyLM, got {type(model).__name__}")
    return blocks


def _check_ids(tokens: object, name: str) -> Tensor:
    if not isinstance(tokens, Tensor) or tokens.dtype != torch.long or tokens.dim() not in (1, 2):
        got = f"{tuple(tokens.shape)} {tokens.dtype}" if isinstance(tokens, Tensor) else type(tokens).__name__
        raise ValueError(f"{name} must be an int64 tensor of shape (length,) or (1, length), got {got}")
    if tokens.dim() == 2 and tokens.size(0) != 1:
        raise ValueError(f"{name} must hold one sequence, got shape {tuple(tokens.shape)}")
    tokens = tokens.reshape(-1)
    if tokens.numel() < 1:
        raise ValueError(f"{name} must hold at least one token")
    return tokens


def paged_attention(query: Tensor, cache: PagedKVCache, layer: int, seq_ids: Sequence[int],
                    query_positions: Tensor, scale: float | None = None) -> Tensor:
    """Attention of new queries to the paged cache, read block by block in place through the block tables.

    No sequence's keys are copied into a contiguous tensor: for the ``j``-th entry of every sequence's table
    the block it names is read from the pool (one ``(Hkv, block_size, d_head)`` tile per sequence) and folded
    into an online softmax (:func:`~attention_course.tiled_attention_step`, chapter 11b), as vLLM's
    PagedAttention kernel does. Query head ``h`` reads key/value head ``h // (Hq / Hkv)`` (grouped-query).

    Args:
        query: ``(B, Hq, t, d_head)`` the new positions' queries (rotated already, for rotary models).
        cache: the paged cache holding every sequence's keys and values, the new positions' included.
        layer: which layer's pool to read.
        seq_ids: ``B`` sequence ids.
        query_positions: ``(B, t)`` each query's position; it sees keys at positions ``<=`` its own.
        scale: factor on the scores, default ``1/√d_head``.

    Returns:
        ``(B, Hq, t, d_head)``: equal (to rounding) to attention over each sequence's gathered keys.
    """
    batch, heads, new, d_head = query.shape
    kv_heads, size = cache.num_kv_heads, cache.block_size
    if heads % kv_heads or d_head != cache.d_head or len(seq_ids) != batch:
        raise ValueError(f"query must be (B={len(seq_ids)}, a multiple of {kv_heads} heads, t, "
                         f"d_head={cache.d_head}), got {tuple(query.shape)}")
    if tuple(query_positions.shape) != (batch, new):
        raise ValueError(f"query_positions must be (B, t) = {(batch, new)}, got {tuple(query_positions.shape)}")
    group = heads // kv_heads
    tables = [cache.block_tables[s] for s in seq_ids]
    width = max(len(t) for t in tables)
    table = torch.tensor([t + [t[-1]] * (width - len(t)) for t in tables], device=cache.keys.device)  # (B, nb)
    # (B, Hkv, group * t, d): the query heads that share a key/value head read the same tiles
    q = query.reshape(batch, kv_heads, group * new, d_head)
    positions = query_positions.to(cache.keys.device).repeat(1, group)[:, None, :, None]  # (B, 1, g*t, 1)
    accumulator = torch.zeros_like(q)
    running_max = torch.full(q.shape[:-1], -math.inf, dtype=q.dtype, device=q.device)
    running_sum = torch.zeros(q.shape[:-1], dtype=q.dtype, device=q.device)
    slots = torch.arange(size, device=q.device)
    scale = d_head**-0.5 if scale is None else scale
    for j in range(width):  # block j of every sequence, read where it lies in the pool
        keys, values = cache.keys[layer, table[:, j]], cache.values[layer, table[:, j]]  # (B, Hkv, bs, d)
        mask = (j * size + slots)[None, None, None, :] <= positions  # (B, 1, g*t, bs): causal, and padding
        accumulator, running_max, running_sum = tiled_attention_step(
            accumulator, running_max, running_sum, q, keys.to(q.dtype), values.to(q.dtype), scale, mask)
    out = accumulator / running_sum.clamp_min(torch.finfo(q.dtype).tiny).unsqueeze(-1)
    return out.reshape(batch, heads, new, d_head)


def paged_forward(model: torch.nn.Module, cache: PagedKVCache, seq_ids: Sequence[int], tokens: Tensor,
                  attention: str = "gather") -> Tensor:
    """Logits for ``t`` new tokens of each of ``B`` sequences, each continuing at its own length in ``cache``.

    For each sequence the new positions are reserved in the cache; in every layer the new keys and values
    are written to the cache's blocks, then each sequence's keys and values are gathered (padded to the
    longest) and the new queries attend to that sequence's positions up to their own (a causal mask per
    row). The layers are the model's own (its norms, attention projections and ``attend``, feed-forward).

    With ``attention="in_place"`` no keys are gathered: :func:`paged_attention` reads the blocks where they
    lie (an online softmax over blocks); ``"gather"`` copies each sequence's keys into a padded tensor first
    (simple, and the layout paging exists to avoid).

    Args:
        model: a :class:`~attention_course.DecoderOnlyLM` (in ``eval()`` mode).
        cache: the paged cache; updated in place.
        seq_ids: ``B`` sequence ids already allocated in ``cache``.
        tokens: ``(B, t)`` the new tokens (a prompt: B = 1, t = its length; a decoding step: t = 1).
        attention: ``"gather"`` or ``"in_place"``.

    Returns:
        ``(B, t, V)``: row b equals the last ``t`` rows of ``model(all tokens of sequence b)``.
    """
    blocks = _blocks(model)
    if not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.dtype != torch.long:
        raise ValueError(f"tokens must be a (batch, t) int64 tensor, got "
                         f"{tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__}")
    if attention not in ("gather", "in_place"):
        raise ValueError(f"attention must be 'gather' or 'in_place', got {attention!r}")
    seq_ids = list(seq_ids)
    if len(seq_ids) != tokens.size(0) or len(set(seq_ids)) != len(seq_ids):
        raise ValueError(f"seq_ids must name {tokens.size(0)} distinct sequences, one per row of tokens, "
                         f"got {seq_ids}")
    new = tokens.size(1)
    starts = [cache.lengths.get(s, -1) for s in seq_ids]
    if min(starts) < 0:
        raise KeyError(f"sequences {[s for s in seq_ids if s not in cache.lengths]} are not in the cache")
    needed = sum(cache.blocks_needed(s + new) - len(cache.block_tables[i]) for s, i in zip(starts, seq_ids))
    if needed > cache.num_free_blocks:  # check before anything is written, so a failure leaves no trace
        raise OutOfBlocksError(f"this step needs {needed} more blocks, only {cache.num_free_blocks} are free")
    for seq_id in seq_ids:
        cache.reserve(seq_id, new)
    x = torch.cat([model.embed(tokens[b : b + 1], offset=starts[b]) for b in range(len(seq_ids))])
    query_positions = torch.tensor(starts, device=tokens.device)[:, None] + torch.arange(new, device=tokens.device)
    for layer, block in enumerate(blocks):
        h = block.norm1(x)  # (B, t, d_model)
        per_row = _position_scheme(block) is not None  # rotary/ALiBi need each row's positions
        if per_row:
            kv = [block.self_attention.project_kv(h[b : b + 1], h[b : b + 1], query_positions[b])
                  for b in range(len(seq_ids))]
            new_keys, new_values = torch.cat([k for k, _ in kv]), torch.cat([v for _, v in kv])
        else:
            new_keys, new_values = block.self_attention.project_kv(h, h)  # (B, Hkv, t, d_head)
        for b, seq_id in enumerate(seq_ids):
            cache.write(layer, seq_id, starts[b], new_keys[b], new_values[b])
        if attention == "in_place":
            if _position_scheme(block) == "alibi":
                raise ValueError("attention='in_place' supports learned, sinusoidal and rotary positions, not ALiBi")
            q = block.self_attention.split_heads(block.self_attention.w_q(h))  # (B, H, t, d_head)
            if per_row:
                q = torch.cat([apply_rotary(q[b : b + 1], query_positions[b], block.self_attention.rotary_base,
                                            block.self_attention.rotary_pairing) for b in range(len(seq_ids))])
            heads = paged_attention(q, cache, layer, seq_ids, query_positions)
            x = x + block.dropout1(block.self_attention.w_o(block.self_attention.merge_heads(heads)))
            x = x + block.dropout2(block.feed_forward(block.norm2(x)))
            continue
        keys, values, valid = cache.gather_batch(layer, seq_ids)  # (B, Hkv, L, d_head), (B, L)
        key_positions = torch.arange(keys.size(2), device=tokens.device)
        mask = (key_positions[None, None, :] <= query_positions[:, :, None]) & valid[:, None, :]  # (B, t, L)
        if per_row:
            outs = [block.self_attention.attend(h[b : b + 1], keys[b : b + 1], values[b : b + 1], mask[b : b + 1, None],
                                     query_positions[b], key_positions)[0] for b in range(len(seq_ids))]
            attended = torch.cat(outs)
        else:
            attended = block.self_attention.attend(h, keys, values, mask[:, None])[0]  # (B, t, d_model)
        x = x + block.dropout1(attended)
        x = x + block.dropout2(block.feed_forward(block.norm2(x)))
    return model.lm_head(model.norm(x))  # (B, t, V)


@torch.no_grad()
def paged_generate(
    model: torch.nn.Module,
    prompt_ids: Tensor,
    max_new_tokens: int,
    cache: PagedKVCache | None = None,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    attention: str = "gather",
) -> Tensor:
    """Continue one prompt through a paged cache (the prompt in one call, then one token a step).

    ``attention`` is passed to :func:`paged_forward` (``"gather"`` or ``"in_place"``).

    Returns ``(Lp + max_new_tokens,)``: the same tokens as ``model.generate(prompt, n, temperature)``. The
    sequence is freed from ``cache`` at the end.
    """
    prompt = _check_ids(prompt_ids, "prompt_ids")
    check_int("max_new_tokens", max_new_tokens, minimum=0)
    if cache is None:  # a pool just large enough for this one sequence
        cache = PagedKVCache.for_model(model, block_size=16, num_blocks=-(-(prompt.numel() + max_new_tokens) // 16))
    seq_id = max(cache.block_tables, default=-1) + 1
    cache.allocate(seq_id)
    tokens, new = prompt.tolist(), prompt[None]
    try:
        for _ in range(max_new_tokens):
            logits = paged_forward(model, cache, [seq_id], new, attention)[:, -1]  # (1, V)
            token = int(sample_next_token(logits, temperature, generator=generator)[0])
            tokens.append(token)
            new = torch.tensor([[token]], device=prompt.device)
    finally:
        cache.free(seq_id)
    return torch.tensor(tokens, device=prompt.device)


# ---------------------------------------------------------------------------------------------------------
# Batching: static versus continuous
# ---------------------------------------------------------------------------------------------------------
@dataclass
class Request:
    """One request of a trace: it arrives at step ``arrival`` with a prompt and wants ``output_length`` tokens."""

    request_id: int
    arrival: int
    prompt: Tensor
    output_length: int


@dataclass
class ServingLog:
    """What a serving loop records. Time is counted in steps (one model call on the running batch per step:
    the clock of a memory-bound server) and in wall-clock seconds.

    Attributes:
        outputs: request id -> generated tokens.
        finish_step: request id -> the step after which its last token existed.
        first_token_step: request id -> the step that produced its first token.
        steps: steps until the last request finished.
        seconds: wall-clock seconds of the whole run.
        batch_sizes: sequences in the batch at each step (for static batching, finished ones included);
            one entry per step, idle steps included.
        blocks_used: cache blocks in use after each step (continuous batching; empty for static).
        positions_held: positions (tokens) the running sequences hold in the cache after each step.
        block_tables: a copy of every block table after each step (with ``record_tables=True``).
        events: ``(step, request id, "start" | "finish" | "preempt")`` in order.
        preemptions: requests preempted (their blocks freed, recomputed later; :func:`serve_preemptive`).
        arrival_time: request id -> seconds since the run started at the start of the step the request
            arrived in.
        first_token_time: request id -> seconds since the run started when its first token existed.
        finish_time: request id -> seconds since the run started when its last token existed.
        prefill_tokens: tokens run through the model as prompts (recomputation included).
        cached_prefix_tokens: prompt tokens whose keys and values came from the prefix cache instead.
    """

    outputs: dict[int, list[int]] = field(default_factory=dict)
    finish_step: dict[int, int] = field(default_factory=dict)
    first_token_step: dict[int, int] = field(default_factory=dict)
    steps: int = 0
    seconds: float = 0.0
    batch_sizes: list[int] = field(default_factory=list)
    blocks_used: list[int] = field(default_factory=list)
    positions_held: list[int] = field(default_factory=list)
    events: list[tuple[int, int, str]] = field(default_factory=list)
    block_tables: list[dict[int, list[int]]] = field(default_factory=list)
    preemptions: int = 0
    arrival_time: dict[int, float] = field(default_factory=dict)
    first_token_time: dict[int, float] = field(default_factory=dict)
    finish_time: dict[int, float] = field(default_factory=dict)
    prefill_tokens: int = 0
    cached_prefix_tokens: int = 0

    def ttft(self) -> dict[int, float]:
        """Time to first token, seconds: from the start of the step a request arrived in to its first token."""
        return {i: self.first_token_time[i] - self.arrival_time[i] for i in self.first_token_time}

    def tpot(self) -> dict[int, float]:
        """Time per output token after the first, seconds (requests with at least two tokens)."""
        return {i: (self.finish_time[i] - self.first_token_time[i]) / (len(self.outputs[i]) - 1)
                for i in self.finish_time if len(self.outputs[i]) > 1}

    def latencies(self, requests: Sequence[Request]) -> dict[int, int]:
        """Steps from each request's arrival to its last token."""
        return {r.request_id: self.finish_step[r.request_id] - r.arrival for r in requests}

    def tokens_per_step(self) -> float:
        return sum(len(o) for o in self.outputs.values()) / max(self.steps, 1)

    def tokens_per_second(self) -> float:
        return sum(len(o) for o in self.outputs.values()) / max(self.seconds, 1e-12)


def _check_trace(requests: Sequence[Request], max_batch: int) -> list[Request]:
    check_int("max_batch", max_batch)
    requests = sorted(requests, key=lambda r: (r.arrival, r.request_id))
    if len({r.request_id for r in requests}) != len(requests):
        raise ValueError("request ids must be distinct")
    for r in requests:
        _check_ids(r.prompt, f"request {r.request_id}'s prompt")
        check_int(f"request {r.request_id}'s output_length", r.output_length)
        check_int(f"request {r.request_id}'s arrival", r.arrival, minimum=0)
    return requests


def _next_tokens(logits: Tensor, temperature: float, generator: torch.Generator | None) -> list[int]:
    return sample_next_token(logits, temperature, generator=generator).tolist()


@torch.no_grad()
def serve_continuous(
    model: torch.nn.Module,
    requests: Sequence[Request],
    cache: PagedKVCache,
    max_batch: int = 8,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    record_tables: bool = False,
) -> ServingLog:
    """Iteration-level (continuous) batching over a paged cache (Orca's schedule on vLLM's memory).

    **An oracle baseline**: it admits a request only when the blocks of its prompt *and its whole output* are
    free, which needs the output length in advance; no server knows it. :func:`serve_preemptive` is the
    scheduler that does not.

    Every step: requests that have arrived join the running batch while it has fewer than ``max_batch``
    sequences and the cache has blocks for their prompt and output (their prompt goes through the model
    and gives their first token); then one decoding step runs on every running sequence; a sequence that
    has all its tokens leaves at once and frees its blocks.

    Returns:
        A :class:`ServingLog`. Greedy outputs equal ``model.generate(prompt, n, temperature=0)``'s.
    """
    requests = _check_trace(requests, max_batch)
    log, waiting, running = ServingLog(), list(requests), []
    start_time, step = time.perf_counter(), 0
    while waiting or running:
        while not running and waiting[0].arrival > step:  # idle until the next arrival
            log.batch_sizes.append(0)
            log.blocks_used.append(cache.num_used_blocks)
            log.positions_held.append(0)
            if record_tables:
                log.block_tables.append({})
            step += 1
        for r in waiting:
            if r.arrival <= step and r.request_id not in log.arrival_time:
                log.arrival_time[r.request_id] = time.perf_counter() - start_time
        while waiting and waiting[0].arrival <= step and len(running) < max_batch:
            request = waiting[0]
            need = cache.blocks_needed(request.prompt.numel() + request.output_length)
            if need > cache.num_blocks:
                raise OutOfBlocksError(f"request {request.request_id} needs {need} blocks, the cache has "
                                       f"{cache.num_blocks} in all")
            # blocks the running requests will still take before they finish: admit only what fits after them
            promised = sum(cache.blocks_needed(r.prompt.numel() + r.output_length)
                           - len(cache.block_tables[r.request_id]) for r in running)
            if need > cache.num_free_blocks - promised:
                break  # wait until a running request frees blocks
            waiting.pop(0)
            cache.allocate(request.request_id)
            logits = paged_forward(model, cache, [request.request_id], request.prompt.reshape(1, -1))
            log.outputs[request.request_id] = _next_tokens(logits[:, -1], temperature, generator)
            log.first_token_step[request.request_id] = step
            log.first_token_time[request.request_id] = time.perf_counter() - start_time
            log.prefill_tokens += request.prompt.numel()
            log.events.append((step, request.request_id, "start"))
            running.append(request)
        decoding = [r for r in running if len(log.outputs[r.request_id]) < r.output_length]
        if decoding:  # one decoding step for every running sequence, each at its own length
            ids = [r.request_id for r in decoding]
            last = torch.tensor([[log.outputs[i][-1]] for i in ids], device=decoding[0].prompt.device)
            logits = paged_forward(model, cache, ids, last)[:, -1]  # (B, V)
            for i, token in zip(ids, _next_tokens(logits, temperature, generator)):
                log.outputs[i].append(token)
        log.batch_sizes.append(len(running))
        step += 1
        for request in [r for r in running if len(log.outputs[r.request_id]) >= r.output_length]:
            running.remove(request)  # leaves at once; its blocks go back to the free list
            cache.free(request.request_id)
            log.finish_step[request.request_id] = step
            log.finish_time[request.request_id] = time.perf_counter() - start_time
            log.events.append((step, request.request_id, "finish"))
        log.blocks_used.append(cache.num_used_blocks)
        log.positions_held.append(sum(cache.lengths.values()))
        if record_tables:  # a snapshot of every block table, for pictures of the pool
            log.block_tables.append({i: list(t) for i, t in cache.block_tables.items()})
    log.steps, log.seconds = step, time.perf_counter() - start_time
    return log


@torch.no_grad()
def serve_static(
    model: torch.nn.Module,
    requests: Sequence[Request],
    max_batch: int = 8,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
) -> ServingLog:
    """Static (request-level) batching: take up to ``max_batch`` arrived requests, run them together until
    the longest is done, then take the next batch.

    A finished sequence stays in the batch (its slot is computed and thrown away) and a request that arrives
    meanwhile waits for the whole batch: the two costs continuous batching removes. The keys and values live
    in a paged cache sized for the batch, so the arithmetic is the same as :func:`serve_continuous`'s.
    """
    requests = _check_trace(requests, max_batch)
    log, waiting = ServingLog(), list(requests)
    start_time, step = time.perf_counter(), 0
    while waiting:
        while waiting[0].arrival > step:  # idle until the next arrival
            log.batch_sizes.append(0)
            step += 1
        batch = [r for r in waiting if r.arrival <= step][:max_batch]
        for r in batch:
            waiting.remove(r)
        # every row runs as many steps as the longest output, finished or not
        steps = max(r.output_length for r in batch)
        blocks = sum(-(-(r.prompt.numel() + steps) // 16) for r in batch)
        cache = PagedKVCache.for_model(model, block_size=16, num_blocks=blocks)
        for r in batch:
            cache.allocate(r.request_id)
            logits = paged_forward(model, cache, [r.request_id], r.prompt.reshape(1, -1))
            log.outputs[r.request_id] = _next_tokens(logits[:, -1], temperature, generator)
            log.first_token_step[r.request_id] = step
            log.events.append((step, r.request_id, "start"))
        ids = [r.request_id for r in batch]
        for _ in range(max(r.output_length for r in batch) - 1):
            last = torch.tensor([[log.outputs[i][-1]] for i in ids], device=batch[0].prompt.device)
            tokens = _next_tokens(paged_forward(model, cache, ids, last)[:, -1], temperature, generator)
            for r, token in zip(batch, tokens):
                if len(log.outputs[r.request_id]) < r.output_length:  # a finished row's token is wasted
                    log.outputs[r.request_id].append(token)
            log.batch_sizes.append(len(batch))
            step += 1
        if max(r.output_length for r in batch) == 1:
            log.batch_sizes.append(len(batch))
            step += 1
        for r in batch:
            log.finish_step[r.request_id] = step
            log.events.append((step, r.request_id, "finish"))
    log.steps, log.seconds = step, time.perf_counter() - start_time
    return log


# ---------------------------------------------------------------------------------------------------------
# Speculative decoding
# ---------------------------------------------------------------------------------------------------------
def speculative_accept(
    token: int, p_target: Tensor, p_draft: Tensor, uniform: float
) -> tuple[bool, Tensor]:
    """The accept/reject rule for one drafted token (Leviathan et al. 2023; Chen et al. 2023).

    Accept ``token`` (drawn from ``p_draft``) when ``uniform < min(1, p_target[token] / p_draft[token])``.
    On rejection the replacement is drawn from the residual ``max(0, p_target - p_draft)``, normalised.
    Together the two give exactly ``p_target``.

    Args:
        token: the drafted token id.
        p_target, p_draft: ``(V,)`` the two models' probabilities at this position.
        uniform: a draw from U[0, 1).

    Returns:
        ``(accepted, residual (V,))``: the residual distribution to sample from when rejected.
    """
    if p_target.shape != p_draft.shape or p_target.dim() != 1:
        raise ValueError(f"p_target and p_draft must both be (V,), got {tuple(p_target.shape)} and "
                         f"{tuple(p_draft.shape)}")
    ratio = p_target[token] / p_draft[token].clamp_min(torch.finfo(p_draft.dtype).tiny)
    accepted = bool(uniform < min(1.0, float(ratio)))
    residual = (p_target - p_draft).clamp_min(0)
    total = residual.sum()
    # The residual is all zeros only when p_target == p_draft, and then every token is accepted.
    residual = residual / total if float(total) > 0 else p_target
    return accepted, residual


@dataclass
class SpeculativeResult:
    """What :func:`speculative_generate` returns.

    Attributes:
        tokens: ``(Lp + n,)`` the prompt and the generated tokens.
        proposed: draft tokens proposed in all.
        accepted: draft tokens accepted.
        rejected: draft tokens rejected (at most one per round: the rest of that draft is never checked).
        target_calls: target model calls (each checks a whole draft).
        draft_calls: draft model calls.
    """

    tokens: Tensor
    proposed: int = 0
    accepted: int = 0
    rejected: int = 0
    target_calls: int = 0
    draft_calls: int = 0

    @property
    def acceptance_rate(self) -> float:
        """The share of the draft tokens checked that were accepted (each round checks up to its first
        rejection), an estimate of the probability ``alpha`` that the target accepts one draft token."""
        return self.accepted / max(self.accepted + self.rejected, 1)

    def tokens_per_target_call(self, prompt_length: int) -> float:
        return (self.tokens.numel() - prompt_length) / max(self.target_calls, 1)


def _probabilities(logits: Tensor, temperature: float, top_k: int | None, top_p: float | None) -> Tensor:
    """The distribution :func:`~attention_course.sample_next_token` draws from; temperature 0: one-hot argmax."""
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.size(-1)).to(torch.float64)
    logits = logits.double() / temperature
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    return torch.softmax(logits, dim=-1)


def _truncate(cache: object, length: int) -> None:
    """Drop the cached positions from ``length`` on (rejected draft tokens) from an ``LMCache``."""
    for layer in cache.layers:
        if layer.keys is not None and layer.keys.size(2) > length:
            layer.keys, layer.values = layer.keys[:, :, :length], layer.values[:, :, :length]
        layer.position = min(layer.position, length)
    cache.position = min(cache.position, length)


@torch.no_grad()
def speculative_generate(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    prompt_ids: Tensor,
    max_new_tokens: int,
    draft_length: int = 4,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> SpeculativeResult:
    """Speculative decoding: the draft proposes, the target checks a whole draft in one call.

    Each round the draft samples ``draft_length`` tokens one by one (``q_1..q_k`` its distributions); the
    target runs once on all of them and gives ``p_1..p_{k+1}``. Draft token ``i`` is accepted with
    probability ``min(1, p_i / q_i)``; at the first rejection a token is drawn from ``max(0, p_i - q_i)``
    normalised, and the round ends; when all ``k`` are accepted a bonus token is drawn from ``p_{k+1}``.
    Every generated token is distributed exactly as the target's own sampling would draw it (with the same
    ``temperature``, ``top_k``, ``top_p``); with ``temperature=0`` the output is the target's greedy one.

    Args:
        target: a :class:`~attention_course.DecoderOnlyLM` in eval mode.
        draft: a model with the same vocabulary and ``step``/``new_cache`` (a smaller
            :class:`~attention_course.DecoderOnlyLM`, :func:`~attention_course.truncated_draft`,
            :class:`~attention_course.NGramDraft`).
        prompt_ids: ``(Lp,)`` or ``(1, Lp)`` int64.
        max_new_tokens: tokens to generate.
        draft_length: tokens the draft proposes per round (``k >= 1``).
        temperature, top_k, top_p: as in :func:`~attention_course.sample_next_token`.
        generator: the random source (draft samples, acceptance draws, residual samples).

    Returns:
        A :class:`SpeculativeResult` (tokens and the counts behind the acceptance rate).
    """
    prompt = _check_ids(prompt_ids, "prompt_ids")
    check_int("max_new_tokens", max_new_tokens, minimum=0)
    check_int("draft_length", draft_length)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature < 0:
        raise ValueError(f"temperature must be a number >= 0 (0 = greedy), got {temperature!r}")
    _blocks(target)
    if not all(hasattr(draft, a) for a in ("step", "new_cache", "vocab_size", "max_len")):
        raise TypeError(f"draft must have step, new_cache, vocab_size and max_len (a DecoderOnlyLM or an "
                        f"NGramDraft), got {type(draft).__name__}")
    for name, model in (("target", target), ("draft", draft)):
        if prompt.numel() + max_new_tokens > model.max_len:
            raise ValueError(f"prompt length {prompt.numel()} + max_new_tokens {max_new_tokens} exceeds the "
                             f"{name}'s max_len={model.max_len}")
    if target.vocab_size != draft.vocab_size:
        raise ValueError(f"target and draft must share one vocabulary, got sizes {target.vocab_size} and "
                         f"{draft.vocab_size}")
    device = prompt.device

    def uniform() -> float:
        return float(torch.rand((), generator=generator, device=generator.device if generator else "cpu"))

    def sample(p: Tensor) -> int:  # on the generator's device, wherever the models run
        p = p.float() if generator is None else p.float().to(generator.device)
        return int(torch.multinomial(p, 1, generator=generator)[0])

    result = SpeculativeResult(prompt)
    tokens = prompt.tolist()
    end = len(tokens) + max_new_tokens
    target_cache, draft_cache = target.new_cache(), draft.new_cache()
    while len(tokens) < end:
        k = min(draft_length, end - len(tokens) - 1)  # the round also yields one target token
        drafted, q = [], []
        for _ in range(k):  # the draft proposes k tokens, one call each
            feed = torch.tensor([(tokens + drafted)[draft_cache.position:]], device=device)
            logits = draft.step(feed, draft_cache)[0, -1]
            result.draft_calls += 1
            q.append(_probabilities(logits, temperature, top_k, top_p))
            drafted.append(sample(q[-1]) if temperature > 0 else int(q[-1].argmax()))
        feed = torch.tensor([tokens[target_cache.position:] + drafted], device=device)
        logits = target.step(feed, target_cache)[0, -(k + 1):]  # (k + 1, V): p_1 .. p_{k+1}
        result.target_calls += 1
        p = _probabilities(logits, temperature, top_k, top_p)
        result.proposed += k
        kept = len(tokens)
        for i, token in enumerate(drafted):
            accepted, residual = speculative_accept(token, p[i], q[i], uniform() if temperature > 0 else 0.0)
            if not accepted:
                tokens.append(sample(residual) if temperature > 0 else int(p[i].argmax()))
                result.rejected += 1
                break
            tokens.append(token)
            result.accepted += 1
        else:  # every draft token accepted: the target's next distribution gives one more token for free
            tokens.append(sample(p[k]) if temperature > 0 else int(p[k].argmax()))
        accepted_now = len(tokens) - kept - 1
        _truncate(target_cache, kept + accepted_now)  # keep the context and the accepted draft tokens
        _truncate(draft_cache, kept + accepted_now)
    result.tokens = torch.tensor(tokens, device=device)
    return result
