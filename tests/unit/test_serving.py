"""Tests of chapter 17's library: the paged KV cache, generation and batching through it, and speculative
decoding (greedy equals greedy; sampling keeps the target's distribution, by a chi-square test)."""

from __future__ import annotations

import itertools

import pytest
import torch

import attention_course as ac
from attention_course.sampling import chi_square_p_value


def _model(vocab=40, d_model=32, heads=4, layers=2, seed=0, **kwargs):
    torch.manual_seed(seed)
    return ac.DecoderOnlyLM(vocab, d_model=d_model, num_heads=heads, num_layers=layers, max_len=64,
                            **kwargs).eval()


# --- the paged cache itself ----------------------------------------------------------------------------------
def test_block_and_offset_is_divmod():
    assert [ac.block_and_offset(p, 4) for p in (0, 3, 4, 9)] == [(0, 0), (0, 3), (1, 0), (2, 1)]
    with pytest.raises(ValueError, match="position"):
        ac.block_and_offset(-1, 4)


def test_append_gather_round_trip_and_block_table():
    g = torch.Generator().manual_seed(0)
    cache = ac.PagedKVCache(num_layers=2, num_kv_heads=3, d_head=5, block_size=4, num_blocks=10)
    cache.allocate(7)
    cache.allocate(8)
    pieces = {7: [], 8: []}
    for seq, t in ((7, 3), (8, 6), (7, 5), (8, 1)):  # interleaved appends of odd sizes
        keys, values = torch.randn(2, 2, 3, t, 5, generator=g)
        cache.append(seq, keys, values)
        pieces[seq].append((keys, values))
    for seq, parts in pieces.items():
        for layer in range(2):
            keys, values = cache.gather(layer, seq)
            torch.testing.assert_close(keys, torch.cat([k[layer] for k, _ in parts], dim=1), rtol=0, atol=0)
            torch.testing.assert_close(values, torch.cat([v[layer] for _, v in parts], dim=1), rtol=0, atol=0)
    assert cache.lengths == {7: 8, 8: 7}
    assert [len(cache.block_tables[s]) for s in (7, 8)] == [2, 2]  # ceil(8/4), ceil(7/4)
    assert cache.num_used_blocks == 4 and cache.num_free_blocks == 6
    # Position 5 of sequence 7 is at offset 1 of the second block of its table.
    block, offset = ac.block_and_offset(5, 4)
    expected = torch.cat([k[1] for k, _ in pieces[7]], dim=1)[:, 5]
    torch.testing.assert_close(cache.keys[1, cache.block_tables[7][block], :, offset], expected)
    cache.free(7)
    assert cache.num_free_blocks == 8 and 7 not in cache.block_tables


def test_out_of_blocks_is_a_clear_error_and_changes_nothing():
    cache = ac.PagedKVCache(num_layers=1, num_kv_heads=1, d_head=2, block_size=4, num_blocks=2)
    cache.allocate(0)
    cache.reserve(0, 5)
    with pytest.raises(ac.OutOfBlocksError, match="needs 1 more blocks.*0 of 2 are free"):
        cache.reserve(0, 4)
    assert cache.lengths[0] == 5 and cache.num_free_blocks == 0
    cache.allocate(1)
    with pytest.raises(ac.OutOfBlocksError):
        cache.reserve(1, 1)


def test_errors_name_what_is_wrong():
    cache = ac.PagedKVCache(num_layers=1, num_kv_heads=2, d_head=3, block_size=4, num_blocks=4)
    with pytest.raises(KeyError, match="allocate it first"):
        cache.reserve(3, 1)
    cache.allocate(0)
    with pytest.raises(ValueError, match="already in the cache"):
        cache.allocate(0)
    with pytest.raises(ValueError, match="num_kv_heads=2"):
        cache.append(0, torch.zeros(1, 3, 2, 3), torch.zeros(1, 3, 2, 3))
    with pytest.raises(ValueError, match="not reserved"):
        cache.write(0, 0, 0, torch.zeros(2, 1, 3), torch.zeros(2, 1, 3))
    with pytest.raises(TypeError, match="block_size"):
        ac.PagedKVCache(1, 1, 1, block_size=2.0)
    model = _model()
    with pytest.raises(ValueError, match="max_len"):
        ac.speculative_generate(model, model, torch.tensor([1, 2]), 63)
    with pytest.raises(ValueError, match="vocabulary"):
        ac.speculative_generate(model, _model(vocab=41), torch.tensor([1, 2]), 3)
    with pytest.raises(ValueError, match="one sequence"):
        ac.paged_generate(model, torch.zeros(2, 3, dtype=torch.long), 3)


