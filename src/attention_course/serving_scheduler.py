"""Scheduling requests the way a server must: without knowing how long each answer will be (chapter 17).

:func:`~attention_course.serve_continuous` admits a request only when the blocks of its *whole* answer are
free, which needs the output length in advance: an oracle, kept as a baseline. A server does not know when a
request will stop. vLLM's scheduler (Kwon et al. 2023, §4.5) admits optimistically and repairs afterwards:

- :func:`serve_preemptive` admits waiting requests (first come, first served) while the free blocks, after the
  request's prompt, stay above a **watermark**; running sequences grow one block at a time; when a decoding
  step needs a block and none is free, the most recently admitted request is **preempted by recompute**: its
  blocks are freed and it goes back to the head of the queue with the tokens it has generated, which are run
  through the model again as a longer prompt when it is readmitted. (The other option, swapping the blocks
  to CPU memory and back, trades recomputation for PCIe traffic; here everything is on one device.)
- :func:`serve_reserved` is static batching with a contiguous cache: each request in a batch reserves
  ``reserve`` positions (the model's context, or the longest request the trace can hold), so a memory budget
  of ``memory_positions`` holds ``memory_positions // reserve`` requests at once.
- :class:`PrefixCache` is vLLM's automatic prefix caching: every full block is keyed by a hash of its tokens
  and of all tokens before it, so a new request whose prompt starts with cached blocks takes them (reference
  counts) and runs only the rest of its prompt through the model.

Every loop records per-request wall-clock times (:meth:`~attention_course.serving.ServingLog.ttft`,
:meth:`~attention_course.serving.ServingLog.tpot`), preemptions and the blocks in use.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from attention_course.checks import check_int
from attention_course.serving import (
    OutOfBlocksError,
    PagedKVCache,
    Request,
    ServingLog,
    _check_trace,
    _next_tokens,
    paged_forward,
)

__all__ = ["PrefixCache", "percentile", "serve_preemptive", "serve_reserved"]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values``, linear interpolation (``numpy.percentile``'s default)."""
    if not len(values):
        raise ValueError("percentile of no values")
    return float(torch.quantile(torch.tensor(list(values), dtype=torch.float64), q / 100))


# ---------------------------------------------------------------------------------------------------------
# Prefix caching by block hash
# ---------------------------------------------------------------------------------------------------------
class PrefixCache:
    """Full blocks of a :class:`~attention_course.PagedKVCache` found again by the tokens they hold.

    Block ``i`` of a sequence is keyed by ``hash((key of block i - 1, tokens of block i))``: equal keys mean
    equal tokens in the block *and* before it, hence equal keys and values (a causal model's position ``p``
    depends only on tokens ``0..p``). The cache holds one reference to every block it knows, so a block
    outlives the request that wrote it; when the pool runs short, :meth:`evict` frees blocks only the cache
    still holds, least recently used first. A request that takes cached blocks shares them (reference
    counts); the pool's copy on write protects a shared block from being written.

    Attributes:
        hits: blocks taken from the cache in all; ``hit_tokens`` the positions they hold.
    """

    def __init__(self, cache: PagedKVCache) -> None:
        self.cache = cache
        self.blocks: dict[int, int] = {}  # key -> block id (insertion order = least recently used first)
        self.hits = 0

    @property
    def hit_tokens(self) -> int:
        return self.hits * self.cache.block_size

    def keys_of(self, tokens: Sequence[int]) -> list[int]:
        """The key of each full block of ``tokens``."""
        size, keys, previous = self.cache.block_size, [], None
        for start in range(0, len(tokens) - size + 1, size):
            previous = hash((previous, tuple(tokens[start : start + size])))
            keys.append(previous)
        return keys

    def peek(self, tokens: Sequence[int]) -> list[int]:
        """The blocks :meth:`allocate` would take for ``tokens`` (nothing changes)."""
        found = []
        for key in self.keys_of(list(tokens)[:-1]):
            if key not in self.blocks:
                break
            found.append(self.blocks[key])
        return found

    def match(self, tokens: Sequence[int]) -> list[int]:
        """Cached blocks holding the longest run of full blocks at the start of ``tokens``."""
        found = []
        for key in self.keys_of(tokens):
            if key not in self.blocks:
                break
            found.append(self.blocks.pop(key))
            self.blocks[key] = found[-1]  # most recently used now
        return found

    def allocate(self, seq_id: int, tokens: Sequence[int]) -> int:
        """Start ``seq_id`` with the cached blocks of its prefix; return the positions they cover.

        At least one token is left to run, so that the model gives the next token's logits.
        """
        blocks = self.match(list(tokens)[:-1])
        self.cache.allocate(seq_id)
        for block in blocks:
            self.cache.ref_counts[block] += 1
        self.cache.block_tables[seq_id] = list(blocks)
        self.cache.lengths[seq_id] = len(blocks) * self.cache.block_size
        self.hits += len(blocks)
        return self.cache.lengths[seq_id]

    def insert(self, seq_id: int, tokens: Sequence[int]) -> None:
        """Record the full blocks of ``seq_id``, whose cached positions hold ``tokens``."""
        table = self.cache.block_tables[seq_id]
        for key, block in zip(self.keys_of(list(tokens)[: self.cache.lengths[seq_id]]), table):
            if key not in self.blocks:
                self.blocks[key] = block
                self.cache.ref_counts[block] += 1

    def evict(self, count: int) -> int:
        """Free up to ``count`` blocks that only the prefix cache holds (least recently used first)."""
        freed = 0
        for key in list(self.blocks):
            if freed == count:
                break
            block = self.blocks[key]
            if int(self.cache.ref_counts[block]) == 1:
                del self.blocks[key]
                self.cache._release_block(block)
                freed += 1
        return freed

    def reclaimable(self) -> int:
        """Blocks :meth:`evict` could free now."""
        return sum(int(self.cache.ref_counts[b]) == 1 for b in self.blocks.values())


