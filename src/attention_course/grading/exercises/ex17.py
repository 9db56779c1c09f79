"""Exercise 17, serving attention: the checks behind ``exercises/ex17_serving_attention.ipynb``.

The learner writes the block-table lookup of a paged KV cache, the verification step of speculative decoding
(the draft tokens accepted, and the distribution the next token is drawn from), the arithmetic intensity of
a decoding step, one step of a preemptive scheduler's memory (grow or preempt the newest, by recompute) and
decode attention read from the blocks in place (an online softmax over the block table), checked against their
definitions in float64. Every case's verdict for a known mistake is fixed by construction, not by the draw.
Mistakes recognised: an offset one slot off, the logical block for the physical one, accepting without the
ratio ``p/q``, the replacement drawn from the target instead of the residual, no factor 2 for keys and values,
one cache for the batch, weights read per sequence, a preempted sequence's blocks kept or its generated tokens
lost, the oldest preempted, the last block's tail unmasked, the running state not rescaled, no 1/sqrt(d).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from attention_course.grading.compare import matches
from attention_course.grading.declare import Check, Out, View
from attention_course.grading.findings import FailureKind, Finding
from attention_course.grading.spec import Case, Exercise, Mistake, Part, preamble, with_texts

PREAMBLE = preamble()


# --- part 1: the block-table lookup -------------------------------------------------------------------------
def _lookup_cases(g: torch.Generator) -> list[Case]:
    def table(blocks: int, pool: int) -> torch.Tensor:
        # physical blocks in no particular order, none equal to its entry (ids >= blocks): returning the entry
        # instead of the block is wrong at every position, on every draw
        return blocks + torch.randperm(pool - blocks, generator=g)[:blocks]

    return [
        Case("block size 4, a table of 3 blocks, positions 0..11 in order", (torch.arange(12), table(3, 10), 4)),
        Case("block size 16, a table of 5 blocks, 20 random positions",
             (torch.randint(0, 80, (20,), generator=g), table(5, 32), 16)),
        Case("block size 2, positions 0..5", (torch.arange(6), table(3, 9), 2)),
        Case("block size 8, the last slot of each block (7, 15, 23)", (torch.tensor([7, 15, 23]), table(3, 12), 8)),
        Case("block size 3, positions out of order", (torch.tensor([8, 0, 5, 3, 6]), table(3, 7), 3)),
    ]


def _lookup(positions: torch.Tensor, block_table: torch.Tensor, block_size: int, shift: int = 0,
            logical: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    index = ((positions + shift) // block_size).clamp(max=block_table.numel() - 1)
    offsets = (positions + shift) % block_size
    return (index if logical else block_table[index]), offsets


def _lookup_mistake(message: str, **wrong: Any) -> Mistake:
    """A wrong lookup, told by its blocks where its offsets are the learner's too."""
    def variant(v: View) -> torch.Tensor | None:
        blocks, offsets = _lookup(*v.args, **wrong)
        return blocks if torch.equal(v.got.offsets.long(), offsets) else None
    return Mistake(variant, message, on="blocks")


def _first_wrong(v: View) -> str | None:
    """The first position whose block (else whose offset) is wrong, and where the right one comes from."""
    positions, block_table, block_size = v.args
    wrong_blocks = v.got.blocks.long() != v.want.blocks
    wrong = wrong_blocks if wrong_blocks.any() else v.got.offsets.long() != v.want.offsets
    if not wrong.any():
        return None
    i = int(wrong.nonzero()[0])
    position = int(positions[i])
    if wrong_blocks.any():
        return (f"position {position}: your block is {int(v.got.blocks[i])}, expected {int(v.want.blocks[i])} "
                f"(entry {position // block_size} of the table {block_table.tolist()})")
    return (f"position {position}: your offset is {int(v.got.offsets[i])}, expected {int(v.want.offsets[i])} "
            f"(position % block_size with block_size {block_size})")


_LOCATE = Check(
    reference=lambda v: _lookup(*v.args),
    outputs=(Out("blocks", floating=False, finite=False), Out("offsets", floating=False, finite=False)),
    mistakes=(*(_lookup_mistake("your offsets (and blocks) are one slot off: token p sits at slot p % block_size of "
                                "entry p // block_size, counting from 0", shift=shift) for shift in (1, -1)),
              _lookup_mistake("you returned the entry of the table (p // block_size), not the physical block stored "
                              "there: look it up in block_table", logical=True),
              *(Mistake(lambda v, shift=shift: (v.args[0] + shift) % v.args[2],
                        f"your offsets are one slot off (those of position p {'+' if shift > 0 else '-'} 1): token p "
                        "sits at slot p % block_size of its block, counting from 0", on="offsets")
                for shift in (1, -1))),
    matches=lambda got, wrong: torch.equal(got.long(), wrong),
    explain=(_first_wrong,),
)


