"""Serving figures (chapter 17) on the course model: throughput against memory, attention read in place,
prefix caching and speculative decoding.

Target: the shipped course model (:func:`~attention_course.load_course_model`; 4 layers, 6 query heads sharing
2 key/value heads, context 256). Requests are windows of the held-out standard-library text (the model's
evaluation split): prompt lengths uniform in ``prompt_lengths``, output lengths uniform in ``output_lengths``
(the scheduler under test does not see them: a request stops when it has its tokens, as at an end token),
arrivals with exponential gaps. All runs are greedy, and every schedule's outputs are checked equal.

- ``throughput``: for each KV-cache budget (positions of keys and values, all layers), four schedules:
  static batching reserving ``max_len`` per request (a contiguous cache with no knowledge of lengths), static
  batching reserving the longest request the trace allows (the best a contiguous cache can do), the oracle
  scheduler that admits by true output lengths (a baseline no server has), and the preemptive paged scheduler
  (:func:`~attention_course.serve_preemptive`). Tokens per second (wall clock, one thread), steps, TTFT and
  TPOT (median, p90), preemptions and the peak blocks in use.
- ``attention``: one decoding step of a batch, gathering each sequence's keys into a padded tensor versus
  reading the blocks in place (:func:`~attention_course.paged_attention`), best of repeats.
- ``prefix_cache``: a trace whose prompts share a system prompt, served with and without
  :class:`~attention_course.PrefixCache`.
- ``speculative``: acceptance, tokens per target call and processor-time speed-up against the target alone,
  for an n-gram draft (:class:`~attention_course.NGramDraft`) and truncated copies of the target
  (:func:`~attention_course.truncated_draft`), at temperatures 0 and 1.
"""

from __future__ import annotations

import time

import torch

from attention_course.course_model import course_corpus, encode_files, evaluation_text, load_course_model
from attention_course.serving import PagedKVCache, Request, paged_forward, serve_continuous, speculative_generate
from attention_course.serving_draft import NGramDraft, truncated_draft
from attention_course.serving_scheduler import PrefixCache, percentile, serve_preemptive, serve_reserved

CONFIG = {
    "trace": {"requests": 32, "mean_gap_steps": 0.5, "prompt_lengths": [8, 48], "output_lengths": [8, 96],
              "seed": 0},
    "block_size": 16, "budgets_positions": [512, 1024, 2048, 4096], "max_batch": 64, "watermark": 0.01,
    "attention": {"batch": 16, "context": 192, "repeats": 5},
    "prefix": {"requests": 16, "system_prompt": 96, "question_lengths": [8, 24], "output_length": 16},
    "speculative": {"prompts": 8, "prompt_length": 32, "new_tokens": 64, "draft_lengths": [1, 2, 3, 4, 6],
                    "train_chars": 3_000_000},
    "threads": 1, "device": "cpu",
}


def _trace(ids: torch.Tensor, spec: dict) -> list[Request]:
    g = torch.Generator().manual_seed(spec["seed"])
    requests, clock = [], 0.0
    for i in range(spec["requests"]):
        clock += float(torch.empty(1).exponential_(1 / spec["mean_gap_steps"], generator=g))
        prompt_len = int(torch.randint(spec["prompt_lengths"][0], spec["prompt_lengths"][1] + 1, (1,), generator=g))
        output_len = int(torch.randint(spec["output_lengths"][0], spec["output_lengths"][1] + 1, (1,), generator=g))
        start = int(torch.randint(0, ids.numel() - prompt_len, (1,), generator=g))
        requests.append(Request(i, int(clock), ids[start : start + prompt_len], output_len))
    return requests


def _summary(log, requests: list[Request]) -> dict:
    ttft, tpot = list(log.ttft().values()), list(log.tpot().values())
    return {"tokens_per_second": log.tokens_per_second(), "steps": log.steps, "seconds": log.seconds,
            "requests_completed": len(log.finish_step),
            "mean_batch": sum(log.batch_sizes) / max(len(log.batch_sizes), 1),
            "ttft_median_s": percentile(ttft, 50), "ttft_p90_s": percentile(ttft, 90),
            "tpot_median_s": percentile(tpot, 50), "tpot_p90_s": percentile(tpot, 90),
            "preemptions": log.preemptions}