# ---------------------------------------------------------------------------------------------------------
# The preemptive scheduler
# ---------------------------------------------------------------------------------------------------------
@torch.no_grad()
def serve_preemptive(
    model: torch.nn.Module,
    requests: Sequence[Request],
    cache: PagedKVCache,
    max_batch: int = 64,
    watermark: float = 0.01,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    attention: str = "gather",
    prefix_cache: PrefixCache | None = None,
    record_tables: bool = False,
) -> ServingLog:
    """Continuous batching that does not know output lengths: admit while blocks last, preempt when they run out.

    Policy (vLLM's default):

    1. **Admit** waiting requests in order of arrival while the batch has fewer than ``max_batch`` sequences
       and, after the blocks of the request's prompt (its generated tokens included, if it was preempted),
       at least ``watermark x num_blocks`` blocks stay free. Its prompt runs through the model in one call
       and gives its next token.
    2. **Grow**: one decoding step for every running sequence; a sequence takes a new block only when its
       last one is full.
    3. **Preempt**: if the step needs more blocks than are free, the most recently admitted running request
       is preempted, repeatedly, until the rest fit: its blocks are freed and it returns to the queue, ahead
       of later arrivals, with the tokens it has generated (recomputed on readmission).
    4. A request leaves when it has ``output_length`` tokens (standing in for an end-of-sequence token the
       scheduler cannot foresee) and frees its blocks.

    The earliest admitted request is never preempted while others run, and a request alone always fits
    (checked up front), so every request finishes: no starvation. At temperature 0 every request gets the
    tokens it would get served alone.

    Args:
        model: a :class:`~attention_course.DecoderOnlyLM` in eval mode.
        requests: the trace (``arrival`` in steps).
        cache: the block pool (its size is the memory budget).
        max_batch: most sequences decoded at once.
        watermark: share of the pool kept free at admission, so that running sequences can grow.
        temperature, generator: sampling (0: greedy).
        attention: ``"gather"`` or ``"in_place"`` (:func:`~attention_course.paged_forward`).
        prefix_cache: a :class:`PrefixCache` over ``cache`` to reuse full prompt blocks, or None.
        record_tables: keep a copy of every block table after each step.

    Returns:
        A :class:`~attention_course.serving.ServingLog` with ``preemptions`` counted and times in seconds.

    Raises:
        OutOfBlocksError: a request needs more blocks than the whole pool.
    """
    requests = _check_trace(requests, max_batch)
    if not 0 <= watermark < 1:
        raise ValueError(f"watermark must be a share of the pool in [0, 1), got {watermark!r}")
    if prefix_cache is not None and prefix_cache.cache is not cache:
        raise ValueError("prefix_cache must wrap the same PagedKVCache as cache")
    for r in requests:
        need = cache.blocks_needed(r.prompt.numel() + r.output_length)
        if need > cache.num_blocks:
            raise OutOfBlocksError(f"request {r.request_id} needs {need} blocks alone, the pool has "
                                   f"{cache.num_blocks}")
    keep_free = int(watermark * cache.num_blocks)
    log, waiting, running = ServingLog(), list(requests), []
    order = {r.request_id: i for i, r in enumerate(requests)}  # arrival order: the queue's priority
    device = requests[0].prompt.device if requests else "cpu"
    start_time, step = time.perf_counter(), 0

    def now() -> float:
        return time.perf_counter() - start_time

    def free_now() -> int:
        return cache.num_free_blocks + (prefix_cache.reclaimable() if prefix_cache is not None else 0)

    def take(count: int) -> None:  # make `count` blocks free, evicting cached prefixes first
        if prefix_cache is not None and cache.num_free_blocks < count:
            prefix_cache.evict(count - cache.num_free_blocks)

    while waiting or running:
        while not running and waiting[0].arrival > step:  # idle until the next arrival
            log.batch_sizes.append(0)
            log.blocks_used.append(cache.num_used_blocks)
            log.positions_held.append(sum(cache.lengths.values()))
            if record_tables:
                log.block_tables.append({i: list(t) for i, t in cache.block_tables.items()})
            step += 1
        for r in waiting:
            if r.arrival <= step and r.request_id not in log.arrival_time:
                log.arrival_time[r.request_id] = now()
        # 1. admit
        while waiting and waiting[0].arrival <= step and len(running) < max_batch:
            request = waiting[0]
            sequence = request.prompt.tolist() + log.outputs.get(request.request_id, [])
            cached, available = 0, cache.num_free_blocks
            if prefix_cache is not None:  # blocks found in the prefix cache are not taken from the free ones
                hits = prefix_cache.peek(sequence)
                available += prefix_cache.reclaimable() - sum(int(cache.ref_counts[b]) == 1 for b in hits)
                cached = len(hits) * cache.block_size
            need = cache.blocks_needed(len(sequence)) - cached // cache.block_size
            if need > available - (keep_free if running else 0):
                break
            waiting.pop(0)
            if prefix_cache is not None:
                cached = prefix_cache.allocate(request.request_id, sequence)
                take(cache.blocks_needed(len(sequence)) - len(cache.block_tables[request.request_id]))
            else:
                cache.allocate(request.request_id)
            feed = torch.tensor([sequence[cached:]], device=device)
            logits = paged_forward(model, cache, [request.request_id], feed, attention)
            log.prefill_tokens += feed.size(1)
            log.cached_prefix_tokens += cached
            if prefix_cache is not None:
                prefix_cache.insert(request.request_id, sequence)
            token = _next_tokens(logits[:, -1], temperature, generator)
            if request.request_id not in log.outputs:
                log.outputs[request.request_id] = []
                log.first_token_step[request.request_id] = step
                log.first_token_time[request.request_id] = now()
            log.outputs[request.request_id] += token
            log.events.append((step, request.request_id, "start"))
            running.append(request)
        # 2. grow (and 3. preempt when the pool cannot)
        decoding = [r for r in running if len(log.outputs[r.request_id]) < r.output_length]
        while decoding:
            need = sum(cache.lengths[r.request_id] % cache.block_size == 0 for r in decoding)
            if need <= free_now():
                take(need)
                break
            victim = running.pop()  # the most recently admitted
            cache.free(victim.request_id)
            log.preemptions += 1
            log.events.append((step, victim.request_id, "preempt"))
            waiting.append(victim)
            waiting.sort(key=lambda r: order[r.request_id])
            decoding = [r for r in decoding if r is not victim]
        if decoding:
            ids = [r.request_id for r in decoding]
            last = torch.tensor([[log.outputs[i][-1]] for i in ids], device=device)
            logits = paged_forward(model, cache, ids, last, attention)[:, -1]  # (B, V)
            for i, token in zip(ids, _next_tokens(logits, temperature, generator)):
                log.outputs[i].append(token)
        log.batch_sizes.append(len(running))
        step += 1
        for request in [r for r in running if len(log.outputs[r.request_id]) >= r.output_length]:
            running.remove(request)
            cache.free(request.request_id)
            log.finish_step[request.request_id] = step
            log.finish_time[request.request_id] = now()
            log.events.append((step, request.request_id, "finish"))
        log.blocks_used.append(cache.num_used_blocks)
        log.positions_held.append(sum(cache.lengths.values()))
        if record_tables:
            log.block_tables.append({i: list(t) for i, t in cache.block_tables.items()})
    log.steps, log.seconds = step, now()
    return log