# --- part 2: verifying a draft ------------------------------------------------------------------------------
def _verify_cases(g: torch.Generator) -> list[Case]:
    """Every verdict fixed by construction (issue 43): the random distributions are drawn, but each draft token
    and each u is chosen against its acceptance ratio, so which tokens are accepted never depends on the draw.
    A token meant to be accepted is one the target likes at least as much as the draft (ratio >= 1, accepted for
    any u); the token meant to be rejected is the one with the smallest ratio p/q < 1, with u halfway between
    the ratio and 1 (rejected by the rule, accepted by a rule without the ratio)."""
    def distributions(rows: int, vocab: int) -> torch.Tensor:
        return torch.softmax(2.0 * torch.randn(rows, vocab, generator=g, dtype=torch.float64), dim=-1)

    def planned(name: str, k: int, vocab: int, reject_at: int | None, same: bool = False) -> Case:
        p_target = distributions(k + 1, vocab)
        p_draft = p_target[:k].clone() if same else distributions(k, vocab)
        ratios = p_target[:k] / p_draft
        draft = ratios.argmax(-1)  # ratio >= 1: accepted whatever u is
        uniforms = torch.rand(k, generator=g, dtype=torch.float64) * 0.999
        if reject_at is not None:
            draft[reject_at] = ratios[reject_at].argmin()
            uniforms[reject_at] = (1 + ratios[reject_at].min()) / 2
        return Case(name, (draft, p_target, p_draft, uniforms))

    # A draft token the draft likes more than the target, with u above the ratio: it must be rejected.
    p_target = torch.tensor([[0.10, 0.60, 0.30], [0.20, 0.30, 0.50]], dtype=torch.float64)
    p_draft = torch.tensor([[0.50, 0.25, 0.25]], dtype=torch.float64)
    return [
        Case("one draft token with p_target 0.1 < p_draft 0.5 and u = 0.4 (> 0.1 / 0.5)",
             (torch.tensor([0]), p_target, p_draft, torch.tensor([0.4], dtype=torch.float64))),
        Case("the same token with u = 0.15 (< 0.1 / 0.5 = 0.2)",
             (torch.tensor([0]), p_target, p_draft, torch.tensor([0.15], dtype=torch.float64)), credit=False),
        planned("4 draft tokens, vocabulary 6, the third rejected (u above p/q)", 4, 6, reject_at=2),
        planned("3 draft tokens, vocabulary 10, the first rejected", 3, 10, reject_at=0),
        planned("5 draft tokens, vocabulary 8, the last rejected", 5, 8, reject_at=4),
        dataclasses.replace(planned("the draft equals the target: all accepted, the bonus distribution", 3, 5,
                                    None, same=True), credit=False),
        dataclasses.replace(planned("2 draft tokens the target likes more than the draft: both accepted", 2, 4,
                                    None), credit=False),
    ]


def _verify_draft(draft: torch.Tensor, p_target: torch.Tensor, p_draft: torch.Tensor, uniforms: torch.Tensor,
                  ratio: bool = True, residual_from_target: bool = False) -> tuple[int, torch.Tensor]:
    for i, token in enumerate(draft.tolist()):
        p, q = float(p_target[i, token]), float(p_draft[i, token])
        accept = float(uniforms[i]) < min(1.0, p / q) if ratio else True  # without the ratio: always
        if not accept:
            if residual_from_target:
                return i, p_target[i]
            residual = (p_target[i] - p_draft[i]).clamp_min(0)
            return i, residual / residual.sum()
    return draft.numel(), p_target[draft.numel()]


def _count(v: View) -> str | None:
    """A wrong number of accepted tokens, told when it is what accepting without the ratio p/q gives."""
    draft, p_target, p_draft, uniforms = v.args
    n, expected_n = int(v.got.num_accepted), int(v.want.num_accepted)
    if n == expected_n:
        return None
    if n > expected_n and n == _verify_draft(*v.args, ratio=False)[0]:
        token = int(draft[expected_n])
        return (f"draft token {expected_n} (id {token}) has p_target {float(p_target[expected_n, token]):.3g} < "
                f"p_draft {float(p_draft[expected_n, token]):.3g} and u = {float(uniforms[expected_n]):.3g} is "
                "above their ratio: accept with probability min(1, p/q), not whenever it is merely possible")
    return f"you accepted {n} draft tokens, expected {expected_n}: token i is kept while u_i < min(1, p/q)"


