"""Exercise 17, serving attention: the checks behind ``exercises/ex17_serving_attention.ipynb``.

The learner writes the block-table lookup of a paged KV cache, the verification step of speculative decoding
(the draft tokens accepted, and the distribution the next token is drawn from) and the arithmetic intensity of
a decoding step, checked against their definitions in float64. Mistakes recognised: an offset one slot off, the
logical block for the physical one, accepting without the ratio ``p/q``, the replacement drawn from the target
instead of the residual, no factor 2 for keys and values, one cache for the batch, weights read per sequence.
"""

from __future__ import annotations

from typing import Any

import torch

from attention_course.grading.compare import matches
from attention_course.grading.declare import Check, Out, View
from attention_course.grading.spec import Case, Exercise, Mistake, Part, preamble, with_texts

PREAMBLE = preamble()


# --- part 1: the block-table lookup -------------------------------------------------------------------------
def _lookup_cases(g: torch.Generator) -> list[Case]:
    def table(blocks: int, pool: int) -> torch.Tensor:
        return torch.randperm(pool, generator=g)[:blocks]  # physical blocks in no particular order

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
                              "there: look it up in block_table", logical=True)),
    matches=lambda got, wrong: torch.equal(got.long(), wrong),
    explain=(_first_wrong,),
)


# --- part 2: verifying a draft ------------------------------------------------------------------------------
def _verify_cases(g: torch.Generator) -> list[Case]:
    def distributions(rows: int, vocab: int) -> torch.Tensor:
        return torch.softmax(2.0 * torch.randn(rows, vocab, generator=g, dtype=torch.float64), dim=-1)

    def case(name: str, k: int, vocab: int, uniforms: torch.Tensor | None = None, same: bool = False) -> Case:
        p_target = distributions(k + 1, vocab)
        p_draft = p_target[:k].clone() if same else distributions(k, vocab)
        draft = torch.multinomial(p_draft, 1, generator=g)[:, 0]
        if uniforms is None:
            uniforms = torch.rand(k, generator=g, dtype=torch.float64)
        return Case(name, (draft, p_target, p_draft, uniforms))

    # A draft token the draft likes more than the target, with u above the ratio: it must be rejected.
    p_target = torch.tensor([[0.10, 0.60, 0.30], [0.20, 0.30, 0.50]], dtype=torch.float64)
    p_draft = torch.tensor([[0.50, 0.25, 0.25]], dtype=torch.float64)
    return [
        Case("one draft token with p_target 0.1 < p_draft 0.5 and u = 0.4 (> 0.1 / 0.5)",
             (torch.tensor([0]), p_target, p_draft, torch.tensor([0.4], dtype=torch.float64))),
        Case("the same token with u = 0.15 (< 0.1 / 0.5 = 0.2)",
             (torch.tensor([0]), p_target, p_draft, torch.tensor([0.15], dtype=torch.float64))),
        case("4 draft tokens, vocabulary 6, random u", 4, 6),
        case("3 draft tokens, vocabulary 10, u = 0.99 (rejects whenever p < q)", 3, 10,
             torch.full((3,), 0.99, dtype=torch.float64)),
        case("5 draft tokens, vocabulary 8, u = 0.5", 5, 8, torch.full((5,), 0.5, dtype=torch.float64)),
        case("the draft equals the target: all accepted, the bonus distribution", 3, 5, same=True),
        case("1 draft token, vocabulary 4, random u", 1, 4),
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
        Case("2 sequences of one position each", (80_000, 2, 48, 48, torch.ones(2, dtype=torch.long), 4)),
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


EXERCISE = with_texts(Exercise(  # title, summaries and hints: ex17.toml
    id="ex17", chapters=("17_serving_attention",), preamble=PREAMBLE,
    parts=(
        Part("locate", points=2, make_cases=_lookup_cases, verify=_LOCATE),
        Part("verify_draft", points=4, make_cases=_verify_cases, verify=_VERIFY),
        Part("decode_intensity", points=2, make_cases=_intensity_cases, verify=_INTENSITY),
    ),
))
