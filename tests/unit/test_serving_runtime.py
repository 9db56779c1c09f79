"""Tests of serving as it runs (chapter 17): the preemptive scheduler that does not know output lengths,
attention that reads the paged cache in place, static batching with a contiguous reservation, prefix caching
by block hash, the drafts for speculative decoding, and a distribution test whose power is checked."""

from __future__ import annotations

import pytest
import torch

import attention_course as ac
from attention_course.sampling import chi_square_p_value


def _model(vocab=40, d_model=32, heads=4, layers=2, seed=0, **kwargs):
    torch.manual_seed(seed)
    return ac.DecoderOnlyLM(vocab, d_model=d_model, num_heads=heads, num_layers=layers, max_len=96,
                            **kwargs).eval()


def _gqa_rotary_model(seed=0):
    """The course model's kind of block, small: rotary positions, 6 query heads sharing 2 key/value heads."""
    config = ac.ModelConfig(positions="rotary", rotary_pairing="half", num_kv_heads=2, norm="rmsnorm",
                            feed_forward="swiglu", bias=False)
    torch.manual_seed(seed)
    return ac.DecoderOnlyLM(40, d_model=24, num_heads=6, num_layers=2, max_len=96, positions="none",
                            config=config).eval()


def _greedy(model, request):
    return model.generate(request.prompt, request.output_length, temperature=0)[request.prompt.numel():].tolist()


def _trace(count=10, seed=3, gap=1):
    g = torch.Generator().manual_seed(seed)
    return [ac.Request(i, gap * i // 2, torch.randint(0, 40, (int(torch.randint(2, 12, (1,), generator=g)),),
                                                      generator=g),
                       int(torch.randint(3, 30, (1,), generator=g))) for i in range(count)]