def _residual_from_target(v: View) -> torch.Tensor | None:
    n, distribution = _verify_draft(*v.args, residual_from_target=True)
    return distribution if int(v.got.num_accepted) == n else None


_VERIFY = Check(
    reference=lambda v: tuple(torch.tensor(float(t), dtype=torch.float64) if isinstance(t, int) else t
                              for t in _verify_draft(*v.args)),
    outputs=(Out("num_accepted", scalar=True),
             Out("distribution", lambda v: "the residual max(0, p - q) normalised" if int(v.want.num_accepted) <
                 v.args[0].numel() else "the target's distribution after the last draft token", atol=1e-6)),
    explain=(_count,),
    mistakes=(Mistake(_residual_from_target, "after a rejection your next token comes from the target's distribution "
                      "p: it must come from the residual max(0, p - q), normalised (what acceptance left missing), or "
                      "the output is not distributed as p", on="distribution"),),
    matches=lambda got, wrong: matches(got, wrong, atol=1e-6, rtol=1e-5),
)


# --- part 3: the arithmetic intensity of a decode step ------------------------------------------------------
def _intensity_cases(g: torch.Generator) -> list[Case]:
    def contexts(batch: int, low: int, high: int) -> torch.Tensor:
        return torch.randint(low, high + 1, (batch,), generator=g)

    seven_b = (6_700_000_000, 32, 4096)  # (num_params, num_layers, d_model) of a 7B model
    return [  # (num_params, num_layers, d_model, d_kv, contexts, bytes_per_value)
        Case("chapter 13's model: 4 sequences of 8 to 32 positions, float32",
             (80_000, 2, 48, 48, contexts(4, 8, 32), 4)),
        Case("a 7B model, multi-head, 16 sequences of 1,000 to 4,000 positions, 16-bit",
             (*seven_b, 4096, contexts(16, 1000, 4000), 2)),
        Case("a 7B model with 8 KV heads (d_kv = 1024), 64 sequences", (*seven_b, 1024, contexts(64, 100, 8000), 2)),
        Case("12 layers of width 256, 7 sequences, float32", (10_000_000, 12, 256, 128, contexts(7, 1, 3000), 4)),
        # three, not two: with two sequences of one position, one cache for the batch (max) and keys without
        # values (kv=1) give the same number, and the learner would be told the wrong mistake
        Case("3 sequences of one position each", (80_000, 2, 48, 48, torch.ones(3, dtype=torch.long), 4)),
    ]


def _intensity(num_params: int, num_layers: int, d_model: int, d_kv: int, contexts: torch.Tensor,
               bytes_per_value: int, kv: int = 2, cache_per_sequence: bool = True,
               weights_per_sequence: bool = False) -> float:
    batch, total = contexts.numel(), int(contexts.sum())
    flops = batch * 2 * num_params + 4 * num_layers * d_model * total
    cached = total if cache_per_sequence else int(contexts.max())  # the mistake: one cache for all
    cache = kv * num_layers * d_kv * cached
    weights = num_params * (batch if weights_per_sequence else 1)
    return flops / (bytes_per_value * (weights + cache))


def _ratio_matches(actual: Any, expected: float) -> bool:
    return abs(float(actual) / expected - 1) < 1e-6


_INTENSITY = Check(
    reference=lambda v: torch.tensor(_intensity(*v.args), dtype=torch.float64),
    outputs=(Out("intensity", scalar=True),),
    mistakes=(Mistake(lambda v: _intensity(*v.args, kv=1),
                      "the cache holds keys AND values: 2 * layers * d_kv numbers per cached position"),
              Mistake(lambda v: _intensity(*v.args, cache_per_sequence=False), "each sequence reads its own cache: "
                      "the cache traffic is the sum over the sequences (only the weights are shared)"),
              Mistake(lambda v: _intensity(*v.args, weights_per_sequence=True), "the weights are read once per step "
                      "for the whole batch, not once per sequence: that sharing is what batching buys")),
    matches=_ratio_matches,
    explain=(lambda v: None if _ratio_matches(v.got.intensity, float(v.want.intensity)) else
             f"your intensity is {float(v.got.intensity):.6g} FLOP/byte, expected {float(v.want.intensity):.6g}",),
)