def test_fork_shares_blocks_and_copies_on_write():
    g = torch.Generator().manual_seed(1)
    cache = ac.PagedKVCache(num_layers=1, num_kv_heads=1, d_head=2, block_size=4, num_blocks=8)
    cache.allocate(0)
    prompt = torch.randn(2, 1, 1, 6, 2, generator=g)
    cache.append(0, *prompt)  # 6 positions: one full block and one half-full
    cache.fork(0, 1)
    cache.fork(0, 2)
    assert cache.num_used_blocks == 2  # three sequences, one copy of the prompt
    assert int(cache.ref_counts[cache.block_tables[0][0]]) == 3
    new = torch.randn(2, 1, 1, 1, 2, generator=g)
    cache.append(1, *new)  # writes into the shared half-full block: sequence 1 gets its own copy
    assert cache.block_tables[1][0] == cache.block_tables[0][0]  # the full block stays shared
    assert cache.block_tables[1][1] != cache.block_tables[0][1]
    assert cache.num_used_blocks == 3
    keys0, _ = cache.gather(0, 0)
    keys1, _ = cache.gather(0, 1)
    torch.testing.assert_close(keys0, prompt[0][0], rtol=0, atol=0)  # the parent is untouched
    torch.testing.assert_close(keys1, torch.cat([prompt[0][0], new[0][0]], dim=1), rtol=0, atol=0)
    for seq in (0, 1, 2):
        cache.free(seq)
    assert cache.num_free_blocks == 8 and int(cache.ref_counts.sum()) == 0


# --- the model through the paged cache -----------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [{}, {"config": ac.ModelConfig(num_kv_heads=2)},
                                    {"positions": "none", "config": ac.ModelConfig(positions="rotary")}])
def test_paged_generation_equals_contiguous_cache(kwargs):
    model = _model(**kwargs)
    prompt = torch.randint(0, 40, (7,), generator=torch.Generator().manual_seed(2))
    expected = model.generate(prompt, 20, temperature=0)
    cache = ac.PagedKVCache.for_model(model, block_size=4, num_blocks=8)  # 27 positions in 7 blocks
    assert torch.equal(ac.paged_generate(model, prompt, 20, cache=cache), expected)
    assert cache.num_free_blocks == 8  # generation freed its sequence


def test_paged_forward_batches_sequences_of_different_lengths():
    model = _model()
    g = torch.Generator().manual_seed(3)
    cache = ac.PagedKVCache.for_model(model, block_size=4, num_blocks=12)
    sequences = [torch.randint(0, 40, (n,), generator=g) for n in (3, 9, 5)]
    for seq_id, tokens in enumerate(sequences):
        cache.allocate(seq_id)
        ac.paged_forward(model, cache, [seq_id], tokens[None])
    new = torch.randint(0, 40, (3, 2), generator=g)
    logits = ac.paged_forward(model, cache, [0, 1, 2], new)  # (3, 2, V): two new tokens each
    for seq_id, tokens in enumerate(sequences):
        full = model(torch.cat([tokens, new[seq_id]])[None])[0, -2:]
        torch.testing.assert_close(logits[seq_id], full, atol=1e-5, rtol=1e-5)
    with pytest.raises(ac.OutOfBlocksError):
        ac.paged_forward(model, cache, [0, 1, 2], torch.zeros(3, 20, dtype=torch.long))
    assert cache.lengths == {0: 5, 1: 11, 2: 7}  # the failed step left no trace


def _trace(g, count=8):
    # Prompt lengths vary (3..18) so that a short output can sit next to a long prompt in a static batch.
    return [ac.Request(i, 2 * i, torch.randint(0, 40, (3 + 5 * (i % 4),), generator=g),
                       2 + int(torch.randint(1, 14, (1,), generator=g))) for i in range(count)]


def test_continuous_and_static_batching_give_greedy_outputs():
    model = _model()
    requests = _trace(torch.Generator().manual_seed(4))
    cache = ac.PagedKVCache.for_model(model, block_size=4, num_blocks=16)
    continuous = ac.serve_continuous(model, requests, cache, max_batch=3)
    static = ac.serve_static(model, requests, max_batch=3)
    for r in requests:
        expected = model.generate(r.prompt, r.output_length, temperature=0)[r.prompt.numel():].tolist()
        assert continuous.outputs[r.request_id] == expected
        assert static.outputs[r.request_id] == expected
    assert cache.num_free_blocks == 16
    assert max(continuous.batch_sizes) <= 3
    # A request alone takes output_length - 1 steps after its arrival (its first two tokens come in one).
    assert all(continuous.latencies(requests)[r.request_id] >= r.output_length - 1 for r in requests)
    assert continuous.steps <= static.steps


def test_continuous_batching_waits_for_blocks():
    model = _model()
    requests = [ac.Request(i, 0, torch.tensor([1, 2, 3]), 9) for i in range(4)]  # 12 positions: 3 blocks
    cache = ac.PagedKVCache.for_model(model, block_size=4, num_blocks=7)  # room for two at a time
    log = ac.serve_continuous(model, requests, cache, max_batch=4)
    assert max(log.batch_sizes) == 2
    with pytest.raises(ac.OutOfBlocksError, match="needs 10 blocks"):
        ac.serve_continuous(model, [ac.Request(0, 0, torch.tensor([1] * 8), 30)], cache)


