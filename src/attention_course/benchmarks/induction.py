"""Chapter 16's induction heads: one- and two-layer attention-only models on repeated random tokens.

Both models train as the chapter trains them (:func:`~attention_course.interpretability.train_on_repeats`:
width 32, two heads per layer, a vocabulary of 32, half lengths 8 to 24, Adam at 1e-2, 800 steps of 32
sequences). Reported:

- ``repeated_half_loss``: for each model, the loss (nats per token) on the repeated half of 64 held-out
  sequences of 2 x 20 tokens; ``first_half_loss`` the same on the first half, where chance is ``ln 32``;
- ``best_induction_score``: the highest induction score of any head of each model on those sequences;
- ``train_seconds``: each model's wall-clock training time, and ``train_cpu_seconds``, the process's CPU time
  for it (all threads), which a busy machine inflates less;
- ``device``: where it ran.
"""

from __future__ import annotations

import math
import time

import torch

from attention_course.interpretability import (
    AttentionOnlyLM,
    capture_attention,
    induction_score,
    per_position_loss,
    repeated_random_tokens,
    train_on_repeats,
)
from attention_course.runtime import get_device

CONFIG = {"vocab_size": 32, "d_model": 32, "num_heads": 2, "half_lengths": (8, 24), "batch_size": 32,
          "lr": 1e-2, "steps": 800, "eval_half_length": 20, "eval_batch": 64}


def _one(layers: int, device: torch.device, evaluation: torch.Tensor) -> dict:
    torch.manual_seed(0)
    model = AttentionOnlyLM(CONFIG["vocab_size"], CONFIG["d_model"], CONFIG["num_heads"], layers,
                            max_len=2 * CONFIG["half_lengths"][1]).to(device)
    cpu_start = time.process_time()
    log = train_on_repeats(model, CONFIG["steps"], CONFIG["vocab_size"], CONFIG["half_lengths"],
                           batch_size=CONFIG["batch_size"], lr=CONFIG["lr"],
                           generator=torch.Generator().manual_seed(0))
    cpu_seconds = time.process_time() - cpu_start
    model.eval()
    half = CONFIG["eval_half_length"]
    with torch.no_grad(), capture_attention(model) as attention:
        losses = per_position_loss(model(evaluation), evaluation)
    scores = torch.cat([induction_score(attention[i], evaluation) for i in range(layers)])
    return {"repeated_half_loss": float(losses[half:].mean()), "first_half_loss": float(losses[: half - 1].mean()),
            "best_induction_score": float(scores.max()), "train_seconds": log.seconds,
            "train_cpu_seconds": cpu_seconds}


def run() -> dict:
    """Return the figures listed in the module docstring."""
    device = get_device()
    evaluation = repeated_random_tokens(CONFIG["eval_batch"], CONFIG["eval_half_length"], CONFIG["vocab_size"],
                                        torch.Generator().manual_seed(10)).to(device)
    one, two = _one(1, device, evaluation), _one(2, device, evaluation)
    return {
        "two_layer": two,
        "one_layer": one,
        "chance_loss": math.log(CONFIG["vocab_size"]),
        "device": str(device),
        "config": {key: list(value) if isinstance(value, tuple) else value for key, value in CONFIG.items()},
    }
