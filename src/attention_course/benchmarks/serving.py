"""Serving figures (chapter 17): paged versus contiguous cache memory, continuous versus static batching,
speculative decoding's acceptance rate and speed-up.

A target model of chapter 13's shape and a small draft are trained briefly on the standard library's text
(byte-level BPE, 256 tokens). A trace of requests with exponential inter-arrival gaps and uniformly drawn
prompt and output lengths is served twice: by :func:`~attention_course.serve_continuous` on a
:class:`~attention_course.PagedKVCache` and by :func:`~attention_course.serve_static`. Memory compares, over
the continuous run's steps, the slots the paged blocks take and the slots a contiguous cache reserving
``max_len`` per request would take, with the positions really held. Speculative decoding runs
:func:`~attention_course.speculative_generate` at temperature 1 for each draft length; its speed-up is the
processor time of decoding the same prompts with the target alone divided by its own.
"""

from __future__ import annotations

import time

import torch

from attention_course.language_model import DecoderOnlyLM, train_language_model
from attention_course.serving import PagedKVCache, Request, serve_continuous, serve_static, speculative_generate
from attention_course.tasks.stdlib_text import load_stdlib_corpus
from attention_course.tokenization import BPETokenizer

CONFIG = {
    "target": {"d_model": 48, "num_heads": 4, "num_layers": 2}, "target_steps": 400,
    "draft": {"d_model": 16, "num_heads": 2, "num_layers": 1}, "draft_steps": 300,
    "train_context": 32, "max_len": 160, "vocab": 256,
    "trace": {"requests": 32, "mean_gap_steps": 2.0, "prompt_lengths": [4, 24], "output_lengths": [4, 64],
              "seed": 0},
    "max_batch": 4, "block_size": 8, "num_blocks": 64,
    "speculative": {"prompts": 8, "prompt_length": 4, "new_tokens": 28, "draft_lengths": [1, 2, 3, 4, 6],
                    "temperature": 1.0},
    "threads": 1, "device": "cpu",
}


def _trace(ids: torch.Tensor) -> list[Request]:
    spec = CONFIG["trace"]
    g = torch.Generator().manual_seed(spec["seed"])
    requests, clock = [], 0.0
    for i in range(spec["requests"]):
        clock += float(torch.empty(1).exponential_(1 / spec["mean_gap_steps"], generator=g))
        prompt_len = int(torch.randint(spec["prompt_lengths"][0], spec["prompt_lengths"][1] + 1, (1,), generator=g))
        output_len = int(torch.randint(spec["output_lengths"][0], spec["output_lengths"][1] + 1, (1,), generator=g))
        start = int(torch.randint(0, ids.numel() - prompt_len, (1,), generator=g))
        requests.append(Request(i, int(clock), ids[start : start + prompt_len], output_len))
    return requests


def run() -> dict:
    """Return ``{"memory", "batching", "speculative", "config"}``."""
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(CONFIG["threads"])
    try:
        corpus = load_stdlib_corpus()
        bpe = BPETokenizer([corpus.train], vocab_size=CONFIG["vocab"])
        train_ids, valid_ids = torch.tensor(bpe.encode(corpus.train)), torch.tensor(bpe.encode(corpus.valid))
        models = {}
        for name in ("target", "draft"):
            torch.manual_seed(0)
            models[name] = DecoderOnlyLM(len(bpe), max_len=CONFIG["max_len"], **CONFIG[name])
            train_language_model(models[name], train_ids, CONFIG[f"{name}_steps"], batch_size=32,
                                 length=CONFIG["train_context"], lr=2e-2, warmup=40,
                                 generator=torch.Generator().manual_seed(0))
            models[name].eval()
        target, draft = models["target"], models["draft"]

        trace = _trace(valid_ids)
        cache = PagedKVCache.for_model(target, CONFIG["block_size"], CONFIG["num_blocks"])
        continuous = serve_continuous(target, trace, cache, CONFIG["max_batch"], record_tables=True)
        static = serve_static(target, trace, CONFIG["max_batch"])
        alive = [len(t) for t in continuous.block_tables]
        held = sum(continuous.positions_held)
        paged_slots = sum(continuous.blocks_used) * CONFIG["block_size"]
        contiguous_slots = sum(alive) * CONFIG["max_len"]
        memory = {
            "positions_held_summed_over_steps": held,
            "paged_slots_summed_over_steps": paged_slots,
            "contiguous_slots_summed_over_steps": contiguous_slots,
            "paged_unused_fraction": 1 - held / paged_slots,
            "contiguous_unused_fraction": 1 - held / contiguous_slots,
            "peak_paged_blocks": max(continuous.blocks_used),
        }
        batching = {}
        for name, log in (("static", static), ("continuous", continuous)):
            latency = list(log.latencies(trace).values())
            batching[name] = {"steps": log.steps, "tokens_per_step": log.tokens_per_step(),
                              "tokens_per_second": log.tokens_per_second(),
                              "mean_latency_steps": sum(latency) / len(latency), "max_latency_steps": max(latency)}
        batching["throughput_ratio_steps"] = (batching["continuous"]["tokens_per_step"]
                                              / batching["static"]["tokens_per_step"])
        batching["throughput_ratio_seconds"] = (batching["continuous"]["tokens_per_second"]
                                                / batching["static"]["tokens_per_second"])

        spec = CONFIG["speculative"]
        prompts = [valid_ids[300 * i : 300 * i + spec["prompt_length"]] for i in range(spec["prompts"])]

        def alone() -> float:
            g = torch.Generator().manual_seed(1)
            start = time.process_time()
            for p in prompts:
                target.generate(p, spec["new_tokens"], temperature=spec["temperature"], generator=g)
            return time.process_time() - start

        alone()  # warm-up
        base = min(alone() for _ in range(3))
        speculative: dict = {"target_alone_seconds": base}
        for k in spec["draft_lengths"]:
            g = torch.Generator().manual_seed(2)
            start = time.process_time()
            results = [speculative_generate(target, draft, p, spec["new_tokens"], draft_length=k,
                                            temperature=spec["temperature"], generator=g) for p in prompts]
            seconds = time.process_time() - start
            accepted = sum(r.accepted for r in results)
            speculative[f"draft_length_{k}"] = {
                "acceptance_rate": accepted / max(accepted + sum(r.rejected for r in results), 1),
                "tokens_per_target_call": len(prompts) * spec["new_tokens"] / sum(r.target_calls for r in results),
                "speedup": base / seconds,
            }
    finally:
        torch.set_num_threads(previous_threads)
    return {"memory": memory, "batching": batching, "speculative": speculative, "config": CONFIG}
