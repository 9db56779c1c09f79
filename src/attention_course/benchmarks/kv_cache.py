"""Greedy decoding with a KV cache against recomputing the whole prefix at every step (CPU).

The same randomly initialised encoder–decoder :class:`~attention_course.Transformer` (weights do not change
the amount of work, and equality of the two outputs is what is checked) generates ``tokens`` new tokens for a
batch of random sources, once with :func:`~attention_course.incremental.cached_greedy_decode` and once with
:func:`~attention_course.decoding.greedy_decode`, which re-runs the decoder on the full prefix at every step.
The end token lies outside the vocabulary, so both generate exactly ``tokens`` tokens. Both must produce the
same tokens; the figure is the ratio of their times (median of alternating repetitions).

Both run on one thread and are timed in CPU time of the process (``time.process_time``) as well as wall time:
with one thread the two agree on an idle machine, and CPU time stays meaningful when other programs share
the cores (``speedup`` uses CPU time, ``wall_speedup`` wall time).
"""

from __future__ import annotations

import statistics
import time

import torch

from attention_course.decoding import greedy_decode
from attention_course.incremental import cached_greedy_decode
from attention_course.transformer import Transformer

CONFIG = {"batch": 4, "source_length": 32, "tokens": 128, "vocab": 1000, "d_model": 256, "num_heads": 8,
          "encoder_layers": 2, "decoder_layers": 4, "d_ff": 1024, "threads": 1}
BOS_ID = 1
EOS_ID = CONFIG["vocab"]  # never generated: every run decodes exactly CONFIG["tokens"] tokens


def run(repeats: int = 3) -> dict:
    """Return ``{"tokens", "speedup", "wall_speedup", "cached_s", "recompute_s", "identical", "config"}``."""
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
        cpu: dict[str, list[float]] = {"cached": [], "recompute": []}
        wall: dict[str, list[float]] = {"cached": [], "recompute": []}
        for index in range(repeats):
            runs = [("cached", lambda: cached_greedy_decode(model, src, tokens, BOS_ID, EOS_ID)),
                    ("recompute", lambda: greedy_decode(model, src, tokens, BOS_ID, EOS_ID))]
            if index % 2:
                runs.reverse()
            outputs = {}
            for name, fn in runs:
                start_cpu, start_wall = time.process_time(), time.perf_counter()
                outputs[name] = fn()
                cpu[name].append(time.process_time() - start_cpu)
                wall[name].append(time.perf_counter() - start_wall)
            identical = torch.equal(outputs["cached"], outputs["recompute"])
            if not identical:
                raise RuntimeError("cached and recomputed greedy decoding produced different tokens")
    finally:
        torch.set_num_threads(previous_threads)
    cached, recompute = statistics.median(cpu["cached"]), statistics.median(cpu["recompute"])
    return {
        "tokens": tokens,
        "speedup": recompute / cached,
        "wall_speedup": statistics.median(wall["recompute"]) / statistics.median(wall["cached"]),
        "cached_s": cached,
        "recompute_s": recompute,
        "identical": identical,
        "repeats": repeats,
        "config": dict(CONFIG),
    }