# --- attention read in place --------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [_model, _gqa_rotary_model])
def test_in_place_paged_attention_equals_the_gather_path(make):
    model = make()
    g = torch.Generator().manual_seed(1)
    pools = [ac.PagedKVCache.for_model(model, block_size=4, num_blocks=40) for _ in range(2)]
    lengths = [3, 9, 16, 1]
    with torch.no_grad():
        for pool in pools:
            for i, length in enumerate(lengths):
                pool.allocate(i)
                ac.paged_forward(model, pool, [i], torch.randint(0, 40, (1, length), generator=torch.Generator()
                                                                 .manual_seed(i)))
        new = torch.randint(0, 40, (4, 1), generator=g)
        gather = ac.paged_forward(model, pools[0], [0, 1, 2, 3], new, attention="gather")
        in_place = ac.paged_forward(model, pools[1], [0, 1, 2, 3], new, attention="in_place")
        full = torch.stack([model(torch.cat([torch.randint(0, 40, (1, n), generator=torch.Generator()
                                                           .manual_seed(i)), new[i : i + 1]], 1))[0, -1]
                            for i, n in enumerate(lengths)])
    torch.testing.assert_close(in_place[:, -1], gather[:, -1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(in_place[:, -1], full, atol=1e-5, rtol=1e-5)
    # several new tokens at once (a prompt, a verification call): causal among themselves
    prompt = torch.randint(0, 40, (1, 11), generator=g)
    pool = ac.PagedKVCache.for_model(model, block_size=4, num_blocks=8)
    pool.allocate(0)
    with torch.no_grad():
        torch.testing.assert_close(ac.paged_forward(model, pool, [0], prompt, attention="in_place"), model(prompt),
                                   atol=1e-5, rtol=1e-5)


def test_paged_attention_reads_blocks_where_they_lie():
    # Scatter a sequence's blocks over the pool; the result must follow the table, not the pool's order.
    pool = ac.PagedKVCache(num_layers=1, num_kv_heads=1, d_head=4, block_size=2, num_blocks=6)
    pool.allocate(0)
    pool.block_tables[0], pool.lengths[0] = [4, 1, 3], 5
    pool.ref_counts[[4, 1, 3]] = 1
    keys = torch.randn(5, 4)
    values = torch.randn(5, 4)
    pool.write(0, 0, 0, keys[None], values[None])
    query = torch.randn(1, 2, 1, 4)  # two query heads share the one key/value head
    out = ac.paged_attention(query, pool, 0, [0], torch.tensor([[4]]))
    expected = torch.softmax(query[0, :, 0] @ keys.T / 2, -1) @ values  # (2, 4)
    torch.testing.assert_close(out[0, :, 0], expected)
    early = ac.paged_attention(query, pool, 0, [0], torch.tensor([[2]]))  # sees positions 0..2 only
    torch.testing.assert_close(early[0, :, 0], torch.softmax(query[0, :, 0] @ keys[:3].T / 2, -1) @ values[:3])
    with pytest.raises(ValueError, match="query_positions"):
        ac.paged_attention(query, pool, 0, [0], torch.tensor([4]))
    with pytest.raises(ValueError, match="attention must be"):
        ac.paged_forward(_model(), ac.PagedKVCache.for_model(_model()), [], torch.zeros(0, 1, dtype=torch.long),
                         attention="inplace")


# --- the preemptive scheduler --------------------------------------------------------------------------------
@pytest.mark.parametrize("attention", ["gather", "in_place"])
def test_preemptive_scheduler_gives_each_request_its_greedy_output(attention):
    model = _gqa_rotary_model()
    requests = _trace()
    cache = ac.PagedKVCache.for_model(model, block_size=4, num_blocks=14)  # far too small for all at once
    log = ac.serve_preemptive(model, requests, cache, max_batch=8, attention=attention)
    for r in requests:
        assert log.outputs[r.request_id] == _greedy(model, r)
    assert log.preemptions > 0  # the pool ran out and requests were recomputed
    assert max(log.blocks_used) == 14  # it filled
    assert cache.num_free_blocks == 14 and not cache.block_tables  # everything given back
    assert set(log.finish_step) == {r.request_id for r in requests}  # no request starves
    assert sum(e == "preempt" for _, _, e in log.events) == log.preemptions
    assert all(log.ttft()[i] >= 0 for i in log.ttft()) and all(v > 0 for v in log.tpot().values())


def test_preemption_frees_the_victims_blocks_and_keeps_its_tokens():
    model = _model()
    # Two requests admitted together that cannot both grow to the end in 5 blocks of 4.
    requests = [ac.Request(0, 0, torch.tensor([1, 2, 3]), 14), ac.Request(1, 0, torch.tensor([4, 5, 6]), 14)]
    cache = ac.PagedKVCache.for_model(model, block_size=4, num_blocks=5)
    log = ac.serve_preemptive(model, requests, cache, max_batch=2, watermark=0.0, record_tables=True)
    assert log.preemptions >= 1
    preempted = [i for _, i, e in log.events if e == "preempt"]
    assert preempted[0] == 1  # the most recent admission goes, the first one keeps running
    step = next(s for s, i, e in log.events if e == "preempt")
    assert 1 not in log.block_tables[step]  # its blocks were freed
    for r in requests:
        assert log.outputs[r.request_id] == _greedy(model, r)
    # readmitted with its generated tokens: recomputation ran them through the model again
    assert log.prefill_tokens > sum(r.prompt.numel() for r in requests)


def test_preemptive_scheduler_refuses_a_request_larger_than_the_pool():
    model = _model()
    cache = ac.PagedKVCache.for_model(model, block_size=4, num_blocks=3)
    with pytest.raises(ac.OutOfBlocksError, match="needs 4 blocks alone"):
        ac.serve_preemptive(model, [ac.Request(0, 0, torch.tensor([1, 2]), 13)], cache)
    with pytest.raises(ValueError, match="watermark"):
        ac.serve_preemptive(model, [], cache, watermark=1.5)


def test_oracle_and_preemptive_agree_when_memory_is_ample():
    model = _model()
    requests = _trace(seed=5)
    oracle = ac.serve_continuous(model, requests, ac.PagedKVCache.for_model(model, 4, 200), max_batch=4)
    preempt = ac.serve_preemptive(model, requests, ac.PagedKVCache.for_model(model, 4, 200), max_batch=4)
    assert preempt.preemptions == 0 and preempt.outputs == oracle.outputs


# --- static batching with a contiguous reservation ------------------------------------------------------------
def test_reserved_static_batching_holds_budget_over_reserve_requests():
    model = _model()
    requests = _trace(count=6, seed=7, gap=0)
    log = ac.serve_reserved(model, requests, memory_positions=100, reserve=45)  # two at a time
    assert max(log.batch_sizes) == 2 and max(log.blocks_used) == 90
    for r in requests:
        assert log.outputs[r.request_id] == _greedy(model, r)
    with pytest.raises(ValueError, match="more than the reservation"):
        ac.serve_reserved(model, requests, memory_positions=100, reserve=10)
    with pytest.raises(ValueError, match="holds no reservation"):
        ac.serve_reserved(model, requests, memory_positions=40, reserve=45)


def test_percentile_is_numpy_linear():
    assert ac.percentile([1, 2, 3, 4], 50) == 2.5
    assert ac.percentile([0, 10], 90) == pytest.approx(9.0)
    with pytest.raises(ValueError):
        ac.percentile([], 50)


# --- prefix caching --------------------------------------------------------------------------------------------
def test_prefix_cache_shares_full_blocks_of_a_common_prompt():
    model = _model()
    system = torch.arange(1, 14)  # 13 tokens: 3 full blocks of 4
    requests = [ac.Request(i, i, torch.cat([system, torch.tensor([20 + i, 30 + i])]), 5) for i in range(5)]
    cache = ac.PagedKVCache.for_model(model, block_size=4, num_blocks=40)
    prefix = ac.PrefixCache(cache)
    log = ac.serve_preemptive(model, requests, cache, max_batch=4, prefix_cache=prefix)
    for r in requests:
        assert log.outputs[r.request_id] == _greedy(model, r)
    assert prefix.hits == 3 * 4  # every later request found the 3 blocks of the system prompt
    assert log.cached_prefix_tokens == 12 * 4 and log.prefill_tokens == 15 + 4 * 3
    # the key of a block depends on the tokens before it: the same block after another prefix differs
    assert prefix.keys_of([1, 2, 3, 4, 5, 6, 7, 8])[1] != prefix.keys_of([9, 2, 3, 4, 5, 6, 7, 8])[1]
    # blocks only the prefix cache holds are evicted under pressure, and the requests stay exact
    small = ac.PagedKVCache.for_model(model, block_size=4, num_blocks=12)
    squeezed = ac.serve_preemptive(model, requests, small, max_batch=4, prefix_cache=ac.PrefixCache(small))
    assert squeezed.outputs == log.outputs


# --- drafts -----------------------------------------------------------------------------------------------------
def test_truncated_draft_is_an_early_exit_of_the_target():
    model = _gqa_rotary_model()
    draft = ac.truncated_draft(model, 1)
    assert len(draft.blocks) == 1 and len(model.blocks) == 2 and not draft.training
    tokens = torch.randint(0, 40, (1, 7))
    with torch.no_grad():
        expected = model.lm_head(model.norm(model.blocks[0](model.embed(tokens))))
        torch.testing.assert_close(draft(tokens), expected)
    with pytest.raises(ValueError, match="at most"):
        ac.truncated_draft(model, 3)


def test_ngram_draft_counts_and_works_as_a_draft():
    ids = torch.tensor([1, 2, 3, 1, 2, 3, 1, 2, 4] * 5)
    draft = ac.NGramDraft(ids, vocab_size=8, max_len=96, trigram_weight=0.9, alpha=0.001)
    q = draft.distribution(1, 2)  # after (1, 2): 3 twice as often as 4
    assert q.sum().item() == pytest.approx(1.0)
    assert float(q[3]) == pytest.approx(2 * float(q[4]), rel=0.05) and int(q.argmax()) == 3
    cache = draft.new_cache()
    step = draft.step(torch.tensor([[5, 1, 2]]), cache)
    torch.testing.assert_close(step[0, -1].exp().double(), q.double(), atol=1e-6, rtol=1e-5)
    assert cache.position == 3
    target = _model(vocab=8)
    prompt = torch.tensor([1, 2, 3])
    result = ac.speculative_generate(target, draft, prompt, 20, draft_length=3, temperature=0)
    assert torch.equal(result.tokens, target.generate(prompt, 20, temperature=0))
    with pytest.raises(ValueError, match="train_ids"):
        ac.NGramDraft(torch.tensor([1, 9]), vocab_size=8)


# --- the distribution test, with its power checked ----------------------------------------------------------------
def test_exact_speculative_distribution_and_the_pitfall():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(50, 6, generator=g, dtype=torch.float64) * 2, -1)
    q = torch.softmax(torch.randn(50, 6, generator=g, dtype=torch.float64) * 2, -1)
    torch.testing.assert_close(ac.speculative_token_distribution(p, q), p)  # exact, by enumeration
    wrong = ac.speculative_token_distribution(p, q, residual_from_target=True)
    assert float((wrong - p).abs().sum(-1).min()) > 1e-3  # the pitfall is wrong at every one of 50 pairs
    # the library's rule, enumerated over every token and both outcomes of the uniform draw
    for row in range(5):
        out = torch.zeros(6, dtype=torch.float64)
        for token in range(6):
            ratio = min(1.0, float(p[row, token] / q[row, token]))
            _, residual = ac.speculative_accept(token, p[row], q[row], uniform=0.0)
            out[token] += q[row, token] * ratio
            out += q[row, token] * (1 - ratio) * residual
        torch.testing.assert_close(out, p[row])


def _sharp_pair(vocab=4):
    target = _model(vocab=vocab, d_model=16, heads=2, layers=1, seed=20)
    draft = _model(vocab=vocab, d_model=16, heads=2, layers=1, seed=21)
    with torch.no_grad():
        for m in (target, draft):
            m.lm_head.weight.mul_(5.0)
    return target, draft


def test_speculative_sampling_test_has_power_against_the_pitfall(monkeypatch):
    """One drafted token per round over a 4-token vocabulary: the first emitted token's exact distribution
    under the pitfall is known, so the number of draws is chosen to reject it in >= 95% of runs; then the
    library passes the test and the pitfall, run for real, fails it."""
    target, draft = _sharp_pair()
    prompt = torch.tensor([1, 2])
    with torch.no_grad():
        p = torch.softmax(target(prompt[None])[0, -1].double(), -1)
        q = torch.softmax(draft(prompt[None])[0, -1].double(), -1)
    pitfall = ac.speculative_token_distribution(p, q, residual_from_target=True)
    draws, significance = 600, 1e-3
    g = torch.Generator().manual_seed(0)
    assert ac.chi_square_power(p, pitfall, draws, significance, runs=1000, generator=g) >= 0.95
    assert ac.chi_square_power(p, p, draws, significance, runs=1000, generator=g) <= 0.01  # false alarms

    def first_tokens(generator):
        counts = torch.zeros(4, dtype=torch.float64)
        for _ in range(draws):
            result = ac.speculative_generate(target, draft, prompt, 2, draft_length=1, temperature=1.0,
                                             generator=generator)
            counts[int(result.tokens[2])] += 1
        return counts

    assert chi_square_p_value(first_tokens(torch.Generator().manual_seed(1)), p * draws) > significance
    real_accept = ac.speculative_accept

    def from_target(token, p_target, p_draft, uniform):
        accepted, _ = real_accept(token, p_target, p_draft, uniform)
        return accepted, p_target  # the pitfall: the replacement drawn from the target

    monkeypatch.setattr("attention_course.serving.speculative_accept", from_target)
    counts = first_tokens(torch.Generator().manual_seed(1))
    assert chi_square_p_value(counts, p * draws) < significance
    assert chi_square_p_value(counts, pitfall * draws) > significance  # and it is what the formula says
