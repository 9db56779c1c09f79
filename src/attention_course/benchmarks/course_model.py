"""The shipped course model against counting and compression, and its generation speed (CPU).

Scores, on the evaluation text of the course model's recipe (the first 200,000 characters of the validation
files): the course model loaded from the package (:func:`~attention_course.load_course_model`), interpolated
Kneser-Ney n-grams of orders 2 to 5 trained on the same training tokens, and lzma on the evaluation text
alone, each in bits per byte (and nats per token where there are tokens). Then generation speed: a batch of
prompts continued by greedy decoding with the KV cache (:meth:`~attention_course.DecoderOnlyLM.step`) and
by re-running the whole prefix at every step, in tokens per second of CPU time on one thread (median of three
alternating repetitions), with the two outputs checked equal.
"""

from __future__ import annotations

import statistics
import time

import torch

from attention_course import course_model as cm
from attention_course.ngram import bits_per_byte

CONFIG = {"batch": 8, "prompt": 16, "new_tokens": 112, "threads": 1, "repeats": 3}


def _generation_speed(model, prompts: torch.Tensor) -> dict:
    seconds: dict[str, list[float]] = {"cached": [], "recomputed": []}
    outputs = {}
    for _ in range(CONFIG["repeats"]):
        for name, use_cache in (("cached", True), ("recomputed", False)):
            start = time.process_time()
            outputs[name] = model.generate(prompts, CONFIG["new_tokens"], temperature=0, use_cache=use_cache)
            seconds[name].append(time.process_time() - start)
    tokens = CONFIG["batch"] * CONFIG["new_tokens"]
    median = {name: statistics.median(values) for name, values in seconds.items()}
    return {"tokens_per_cpu_second_cached": tokens / median["cached"],
            "tokens_per_cpu_second_recomputed": tokens / median["recomputed"],
            "cache_speedup": median["recomputed"] / median["cached"],
            "identical": bool(torch.equal(outputs["cached"], outputs["recomputed"]))}


def run() -> dict:
    """Return ``{"bits_per_byte": {...}, "nats_per_token": {...}, "generation": {...}, "config": ...}``."""
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(CONFIG["threads"])
    try:
        model, tokenizer = cm.load_course_model()
        corpus = cm.course_corpus()
        eval_texts = cm.evaluation_text(corpus)
        eval_ids = cm.encode_files(tokenizer, eval_texts)
        num_bytes = sum(len(text.encode("utf-8")) for text in eval_texts)
        nats, count = cm.evaluate_nats(model, eval_ids, cm.RECIPE.context)
        baselines = cm.baseline_scores(tokenizer, corpus, eval_texts)
        bits = {"course_model": bits_per_byte(nats / count, count, num_bytes)}
        bits.update({name: score["bits_per_byte"] for name, score in baselines.items()})
        per_token = {"course_model": nats / count}
        per_token.update({name: score["nats_per_token"] for name, score in baselines.items()
                          if "nats_per_token" in score})
        best = min((name for name in bits if name.startswith("kneser_ney")), key=bits.get)
        prompts = torch.stack([eval_ids[i * 997 : i * 997 + CONFIG["prompt"]] for i in range(CONFIG["batch"])])
        return {"bits_per_byte": bits, "nats_per_token": per_token, "best_ngram": best,
                "gain_over_best_ngram": 1 - bits["course_model"] / bits[best],
                "generation": _generation_speed(model, prompts), "config": dict(CONFIG)}
    finally:
        torch.set_num_threads(previous_threads)
