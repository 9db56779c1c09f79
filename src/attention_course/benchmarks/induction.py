"""Chapter 16's induction heads: one- and two-layer attention-only models on repeated random tokens.

Both models train as the chapter trains them (:func:`~attention_course.interpretability.train_on_repeats`:
width 32, two heads per layer, a vocabulary of 32, half lengths 8 to 24, Adam at 1e-2, 800 steps of 32
sequences). Reported:

- ``repeated_half_loss``: for each model, the loss (nats per token) on the repeated half of 64 held-out
  sequences of 2 x 20 tokens; ``first_half_loss`` the same on the first half, where chance is ``ln 32``;
- ``best_induction_score``: the highest induction score of any head of each model on those sequences;
- ``train_seconds``: each model's wall-clock training time, and ``train_cpu_seconds``, the process's CPU time
  for it (all threads), which a busy machine inflates less;
- ``course_model``: the shipped course model (loaded, not trained) reading 16 windows of 64 tokens of the
  standard library's validation files, each said twice, as chapter 16 reads them: every head's prefix-matching
  score there and its OV copying score; ``heads_passing_both``, the heads whose prefix-matching score is over
  three times the best of the untrained model's heads (the same shape, :func:`new_course_model`) *and* whose
  copying score is positive; the loss on the first and the second copy, and the share of that drop (the
  repeat's gain) that mean-ablating those heads removes (``explained_share``), with the same for as many
  heads of the lowest previous-token plus prefix-matching scores as a control (``control_explained_share``);
- ``device``: where it ran.
"""

from __future__ import annotations

import math
import time

import torch

from attention_course.course_model import course_corpus, encode_files, load_course_model, new_course_model
from attention_course.interpretability import (
    AttentionOnlyLM,
    ablate_heads,
    capture_attention,
    copying_score,
    induction_score,
    per_position_loss,
    prefix_matching_score,
    previous_token_score,
    repeated_random_tokens,
    run_with_cache,
    train_on_repeats,
)
from attention_course.runtime import get_device

CONFIG = {"vocab_size": 32, "d_model": 32, "num_heads": 2, "half_lengths": (8, 24), "batch_size": 32,
          "lr": 1e-2, "steps": 800, "eval_half_length": 20, "eval_batch": 64}
COURSE = {"window": 64, "windows": 16, "files": 40, "seed": 1, "threshold_over_untrained": 3.0}


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


def _copy_losses(model: torch.nn.Module, tokens: torch.Tensor, half: int) -> tuple[float, float]:
    with torch.no_grad():
        losses = per_position_loss(model(tokens), tokens)
    return float(losses[: half - 1].mean()), float(losses[half:].mean())


def _ablated_gain(model: torch.nn.Module, tokens: torch.Tensor, half: int, heads: list[tuple[int, int]]) -> float:
    chosen: dict[int, list[int]] = {}
    for layer, head in heads:
        chosen.setdefault(layer, []).append(head)
    with ablate_heads(model, chosen, mode="mean", reference=tokens):
        first, second = _copy_losses(model, tokens, half)
    return first - second


def course_model_induction(device: torch.device) -> dict:
    """The course model's induction heads, found and ablated as chapter 16 does (see the module docstring)."""
    model, tokenizer = load_course_model()
    model = model.to(device).eval()
    untrained = new_course_model().to(device).eval()
    ids = encode_files(tokenizer, course_corpus().file_texts("valid")[: COURSE["files"]])
    window, count = COURSE["window"], COURSE["windows"]
    generator = torch.Generator().manual_seed(COURSE["seed"])
    starts = torch.randint(0, len(ids) - window, (count,), generator=generator)
    first = torch.stack([ids[s : s + window] for s in starts])
    tokens = torch.cat([first, first], dim=1).to(device)  # (16, 128): code said twice
    _, cache = run_with_cache(model, tokens)
    _, untrained_cache = run_with_cache(untrained, tokens)
    matching = torch.stack([prefix_matching_score(w, tokens) for w in cache.pattern]).cpu()  # (layers, H)
    previous = torch.stack([previous_token_score(w) for w in cache.pattern]).cpu()
    untrained_best = float(torch.stack([prefix_matching_score(w, tokens) for w in untrained_cache.pattern]).max())
    layers, heads = matching.shape
    copying = torch.tensor([[copying_score(model, layer, head) for head in range(heads)] for layer in range(layers)])
    threshold = COURSE["threshold_over_untrained"] * untrained_best
    both = [(layer, head) for layer in range(layers) for head in range(heads)
            if matching[layer, head] > threshold and copying[layer, head] > 0]
    first_loss, second_loss = _copy_losses(model, tokens, window)
    gain = first_loss - second_loss
    # The control: as many heads with the lowest previous-token plus prefix-matching scores (the lowest
    # prefix-matching scores alone would take the previous-token head, which the induction heads need).
    lowest = [divmod(int(i), heads) for i in (matching + previous).flatten().argsort()[: len(both)]]
    return {
        "heads": layers * heads,
        "heads_passing_both": len(both),
        "passing_heads": [list(h) for h in both],
        "prefix_matching_threshold": threshold,
        "prefix_matching": matching.double().round(decimals=3).tolist(),
        "copying": copying.double().round(decimals=3).tolist(),
        "first_copy_loss": first_loss,
        "second_copy_loss": second_loss,
        "repeat_gain_nats": gain,
        "explained_share": 1 - _ablated_gain(model, tokens, window, both) / gain if both else 0.0,
        "control_heads": [list(h) for h in lowest],
        "control_explained_share": 1 - _ablated_gain(model, tokens, window, lowest) / gain if both else 0.0,
        "config": dict(COURSE),
    }


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
        "course_model": course_model_induction(device),
        "device": str(device),
        "config": {key: list(value) if isinstance(value, tuple) else value for key, value in CONFIG.items()},
    }