# --- part 4: making room, or preempting -------------------------------------------------------------------
def _room_cases(g: torch.Generator) -> list[Case]:
    """Running sequences in admission order; which ones must be preempted is fixed by construction (the free
    blocks are counted against the blocks the step needs), only the block ids and token counts are drawn."""
    def case(name: str, lengths: list[int], blocks_held: list[int], free: int, block_size: int,
             credit: bool = True) -> Case:
        ids = torch.randperm(sum(blocks_held) + free, generator=g)
        width = max(blocks_held)
        tables = torch.full((len(lengths), width), -1, dtype=torch.long)
        start = 0
        for row, n in enumerate(blocks_held):
            tables[row, :n] = ids[start : start + n]
            start += n
        prompts = torch.tensor([1 + int(torch.randint(0, length, (1,), generator=g)) for length in lengths])
        prompts = torch.minimum(prompts, torch.tensor(lengths) - 1).clamp_min(1)
        generated = torch.tensor(lengths) - prompts + 1  # the newest token is not cached yet
        return Case(name, (torch.tensor(lengths), tables, ids[start:].sort().values, prompts, generated,
                           block_size), credit=credit)

    return [
        case("4 sequences, 2 need a new block, 3 blocks free: nobody is preempted", [8, 5, 12, 7], [2, 2, 3, 2],
             3, 4, credit=False),
        case("3 sequences, 2 need a new block, 1 free: the newest (which needs one) is preempted",
             [8, 6, 12], [2, 2, 3], 1, 4),
        case("3 sequences, only the first needs a block, none free: the newest gives back its 2 blocks",
             [8, 6, 7], [2, 2, 2], 0, 4),
        case("5 sequences of block size 8, all need a block, 1 free: the newest two are preempted",
             [16, 8, 24, 8, 16], [2, 1, 3, 1, 2], 1, 8),
        case("2 sequences, both need a block, none free: the newest goes, the oldest grows",
             [4, 4], [1, 1], 0, 4),
    ]