# --- speculative decoding ------------------------------------------------------------------------------------
def test_speculative_accept_rule():
    p_target = torch.tensor([0.5, 0.3, 0.2])
    p_draft = torch.tensor([0.2, 0.6, 0.2])
    accepted, residual = ac.speculative_accept(1, p_target, p_draft, uniform=0.49)
    assert accepted  # 0.49 < 0.3 / 0.6
    accepted, _ = ac.speculative_accept(1, p_target, p_draft, uniform=0.51)
    assert not accepted
    torch.testing.assert_close(residual, torch.tensor([1.0, 0.0, 0.0]))  # max(0, p - q) = (0.3, 0, 0)
    assert ac.speculative_accept(0, p_target, p_draft, uniform=0.999)[0]  # p_target > p_draft: always


@pytest.mark.parametrize("draft_length", [1, 3, 6])
def test_greedy_speculative_equals_greedy(draft_length):
    target, draft = _model(seed=0), _model(d_model=16, heads=2, layers=1, seed=1)
    prompt = torch.randint(0, 40, (5,), generator=torch.Generator().manual_seed(5))
    result = ac.speculative_generate(target, draft, prompt, 30, draft_length=draft_length, temperature=0)
    assert torch.equal(result.tokens, target.generate(prompt, 30, temperature=0))
    # The draft checked against itself is always accepted: k + 1 tokens per target call.
    self_check = ac.speculative_generate(target, target, prompt, 30, draft_length=draft_length, temperature=0)
    assert self_check.acceptance_rate == 1.0
    assert torch.equal(self_check.tokens, result.tokens)


def _sequence_distribution(model, prompt, vocab, length):
    """Exact probability of every continuation of ``length`` tokens under ``model``'s sampling."""
    sequences = list(itertools.product(range(vocab), repeat=length))
    batch = torch.tensor([prompt.tolist() + list(s) for s in sequences])
    with torch.no_grad():
        log_probs = torch.log_softmax(model(batch).double(), dim=-1)  # (N, L, V)
    start = prompt.numel() - 1
    picked = log_probs[:, start : start + length].gather(-1, batch[:, prompt.numel():, None])[..., 0]
    return picked.sum(-1).exp(), sequences


def test_speculative_sampling_keeps_the_target_distribution():
    vocab, length, draws = 4, 2, 1200
    target = _model(vocab=vocab, d_model=16, heads=2, layers=1, seed=20)
    draft = _model(vocab=vocab, d_model=16, heads=2, layers=1, seed=21)
    with torch.no_grad():  # sharpen both models so that they disagree clearly
        for model in (target, draft):
            model.lm_head.weight.mul_(5.0)
    prompt = torch.tensor([1, 2])
    p_target, sequences = _sequence_distribution(target, prompt, vocab, length)
    p_draft, _ = _sequence_distribution(draft, prompt, vocab, length)
    assert float((p_target - p_draft).abs().sum()) / 2 > 0.3  # the draft alone would be easy to tell apart
    assert float(p_target.min()) * draws > 30  # every cell expects enough draws for the chi-square test
    index = {s: i for i, s in enumerate(sequences)}
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(len(sequences), dtype=torch.float64)
    rejected = 0
    for _ in range(draws):
        result = ac.speculative_generate(target, draft, prompt, length, draft_length=2, temperature=1.0,
                                         generator=g)
        counts[index[tuple(result.tokens[prompt.numel():].tolist())]] += 1
        rejected += result.proposed - result.accepted
    assert rejected > draws / 10  # the residual distribution was really used
    significance = 1e-3
    assert chi_square_p_value(counts, p_target * draws) > significance
    # The same test has the power to reject the draft's distribution from as many draws.
    draft_counts = torch.bincount(torch.multinomial(p_draft.float(), draws, replacement=True, generator=g),
                                  minlength=len(sequences)).double()
    assert chi_square_p_value(draft_counts, p_target * draws) < significance


def test_static_batching_sizes_its_cache_for_rows_that_keep_running():
    # A long prompt with a short answer beside a short prompt with a long answer: in a static batch the
    # first row keeps running (and growing) until the second is done.
    model = _model()
    g = torch.Generator().manual_seed(6)
    requests = [ac.Request(0, 0, torch.randint(0, 40, (30,), generator=g), 2),
                ac.Request(1, 0, torch.randint(0, 40, (2,), generator=g), 30)]
    log = ac.serve_static(model, requests, max_batch=2)
    for r in requests:
        assert log.outputs[r.request_id] == model.generate(r.prompt, r.output_length, temperature=0)[
            r.prompt.numel():].tolist()
    assert log.steps == 29 and log.batch_sizes == [2] * 29
