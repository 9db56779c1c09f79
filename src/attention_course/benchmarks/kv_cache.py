"""Greedy decoding with a KV cache against recomputing the whole prefix at every step (CPU).

The same randomly initialised encoder–decoder :class:`~attention_course.Transformer` (weights do not change
the amount of work, and equality of the two outputs is what is checked) generates ``tokens`` new tokens for a
batch of random sources, once with :func:`~attention_course.efficient.cached_greedy_decode` and once by
re-running the decoder on the full prefix at every step. Both must produce the same tokens; the figure is the
ratio of their times (median of alternating repetitions).
"""

from __future__ import annotations

import statistics
import time

import torch

from attention_course.efficient import cached_greedy_decode
from attention_course.masks import causal_mask
from attention_course.transformer import Transformer

CONFIG = {"batch": 4, "source_length": 32, "tokens": 128, "vocab": 1000, "d_model": 256, "num_heads": 8,
          "encoder_layers": 2, "decoder_layers": 4, "d_ff": 1024, "threads": 2}
BOS_ID = 1


@torch.no_grad()
def recompute_greedy_decode(model: Transformer, src: torch.Tensor, max_len: int, bos_id: int) -> torch.Tensor:
    """Greedy decoding without a cache: step t runs the decoder on all t tokens so far. ``(B, 1 + max_len)``."""
    memory = model.encode(src)
    tokens = torch.full((src.size(0), 1), bos_id, dtype=torch.long)
    for _ in range(max_len):
        logits = model.decode(tokens, memory, causal_mask(tokens.size(1)))  # (B, t, vocab), t grows
        tokens = torch.cat([tokens, logits[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
    return tokens


def run(repeats: int = 3) -> dict:
    """Return ``{"tokens", "speedup", "cached_s", "recompute_s", "identical", "config"}``."""
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(CONFIG["threads"])
    try:
        with torch.random.fork_rng():
            torch.manual_seed(0)
            model = Transformer(
                CONFIG["vocab"], CONFIG["vocab"], d_model=CONFIG["d_model"], num_heads=CONFIG["num_heads"],
                num_encoder_layers=CONFIG["encoder_layers"], num_decoder_layers=CONFIG["decoder_layers"],
                d_ff=CONFIG["d_ff"], dropout=0.0,
            ).eval()
            src = torch.randint(3, CONFIG["vocab"], (CONFIG["batch"], CONFIG["source_length"]))
        tokens = CONFIG["tokens"]
        cached_s, recompute_s = [], []
        for index in range(repeats):
            runs = [("cached", lambda: cached_greedy_decode(model, src, tokens, BOS_ID, None)),
                    ("recompute", lambda: recompute_greedy_decode(model, src, tokens, BOS_ID))]
            if index % 2:
                runs.reverse()
            outputs = {}
            for name, fn in runs:
                start = time.perf_counter()
                outputs[name] = fn()
                (cached_s if name == "cached" else recompute_s).append(time.perf_counter() - start)
            identical = torch.equal(outputs["cached"], outputs["recompute"])
            if not identical:
                raise RuntimeError("cached and recomputed greedy decoding produced different tokens")
    finally:
        torch.set_num_threads(previous_threads)
    cached, recompute = statistics.median(cached_s), statistics.median(recompute_s)
    return {
        "tokens": tokens,
        "speedup": recompute / cached,
        "cached_s": cached,
        "recompute_s": recompute,
        "identical": identical,
        "repeats": repeats,
        "config": dict(CONFIG),
    }
