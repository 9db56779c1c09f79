"""Chapter 13's decoder-only language model: its validation loss against baselines, and generation speed.

The model trains on the Python standard library's source (:func:`~attention_course.tasks.stdlib_text.
load_stdlib_corpus`, split by file) tokenised with a 512-token byte-level BPE (the 256 bytes and 256
merges), with AdamW, warm-up and cosine decay and gradient clipping
(:func:`~attention_course.language_model.train_language_model`). Reported:

- ``val_loss``, ``unigram_val_loss``, ``bigram_val_loss``: nats per token on the validation modules, all with
  the same tokenisation; ``ratio_to_unigram`` must be at most 0.7 (``meets_target``);
- ``train_seconds``: wall-clock training time (the budget is 90 s on 2 idle CPU cores), and
  ``train_cpu_seconds``, the process's CPU time for it (all threads), which a busy machine inflates less;
- ``tokens_per_second``: greedy generation of a batch with and without the KV cache (CPU time of this
  process, best of three), after checking that both produce the same tokens;
- ``device``: where it ran (on CUDA the forward pass uses bfloat16 autocast).
"""

from __future__ import annotations

import math
import time

import torch

from attention_course.language_model import (
    DecoderOnlyLM,
    bigram_cross_entropy,
    evaluate_lm,
    train_language_model,
    unigram_cross_entropy,
)
from attention_course.runtime import get_device
from attention_course.tasks.stdlib_text import load_stdlib_corpus
from attention_course.tokenization import BPETokenizer

CONFIG = {"vocab_size": 512, "d_model": 64, "num_heads": 4, "num_layers": 2, "context": 32, "batch_size": 32,
          "steps": 1500, "lr": 2e-2, "warmup": 100, "generate_batch": 8}


def _tokens_per_second(model: DecoderOnlyLM, prompts: torch.Tensor, new_tokens: int, use_cache: bool) -> float:
    best = math.inf
    for _ in range(3):
        start = time.process_time()
        model.generate(prompts, new_tokens, temperature=0, use_cache=use_cache)
        best = min(best, time.process_time() - start)
    return prompts.size(0) * new_tokens / best


def run() -> dict:
    """Return the figures listed in the module docstring."""
    device = get_device()
    corpus = load_stdlib_corpus()
    bpe = BPETokenizer([corpus.train], vocab_size=CONFIG["vocab_size"])
    train_ids, valid_ids = torch.tensor(bpe.encode(corpus.train)), torch.tensor(bpe.encode(corpus.valid))
    vocab_size = len(bpe)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = DecoderOnlyLM(vocab_size, d_model=CONFIG["d_model"], num_heads=CONFIG["num_heads"],
                              num_layers=CONFIG["num_layers"], max_len=CONFIG["context"] + 1).to(device)
    cpu_start = time.process_time()
    log = train_language_model(model, train_ids, CONFIG["steps"], batch_size=CONFIG["batch_size"],
                               length=CONFIG["context"], lr=CONFIG["lr"], warmup=CONFIG["warmup"],
                               generator=torch.Generator().manual_seed(0))
    train_cpu_seconds = time.process_time() - cpu_start
    val_loss = evaluate_lm(model, valid_ids, CONFIG["context"])
    unigram = unigram_cross_entropy(train_ids, valid_ids, vocab_size)
    bigram = bigram_cross_entropy(train_ids, valid_ids, vocab_size)

    model = model.eval()
    prompts = valid_ids[: CONFIG["generate_batch"]].view(-1, 1).to(device)  # one-token prompts
    new_tokens = CONFIG["context"]
    cached = model.generate(prompts, new_tokens, temperature=0, use_cache=True)
    if not torch.equal(cached, model.generate(prompts, new_tokens, temperature=0, use_cache=False)):
        raise RuntimeError("cached and uncached generation produced different tokens")
    speed = {"cached": _tokens_per_second(model, prompts, new_tokens, True),
             "uncached": _tokens_per_second(model, prompts, new_tokens, False)}
    return {
        "val_loss": val_loss,
        "unigram_val_loss": unigram,
        "bigram_val_loss": bigram,
        "ratio_to_unigram": val_loss / unigram,
        "meets_target": val_loss <= 0.7 * unigram,
        "bits_per_char": val_loss / math.log(2) * len(valid_ids) / len(corpus.valid),
        "train_seconds": log.seconds,
        "train_cpu_seconds": train_cpu_seconds,
        "tokens_per_second": speed,
        "cache_speedup": speed["cached"] / speed["uncached"],
        "device": str(device),
        "amp_dtype": None if log.amp_dtype is None else str(log.amp_dtype),
        "train_chars": len(corpus.train),
        "config": dict(CONFIG),
    }