def _make_room(lengths: torch.Tensor, tables: torch.Tensor, free: torch.Tensor, prompts: torch.Tensor,
               generated: torch.Tensor, block_size: int, frees_victims: bool = True, keeps_tokens: bool = True,
               oldest_first: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    keep = torch.ones(lengths.numel(), dtype=torch.bool)
    needs = lengths % block_size == 0
    pool = free.tolist()
    order = list(range(lengths.numel()))
    while int((needs & keep).sum()) > len(pool):
        victim = next(r for r in (order if oldest_first else reversed(order)) if keep[r])
        keep[victim] = False
        if frees_victims:
            pool += [int(b) for b in tables[victim] if int(b) >= 0]
    pool.sort()
    taken = int((needs & keep).sum())
    recompute = torch.where(keep, torch.zeros_like(prompts), prompts + (generated if keeps_tokens else 0))
    return keep, recompute, torch.tensor(pool[taken:], dtype=torch.long)


_NOT_FREED = ("a preempted sequence's blocks must go back to the free list: that is what preempting is for (and "
              "the blocks it frees may spare the next sequence)")


def _victims_kept(v: View) -> Finding | None:
    """A free list that is short by exactly the preempted sequences' blocks (it has another length than the right
    one, so the shape check would otherwise speak first)."""
    out = v.output
    free = out[2] if isinstance(out, (tuple, list)) and len(out) == 3 else None
    if not isinstance(free, torch.Tensor) or free.dim() != 1 or free.shape == v.want.free.shape \
            or free.is_floating_point():
        return None
    kept = _make_room(*v.args, frees_victims=False)[2]
    return Finding(_NOT_FREED, FailureKind.KNOWN_MISTAKE) if torch.equal(free.long(), kept) else None


_ROOM = Check(
    reference=lambda v: _make_room(*v.args),
    outputs=(Out("keep", floating=False, finite=False),
             Out("recompute", floating=False, finite=False),
             Out("free", floating=False, finite=False)),
    before=(_victims_kept,),
    mistakes=(Mistake(lambda v: _make_room(*v.args, frees_victims=False)[2], _NOT_FREED, on="free"),
              Mistake(lambda v: _make_room(*v.args, keeps_tokens=False)[1],
                      "a preempted request keeps the tokens it has generated: when readmitted it recomputes its "
                      "prompt AND those tokens (prompt + generated), or its answer restarts and differs",
                      on="recompute"),
              Mistake(lambda v: _make_room(*v.args, oldest_first=True)[0],
                      "preempt the most recently admitted sequence (the last row), not the oldest: the oldest "
                      "must keep running, or a request can starve", on="keep")),
    matches=lambda got, wrong: torch.equal(got.long(), wrong.long()),
)


# --- part 5: attention read from the blocks in place ---------------------------------------------------------
def _paged_cases(g: torch.Generator) -> list[Case]:
    """One query per head against a sequence scattered over a pool. The slots past the sequence's length hold
    large keys (a mask that forgets them changes the result), and the largest score sits in a later block than
    the first (an online softmax that does not rescale its running state is wrong)."""
    def case(name: str, heads: int, d: int, block_size: int, length: int, pool: int) -> Case:
        blocks = -(-length // block_size)
        table = blocks + torch.randperm(pool - blocks, generator=g)[:blocks]  # never the identity
        keys = torch.randn(pool, heads, block_size, d, generator=g, dtype=torch.float64)
        values = torch.randn(pool, heads, block_size, d, generator=g, dtype=torch.float64)
        query = torch.randn(heads, d, generator=g, dtype=torch.float64)
        query = query / query.norm(dim=-1, keepdim=True) * math.sqrt(d)  # |q|^2 = d: scores ~ N(0, 1) * sqrt(d)
        slot = (length - 1) % block_size
        keys[table[-1], :, slot + 1 :] = 12.0 * query[:, None, :]  # past the end: would dominate if read
        keys[table[-1], :, slot] = 4.0 * query  # the largest real score (4 sqrt(d)), in the last block
        return Case(name, (query, keys, values, table, length))

    return [
        case("2 heads of 4, block size 4, 10 positions in 3 scattered blocks", 2, 4, 4, 10, 9),
        case("1 head of 8, block size 8, 21 positions", 1, 8, 8, 21, 7),
        case("4 heads of 2, block size 2, 7 positions", 4, 2, 2, 7, 12),
        case("3 heads of 16, block size 16, 50 positions (the last block holds 2)", 3, 16, 16, 50, 8),
    ]


def _paged_decode(query: torch.Tensor, key_pool: torch.Tensor, value_pool: torch.Tensor, block_table: torch.Tensor,
                  length: int, mask_tail: bool = True, rescale: bool = True, scale: bool = True) -> torch.Tensor:
    heads, d = query.shape
    block_size = key_pool.size(2)
    factor = 1 / math.sqrt(d) if scale else 1.0
    m = torch.full((heads,), -math.inf, dtype=query.dtype)
    total = torch.zeros(heads, dtype=query.dtype)
    acc = torch.zeros(heads, d, dtype=query.dtype)
    for j, block in enumerate(block_table.tolist()):
        scores = torch.einsum("hd,hsd->hs", query, key_pool[block]) * factor
        if mask_tail:
            scores[:, max(0, length - j * block_size) :] = -math.inf
        new_m = torch.maximum(m, scores.amax(-1))
        weights = torch.exp(scores - new_m[:, None])
        shrink = torch.exp(m - new_m) if rescale else torch.ones_like(m)
        total = total * shrink + weights.sum(-1)
        acc = acc * shrink[:, None] + torch.einsum("hs,hsd->hd", weights, value_pool[block])
        m = new_m
    return acc / total[:, None]


_PAGED = Check(
    reference=lambda v: _paged_decode(*v.args),
    outputs=(Out("output", "softmax(q · K / sqrt(d)) V over the sequence's positions 0..length-1", atol=1e-6),),
    mistakes=(Mistake(lambda v: _paged_decode(*v.args, mask_tail=False),
                      "the slots of the last block past `length` are not the sequence's: mask them out"),
              Mistake(lambda v: _paged_decode(*v.args, rescale=False),
                      "when a block raises the running maximum, the running sum and the output so far must be "
                      "multiplied by exp(old max - new max)"),
              Mistake(lambda v: _paged_decode(*v.args, scale=False), "scale the scores by 1/sqrt(d)")),
)


EXERCISE = with_texts(Exercise(  # title, summaries and hints: ex17.toml
    id="ex17", chapters=("17_serving_attention",), preamble=PREAMBLE,
    parts=(
        Part("locate", points=2, make_cases=_lookup_cases, verify=_LOCATE),
        Part("verify_draft", points=4, make_cases=_verify_cases, verify=_VERIFY),
        Part("decode_intensity", points=2, make_cases=_intensity_cases, verify=_INTENSITY),
        Part("make_room", points=3, make_cases=_room_cases, verify=_ROOM),
        Part("paged_decode", points=3, make_cases=_paged_cases, verify=_PAGED),
    ),
))