# ---------------------------------------------------------------------------------------------------------
# Static batching with a contiguous reservation
# ---------------------------------------------------------------------------------------------------------
@torch.no_grad()
def serve_reserved(
    model: torch.nn.Module,
    requests: Sequence[Request],
    memory_positions: int,
    reserve: int,
    max_batch: int = 64,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
) -> ServingLog:
    """Static batching over a contiguous KV cache that reserves ``reserve`` positions per request.

    A budget of ``memory_positions`` cached positions holds ``min(max_batch, memory_positions // reserve)``
    requests; a batch of that many arrived requests runs until its longest is done (a finished row keeps its
    reservation and its slot), then the next batch starts. ``reserve`` is what a contiguous server must
    promise without knowing output lengths: the model's context (``max_len``), or at best the longest
    request the trace allows.

    Returns:
        A :class:`~attention_course.serving.ServingLog` (times in seconds; ``blocks_used`` holds the positions
        reserved at each step).

    Raises:
        ValueError: a request longer than ``reserve``, or a budget below one reservation.
    """
    requests = _check_trace(requests, max_batch)
    check_int("memory_positions", memory_positions)
    check_int("reserve", reserve)
    batch_size = min(max_batch, memory_positions // reserve)
    if batch_size < 1:
        raise ValueError(f"memory_positions={memory_positions} holds no reservation of {reserve} positions")
    for r in requests:
        if r.prompt.numel() + r.output_length > reserve:
            raise ValueError(f"request {r.request_id} needs {r.prompt.numel() + r.output_length} positions, "
                             f"more than the reservation of {reserve}")
    log, waiting = ServingLog(), list(requests)
    device = requests[0].prompt.device if requests else "cpu"
    start_time, step = time.perf_counter(), 0

    def now() -> float:
        return time.perf_counter() - start_time

    while waiting:
        while waiting[0].arrival > step:
            log.batch_sizes.append(0)
            log.blocks_used.append(0)
            step += 1
        batch = [r for r in waiting if r.arrival <= step][:batch_size]
        for r in batch:
            waiting.remove(r)
            log.arrival_time[r.request_id] = now()
        for r in waiting:
            if r.arrival <= step and r.request_id not in log.arrival_time:
                log.arrival_time[r.request_id] = now()
        # one contiguous reservation of `reserve` positions per row (a pool of blocks that long)
        pool = PagedKVCache.for_model(model, block_size=reserve, num_blocks=len(batch))
        for row, r in enumerate(batch):
            pool.allocate(row)
            logits = paged_forward(model, pool, [row], r.prompt.reshape(1, -1))
            log.prefill_tokens += r.prompt.numel()
            log.outputs[r.request_id] = _next_tokens(logits[:, -1], temperature, generator)
            log.first_token_step[r.request_id] = step
            log.first_token_time[r.request_id] = now()
            log.events.append((step, r.request_id, "start"))
        longest = max(r.output_length for r in batch)
        rows = list(range(len(batch)))
        for _ in range(longest - 1):
            last = torch.tensor([[log.outputs[r.request_id][-1]] for r in batch], device=device)
            tokens = _next_tokens(paged_forward(model, pool, rows, last)[:, -1], temperature, generator)
            log.batch_sizes.append(len(batch))
            log.blocks_used.append(len(batch) * reserve)
            step += 1
            for r, token in zip(batch, tokens):
                if len(log.outputs[r.request_id]) < r.output_length:  # a finished row's token is wasted
                    log.outputs[r.request_id].append(token)
                    if len(log.outputs[r.request_id]) == r.output_length:
                        log.finish_time[r.request_id] = now()
                        log.finish_step[r.request_id] = step
        if longest == 1:
            step += 1
        for r in batch:
            log.finish_time.setdefault(r.request_id, now())
            log.finish_step.setdefault(r.request_id, step)
            log.events.append((step, r.request_id, "finish"))
    log.steps, log.seconds = step, now()
    return log