def throughput(model, ids: torch.Tensor) -> dict:
    trace = _trace(ids, CONFIG["trace"])
    spec, size = CONFIG["trace"], CONFIG["block_size"]
    largest = spec["prompt_lengths"][1] + spec["output_lengths"][1]
    out: dict = {"largest_request": largest, "max_len": model.max_len}
    reference = None
    for budget in CONFIG["budgets_positions"]:
        row: dict = {}
        for name, reserve in (("static_reserve_max_len", model.max_len), ("static_reserve_largest", largest)):
            if budget >= reserve:
                log = serve_reserved(model, trace, budget, reserve, CONFIG["max_batch"])
                row[name] = _summary(log, trace) | {"peak_positions_reserved": max(log.blocks_used)}
                reference = reference or log.outputs
                assert log.outputs == reference
        for name, run in (("oracle_paged", serve_continuous), ("preemptive_paged", serve_preemptive)):
            cache = PagedKVCache.for_model(model, size, budget // size)
            kwargs = {"watermark": CONFIG["watermark"]} if run is serve_preemptive else {}
            log = run(model, trace, cache, CONFIG["max_batch"], **kwargs)
            row[name] = _summary(log, trace) | {"peak_blocks": max(log.blocks_used), "blocks": budget // size}
            reference = reference or log.outputs
            assert log.outputs == reference
        out[f"budget_{budget}"] = row
    return out


def attention_timing(model, ids: torch.Tensor) -> dict:
    spec = CONFIG["attention"]
    cache = PagedKVCache.for_model(model, CONFIG["block_size"], spec["batch"] * (spec["context"] // 16 + 2))
    seq_ids = list(range(spec["batch"]))
    with torch.no_grad():
        for i in seq_ids:
            cache.allocate(i)
            length = spec["context"] - 8 * i % 64
            paged_forward(model, cache, [i], ids[100 * i : 100 * i + length][None])
    tokens = torch.full((spec["batch"], 1), 7)
    results = {}
    for mode in ("gather", "in_place"):
        best = float("inf")
        for _ in range(spec["repeats"]):
            lengths = dict(cache.lengths)
            start = time.process_time()
            with torch.no_grad():
                paged_forward(model, cache, seq_ids, tokens, attention=mode)
            best = min(best, time.process_time() - start)
            cache.lengths.update(lengths)  # the step's position is written again next time
        results[f"{mode}_ms"] = best * 1e3
    results["in_place_over_gather"] = results["in_place_ms"] / results["gather_ms"]
    return results


def prefix_caching(model, ids: torch.Tensor) -> dict:
    spec = CONFIG["prefix"]
    g = torch.Generator().manual_seed(1)
    system = ids[5000 : 5000 + spec["system_prompt"]]
    trace = []
    for i in range(spec["requests"]):
        n = int(torch.randint(spec["question_lengths"][0], spec["question_lengths"][1] + 1, (1,), generator=g))
        trace.append(Request(i, i, torch.cat([system, ids[8000 + 40 * i : 8000 + 40 * i + n]]), spec["output_length"]))
    out = {}
    for name, use in (("without", False), ("with", True)):
        cache = PagedKVCache.for_model(model, CONFIG["block_size"], 128)
        prefix = PrefixCache(cache) if use else None
        log = serve_preemptive(model, trace, cache, 16, prefix_cache=prefix)
        out[name] = {"prefill_tokens": log.prefill_tokens, "cached_prefix_tokens": log.cached_prefix_tokens,
                     "blocks_reused": prefix.hits if prefix else 0, "seconds": log.seconds,
                     "ttft_median_s": percentile(list(log.ttft().values()), 50)}
    out["prefill_tokens_skipped_share"] = 1 - out["with"]["prefill_tokens"] / out["without"]["prefill_tokens"]
    return out


def speculative(model, tokenizer, eval_ids: torch.Tensor) -> dict:
    spec = CONFIG["speculative"]
    corpus = course_corpus()
    train = encode_files(tokenizer, [corpus.train[: spec["train_chars"]]])
    drafts = {"ngram": NGramDraft(train, model.vocab_size, max_len=model.max_len),
              "truncated_1_block": truncated_draft(model, 1), "truncated_2_blocks": truncated_draft(model, 2)}
    prompts = [eval_ids[300 * i : 300 * i + spec["prompt_length"]] for i in range(spec["prompts"])]
    out: dict = {}
    for temperature in (0.0, 1.0):
        def alone(temperature=temperature) -> float:
            g = torch.Generator().manual_seed(1)
            start = time.process_time()
            for p in prompts:
                model.generate(p, spec["new_tokens"], temperature=temperature, generator=g)
            return time.process_time() - start

        alone()
        base = min(alone() for _ in range(2))
        rows: dict = {"target_alone_seconds": base}
        for name, draft in drafts.items():
            for k in spec["draft_lengths"]:
                g = torch.Generator().manual_seed(2)
                start = time.process_time()
                results = [speculative_generate(model, draft, p, spec["new_tokens"], draft_length=k,
                                                temperature=temperature, generator=g) for p in prompts]
                seconds = time.process_time() - start
                accepted = sum(r.accepted for r in results)
                rows[f"{name}_k{k}"] = {
                    "acceptance_rate": accepted / max(accepted + sum(r.rejected for r in results), 1),
                    "tokens_per_target_call": len(prompts) * spec["new_tokens"] / sum(r.target_calls for r in results),
                    "speedup": base / seconds}
        best = max((v["speedup"], key) for key, v in rows.items() if isinstance(v, dict))
        rows["best"] = {"speedup": best[0], "setting": best[1]}
        out[f"temperature_{temperature:g}"] = rows
    return out


def run() -> dict:
    """Return ``{"throughput", "attention", "prefix_cache", "speculative", "config"}``."""
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(CONFIG["threads"])
    try:
        model, tokenizer = load_course_model()
        eval_ids = encode_files(tokenizer, evaluation_text(course_corpus()))
        return {"throughput": throughput(model, eval_ids), "attention": attention_timing(model, eval_ids),
                "prefix_cache": prefix_caching(model, eval_ids),
                "speculative": speculative(model, tokenizer, eval_ids), "config": CONFIG}
    finally:
        torch.set_num_threads(previous_threads)
