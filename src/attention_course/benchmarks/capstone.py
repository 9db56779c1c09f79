"""The capstone figure: the library's Transformer learns the chapter-10 mini-language on two CPU threads.

The model (the library's :class:`~attention_course.Transformer`, built from the course's own attention,
layers and embeddings) trains on the generated English → French task until its exact match on the
validation set (greedy decoding's exact match, computed in one teacher-forced pass) reaches
``CONFIG["target"]`` or ``CONFIG["time_budget"]`` seconds have passed (validation included in the time).
The reported ``exact_match`` and ``bleu`` come from greedy decoding of the held-out test set, whose sentences
all contain colour–noun or pronoun combinations that never occur in training (and differ from the
validation set's). Then :class:`~attention_course.training.TorchTranslator`, the same architecture built
from ``nn.TransformerEncoder``/``nn.TransformerDecoder``, trains for the same number of steps on the same
batches, for comparison; it trains in lockstep with a fresh copy of the library's model (one step each in
turn), so that the two step times, and their ratio, are measured under the same load.

Wall-clock times depend on the machine and on whatever else it runs; the accuracy figures are deterministic
for a given machine and thread count.
"""

from __future__ import annotations

import time

import torch

from attention_course.tasks.translation import batches, encode_pairs, make_translation_data
from attention_course.training import (
    LabelSmoothingLoss,
    TorchTranslator,
    evaluate_translations,
    teacher_forced_exact_match,
    train_step,
    train_translator,
    transformer_optimizer,
)
from attention_course.transformer import Transformer

CONFIG = {
    "d_model": 64,
    "num_heads": 4,
    "num_layers": 2,
    "d_ff": 256,
    "dropout": 0.1,
    "batch_size": 64,
    "warmup": 200,
    "lr_factor": 1.0,
    "label_smoothing": 0.1,
    "target": 0.998,  # validation exact match at which training stops (at most 1 error in 500 sentences)
    "eval_every": 50,
    "time_budget": 90.0,
    "threads": 2,
    "seed": 0,
}


def _build(cls: type, data, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return cls(len(data.src_vocab), len(data.tgt_vocab), d_model=CONFIG["d_model"], num_heads=CONFIG["num_heads"],
               num_encoder_layers=CONFIG["num_layers"], num_decoder_layers=CONFIG["num_layers"],
               d_ff=CONFIG["d_ff"], dropout=CONFIG["dropout"], max_len=32)


def _lockstep(models: dict[str, torch.nn.Module], src: torch.Tensor, tgt: torch.Tensor, pad: int,
              steps: int) -> dict[str, float]:
    """Train ``models`` on the same batches, one step each in turn; return each one's summed step time."""
    trainers = {}
    for name, model in models.items():
        optimizer, scheduler = transformer_optimizer(model, CONFIG["d_model"], CONFIG["warmup"], CONFIG["lr_factor"])
        trainers[name] = (model, optimizer, scheduler, LabelSmoothingLoss(CONFIG["label_smoothing"], ignore_index=pad))
    seconds = dict.fromkeys(models, 0.0)
    generator = torch.Generator().manual_seed(CONFIG["seed"])
    epoch = iter(())
    for step in range(steps):
        batch = next(epoch, None)
        if batch is None:
            epoch = batches(src, tgt, CONFIG["batch_size"], generator=generator)
            batch = next(epoch)
        names = list(trainers) if step % 2 == 0 else list(reversed(trainers))  # neither always goes first
        for name in names:
            model, optimizer, scheduler, loss_fn = trainers[name]
            start = time.perf_counter()
            train_step(model, *batch, optimizer, scheduler, loss_fn, pad)
            seconds[name] += time.perf_counter() - start
    for model in models.values():
        model.eval()
    return seconds


def run() -> dict:
    """Train, evaluate, compare; returns the figures (see the module docstring)."""
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(CONFIG["threads"])
    try:
        data = make_translation_data(seed=CONFIG["seed"])
        pad = data.src_vocab.pad_id
        train_src, train_tgt = encode_pairs(data.train, data.src_vocab, data.tgt_vocab)
        valid_src, valid_tgt = encode_pairs(data.valid, data.src_vocab, data.tgt_vocab)
        test_src, _ = encode_pairs(data.test, data.src_vocab, data.tgt_vocab)
        test_refs = [pair.target for pair in data.test]

        # 1. The figure: the library's model, trained until validation says it is done (or time is up).
        model = _build(Transformer, data, CONFIG["seed"])

        def validate() -> float:  # greedy exact match, computed in one teacher-forced pass
            return teacher_forced_exact_match(model, valid_src, valid_tgt, pad)

        log = train_translator(model, train_src, train_tgt, pad, time_budget=CONFIG["time_budget"],
                               evaluate=validate, eval_every=CONFIG["eval_every"], target=CONFIG["target"],
                               generator=torch.Generator().manual_seed(CONFIG["seed"]), batch_size=CONFIG["batch_size"],
                               warmup=CONFIG["warmup"], lr_factor=CONFIG["lr_factor"],
                               smoothing=CONFIG["label_smoothing"])
        test = evaluate_translations(model, test_src, test_refs, data.tgt_vocab, pad)

        # 2. The comparison: the same architecture from PyTorch's layers, the same number of steps on the same
        # batches, trained in lockstep with a second copy of the library's model so that both see the same load.
        reference = _build(TorchTranslator, data, CONFIG["seed"])
        twin = _build(Transformer, data, CONFIG["seed"])
        seconds = _lockstep({"library": twin, "torch": reference}, train_src, train_tgt, pad, log.steps)
        reference_test = evaluate_translations(reference, test_src, test_refs, data.tgt_vocab, pad)
    finally:
        torch.set_num_threads(previous_threads)
    return {
        "exact_match": test["exact_match"],
        "bleu": test["bleu"],
        "train_seconds": log.seconds,
        "device": f"cpu ({CONFIG['threads']} threads)",
        "validation_seconds": log.eval_seconds,
        "steps": log.steps,
        "stopped_because": log.stopped_because,
        "valid_exact_match": log.evaluations[-1][1],
        "test_sentences": len(test_refs),
        "torch_reference": {
            "exact_match": reference_test["exact_match"],
            "bleu": reference_test["bleu"],
            "train_seconds": seconds["torch"],
            "steps": log.steps,
            "library_train_seconds_in_lockstep": seconds["library"],
            "time_ratio_library_to_torch": seconds["library"] / seconds["torch"],
        },
        "config": dict(CONFIG),
    }
