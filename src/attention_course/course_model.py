"""The course model: a small Llama-style language model of Python code, trained once and shipped with the course.

A lesson may train for about a minute of CPU, and a model trained for a minute loses to counting n-grams.
So the course trains one model once, with the library's own :class:`~attention_course.DecoderOnlyLM`, by the
recipe in this module, and ships the result in the package as a Hugging Face checkpoint directory
(``attention_course/data/course_model/``): ``config.json`` (``model_type: "llama"``), ``model.safetensors`` in
bfloat16, the byte-level BPE tokenizer as ``tokenizer.json``, the training log and a model card.

- ``RECIPE``, a :class:`CourseModelRecipe`: every choice of the run (sizes, data, schedule, seed).
- :func:`train_course_model`: the run itself, resumable (``make course-model``; about an hour on two cores).
- :func:`export_course_model`: the checkpoint directory, written from a finished run.
- :func:`load_course_model`: the shipped model and its tokenizer, with no network access, after checking every
  file against the SHA-256 recorded in :data:`CHECKSUMS`.
- :func:`save_llama_checkpoint`: any Llama-style :class:`~attention_course.DecoderOnlyLM` as a Hugging Face
  Llama checkpoint (the inverse of :func:`~attention_course.load_hf_checkpoint`).

The data are the Python standard library's own source (:func:`~attention_course.tasks.stdlib_text.load_stdlib_corpus`
with ``packages=True``), split by file name: no validation file is ever trained on, on any Python version.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from attention_course.config import ModelConfig
from attention_course.language_model import DecoderOnlyLM, next_token_loss, random_windows, warmup_cosine_lr
from attention_course.ngram import KneserNeyLM, bits_per_byte, lzma_bits_per_byte
from attention_course.runtime import autocast_dtype, get_device
from attention_course.tasks.stdlib_text import StdlibCorpus, load_stdlib_corpus
from attention_course.tokenization import BPETokenizer

__all__ = ["CHECKSUMS", "COURSE_MODEL_DIR", "RECIPE", "CourseModelRecipe", "encode_files", "export_course_model",
           "course_corpus", "evaluation_text", "load_course_model", "new_course_model", "save_llama_checkpoint",
           "train_course_model"]

#: Where the shipped checkpoint lives inside the installed package.
COURSE_MODEL_DIR = Path(__file__).parent / "data" / "course_model"

#: The SHA-256 of every shipped file, written by :func:`export_course_model` (``make course-model``).
CHECKSUMS: dict[str, str] = {
    "config.json": "290065d4284bbb993c74c7f8cd67a63c50f432bca8e71db94eee4325f421c102",
    "model.safetensors": "00d6749b2a5b9370c739d43736bf55c66b19f53920cff0cf3021efd9fac1d854",
    "tokenizer.json": "1d9ec9a3ecb7a4c43e50092cb8b0b1219b67717ce00704f3681248b22d4cb809",
    "training_log.json": "731d2bd970ca32192346a1fcae96102880e469bb886d8669a58946befc947497",
    "README.md": "7bc36fc2f68d38ad16498692c9f3e1d766ebe22cdabbf80b916aefa6806c2da7",
}


@dataclass(frozen=True)
class CourseModelRecipe:
    """Every choice of the course model's training run.

    Sizes follow Llama (RMSNorm, SwiGLU, rotary positions in the rotate-half layout, grouped-query attention, no
    biases), scaled to what two CPU cores train in about an hour: at ``d_model`` 192 and 4 layers the library's
    model trains at 7,800 to 8,900 tokens per second on two cores (measured, windows of 256 tokens), so 8,000
    steps of 16 x 256 tokens (32.8M tokens, about ten passes over the 3.3M training tokens) take 61 to 70
    minutes (70 measured for the shipped model, the model card records it).
    """

    vocab_size: int = 2048
    d_model: int = 192
    num_layers: int = 4
    num_heads: int = 6
    num_kv_heads: int = 2
    d_ff: int = 512
    context: int = 256
    batch_size: int = 16
    steps: int = 8000
    peak_lr: float = 2e-3
    warmup: int = 300
    final_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    clip: float = 1.0
    seed: int = 0
    max_file_chars: int = 250_000
    eval_chars: int = 200_000
    eval_every: int = 500

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.context

    def model_config(self) -> ModelConfig:
        return ModelConfig(positions="rotary", rotary_pairing="half", num_kv_heads=self.num_kv_heads,
                           norm="rmsnorm", feed_forward="swiglu", bias=False, init="gpt2")


#: The recipe of the shipped course model.
RECIPE = CourseModelRecipe()


# ---------------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------------
def course_corpus(recipe: CourseModelRecipe = RECIPE, directory: str | Path | None = None) -> StdlibCorpus:
    """The standard library's modules and packages, split by file name (no size cap on either side)."""
    return load_stdlib_corpus(max_train_chars=10**9, max_valid_chars=10**9, max_file_chars=recipe.max_file_chars,
                              directory=directory, packages=True)


def evaluation_text(corpus: StdlibCorpus, chars: int = RECIPE.eval_chars) -> list[str]:
    """The first ``chars`` characters of the validation files (top-level modules first), as one string per file.

    Every model and baseline of the course is scored on this text; chapter 13's validation text is its start.
    """
    pieces, total = [], 0
    for text in corpus.file_texts("valid"):
        pieces.append(text[: chars - total])
        total += len(pieces[-1])
        if total >= chars:
            break
    return pieces


def encode_files(tokenizer: BPETokenizer, texts: Sequence[str]) -> Tensor:
    """Token ids of ``texts`` encoded one file at a time and concatenated: ``(N,)`` int64."""
    # encode_batch_fast skips the character offsets that no caller here reads: some 40% less CPU on the
    # course corpus's 3.3 million tokens
    encodings = tokenizer.tokenizer.encode_batch_fast(list(texts))
    return torch.tensor([i for encoding in encodings for i in encoding.ids], dtype=torch.long)


def train_tokenizer(corpus: StdlibCorpus, recipe: CourseModelRecipe = RECIPE) -> BPETokenizer:
    """Byte-level BPE with ``recipe.vocab_size`` tokens, trained on the training files only."""
    return BPETokenizer(corpus.file_texts("train"), vocab_size=recipe.vocab_size)


def new_course_model(recipe: CourseModelRecipe = RECIPE) -> DecoderOnlyLM:
    """The untrained model of ``recipe``, initialised from ``recipe.seed`` (GPT-2's scaled initialisation)."""
    torch.manual_seed(recipe.seed)
    return DecoderOnlyLM(recipe.vocab_size, d_model=recipe.d_model, num_heads=recipe.num_heads,
                         num_layers=recipe.num_layers, d_ff=recipe.d_ff, max_len=recipe.context + 1,
                         positions="none", tie_weights=True, config=recipe.model_config())


# ---------------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------------
def _optimizer(model: nn.Module, recipe: CourseModelRecipe) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": recipe.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=recipe.peak_lr, betas=(0.9, 0.95))


@torch.no_grad()
def evaluate_nats(model: DecoderOnlyLM, ids: Tensor, context: int, batch_size: int = 16) -> tuple[float, int]:
    """Summed next-token loss (nats) of ``model`` over consecutive windows of ``context + 1`` tokens of ``ids``
    that share their boundary token, so every token after the first is predicted once; and how many were."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    full = (ids.numel() - 1) // context  # windows of context + 1 tokens; a shorter one may remain
    windows = [ids[i * context : i * context + context + 1] for i in range(full)]
    batches = [torch.stack(windows[i : i + batch_size]) for i in range(0, full, batch_size)]
    if ids.numel() - 1 > full * context:
        batches.append(ids[full * context :][None])
    for batch in batches:
        predicted = batch.size(0) * (batch.size(1) - 1)
        total += float(next_token_loss(model(batch), batch)) * predicted
        count += predicted
    model.train(was_training)
    return total, count


@dataclass
class _Run:
    model: DecoderOnlyLM
    optimizer: torch.optim.AdamW
    generator: torch.Generator
    step: int
    log: dict


def _save_state(run: _Run, path: Path) -> None:
    partial = path.with_suffix(".partial")
    torch.save({"model": run.model.state_dict(), "optimizer": run.optimizer.state_dict(),
                "generator": run.generator.get_state(), "step": run.step, "log": run.log}, partial)
    os.replace(partial, path)  # an interrupted save never replaces a good state


def train_course_model(work_dir: str | Path, recipe: CourseModelRecipe = RECIPE, save_every_s: float = 180.0,
                       threads: int | None = None, max_steps: int | None = None) -> _Run:
    """Train the course model, resuming from ``work_dir/state.pt`` when a run of the same recipe left one.

    Args:
        work_dir: where the tokenizer, the resumable state (every ``save_every_s`` seconds) and the log go.
        recipe: the run's choices.
        save_every_s: seconds between saved states.
        threads: torch's intra-op threads (None: leave as is).
        max_steps: stop after this many steps of the schedule (the schedule stays ``recipe.steps`` long;
            for the tests, which re-run the first steps).

    Returns:
        The finished run (its ``log`` holds the losses, validation points, tokens/s).
    """
    from tqdm.auto import tqdm

    if threads is not None:
        torch.set_num_threads(threads)
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    corpus = course_corpus(recipe)
    tokenizer_file = work / "tokenizer.json"
    if tokenizer_file.exists():
        tokenizer = BPETokenizer.from_file(tokenizer_file)
    else:
        tokenizer = train_tokenizer(corpus, recipe)
        tokenizer.tokenizer.save(str(tokenizer_file))
    train_ids = encode_files(tokenizer, corpus.file_texts("train"))
    eval_texts = evaluation_text(corpus, recipe.eval_chars)
    eval_ids = encode_files(tokenizer, eval_texts)
    eval_bytes = sum(len(t.encode("utf-8")) for t in eval_texts)

    # On a GPU the same recipe runs in minutes, in bfloat16 autocast where the GPU has it; the windows are still
    # drawn on the CPU from the same generator, so the data order does not depend on the device.
    device = get_device()
    amp_dtype = autocast_dtype(device)
    model = new_course_model(recipe).to(device)
    optimizer = _optimizer(model, recipe)
    generator = torch.Generator().manual_seed(recipe.seed + 1)
    eval_ids = eval_ids.to(device)
    log = {"recipe": asdict(recipe), "python": platform.python_version(), "torch": torch.__version__,
           "train_files": len(corpus.train_files), "train_chars": len(corpus.train),
           "train_tokens": train_ids.numel(), "train_sha256": hashlib.sha256(corpus.train.encode()).hexdigest(),
           "eval_tokens": eval_ids.numel(), "eval_bytes": eval_bytes, "parameters": sum(
               p.numel() for p in model.parameters()), "first_losses": [], "loss_every_10": [], "valid": [],
           "seconds": 0.0}
    run = _Run(model, optimizer, generator, 0, log)
    state_file = work / "state.pt"
    if state_file.exists():
        state = torch.load(state_file, weights_only=False, map_location=device)
        if state["log"]["recipe"] == asdict(recipe) and state["log"]["train_sha256"] == log["train_sha256"]:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            generator.set_state(state["generator"])
            run.step, run.log = state["step"], state["log"]
            print(f"resuming at step {run.step} of {recipe.steps}", file=sys.stderr)
        else:
            print(f"{state_file} is from another recipe or corpus: starting afresh", file=sys.stderr)
    last_step = recipe.steps if max_steps is None else min(recipe.steps, max_steps)
    model.train()
    last_save, window_losses = time.monotonic(), []
    bar = tqdm(range(run.step + 1, last_step + 1), initial=run.step, total=last_step, mininterval=20,
               desc="course model", unit="step", file=sys.stderr)
    segment_start = time.perf_counter()
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = warmup_cosine_lr(step, recipe.warmup, recipe.steps, recipe.peak_lr, recipe.final_lr_ratio)
        batch = random_windows(train_ids, recipe.batch_size, recipe.context, generator).to(device)
        with torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype == torch.bfloat16):
            loss = next_token_loss(model(batch), batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), recipe.clip)
        optimizer.step()
        run.step = step
        window_losses.append(loss.item())
        if step <= 20:
            run.log["first_losses"].append(window_losses[-1])
        if step % 10 == 0:
            run.log["loss_every_10"].append(sum(window_losses) / len(window_losses))
            window_losses = []
            bar.set_postfix(loss=f"{run.log['loss_every_10'][-1]:.3f}", refresh=False)
        if step % recipe.eval_every == 0 or step == recipe.steps:
            nats, count = evaluate_nats(model, eval_ids, recipe.context)
            bpb = bits_per_byte(nats / count, count, eval_bytes)
            run.log["valid"].append({"step": step, "nats_per_token": nats / count, "bits_per_byte": bpb})
            print(f"step {step}: validation {nats / count:.4f} nats/token, {bpb:.4f} bits/byte", file=sys.stderr,
                  flush=True)
        if time.monotonic() - last_save > save_every_s or step == last_step:
            run.log["seconds"] += time.perf_counter() - segment_start
            segment_start = time.perf_counter()
            _save_state(run, state_file)
            last_save = time.monotonic()
    bar.close()
    run.log["tokens_per_second"] = run.step * recipe.tokens_per_step / max(run.log["seconds"], 1e-9)
    (work / "training_log.json").write_text(json.dumps(run.log, indent=1))
    return run


# ---------------------------------------------------------------------------------------------------------
# Hugging Face checkpoint: write and read
# ---------------------------------------------------------------------------------------------------------
def _llama_names(model: DecoderOnlyLM) -> dict[str, Tensor]:
    """The model's weights under Llama's Hugging Face names (the table in :mod:`attention_course.checkpoints`)."""
    weights = {"model.embed_tokens.weight": model.token_embedding.weight, "model.norm.weight": model.norm.weight}
    if not model.tied:
        weights["lm_head.weight"] = model.lm_head.weight
    for i, block in enumerate(model.blocks):
        attention, ff = block.self_attention, block.feed_forward
        for linear, name in ((attention.w_q, "self_attn.q_proj"), (attention.w_k, "self_attn.k_proj"),
                             (attention.w_v, "self_attn.v_proj"), (attention.w_o, "self_attn.o_proj"),
                             (ff.gate, "mlp.gate_proj"), (ff.up, "mlp.up_proj"), (ff.down, "mlp.down_proj")):
            weights[f"model.layers.{i}.{name}.weight"] = linear.weight
        weights[f"model.layers.{i}.input_layernorm.weight"] = block.norm1.weight
        weights[f"model.layers.{i}.post_attention_layernorm.weight"] = block.norm2.weight
    return weights


def save_llama_checkpoint(model: DecoderOnlyLM, directory: str | Path, dtype: torch.dtype = torch.bfloat16) -> None:
    """Write a Llama-style model as a Hugging Face Llama checkpoint (``config.json`` and ``model.safetensors``).

    The model must make Llama's choices: rotary positions in the rotate-half layout, RMSNorm, SwiGLU, no
    biases, no added positions, no sliding window. :func:`~attention_course.load_hf_checkpoint` and
    ``transformers.LlamaForCausalLM.from_pretrained`` both read the result.

    Raises:
        ValueError: the model makes a choice a Llama checkpoint cannot state.
    """
    from safetensors.torch import save_file

    config = model.config
    wanted = {"positions": "rotary", "rotary_pairing": "half", "norm": "rmsnorm", "feed_forward": "swiglu",
              "bias": False, "window": None}
    wrong = {k: getattr(config, k) for k, v in wanted.items() if getattr(config, k) != v}
    if wrong or model.positions != "none":
        raise ValueError(f"only a Llama-style model can be saved as a Llama checkpoint; this one has {wrong} "
                         f"and positions={model.positions!r} (wanted {wanted} and positions='none')")
    attention = model.blocks[0].self_attention
    hf_config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": model.vocab_size,
        "hidden_size": model.d_model, "intermediate_size": model.blocks[0].feed_forward.up.out_features,
        "num_hidden_layers": len(model.blocks), "num_attention_heads": attention.num_heads,
        "num_key_value_heads": config.num_kv_heads or attention.num_heads, "head_dim": attention.d_head,
        "hidden_act": "silu", "max_position_embeddings": model.max_len, "rms_norm_eps": config.norm_eps,
        "rope_theta": config.rotary_base, "tie_word_embeddings": model.tied, "attention_bias": False,
        "mlp_bias": False, "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
    tensors = {name: w.detach().to(dtype).contiguous() for name, w in _llama_names(model).items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_course_model(directory: str | Path | None = None, dtype: torch.dtype = torch.float32,
                      checksums: dict[str, str] | None = None) -> tuple[DecoderOnlyLM, BPETokenizer]:
    """The course model and its tokenizer, read from the files shipped with the package (no network).

    Args:
        directory: the checkpoint directory (default: the one inside the installed package).
        dtype: the model's dtype (the file holds bfloat16; float32 by default).
        checksums: file name -> SHA-256 (default :data:`CHECKSUMS`); every file listed must be present and match.

    Returns:
        ``(model, tokenizer)``: the :class:`~attention_course.DecoderOnlyLM` in evaluation mode and the
        :class:`~attention_course.tokenization.BPETokenizer`.

    Raises:
        FileNotFoundError: a shipped file is missing (for example a checkout made without it).
        ValueError: a file's SHA-256 differs from the recorded one (changed or damaged).
    """
    from attention_course.checkpoints import load_hf_checkpoint

    folder = Path(directory) if directory is not None else COURSE_MODEL_DIR
    expected = CHECKSUMS if checksums is None else checksums
    if not expected:
        raise FileNotFoundError("no course model is recorded in this version of the package (CHECKSUMS is empty); "
                                "train one with `make course-model`")
    for name, digest in expected.items():
        path = folder / name
        if not path.is_file():
            raise FileNotFoundError(f"the course model's file {name!r} is missing from {str(folder)!r}; reinstall "
                                    "the package, or retrain it with `make course-model`")
        actual = _sha256(path)
        if actual != digest:
            raise ValueError(f"the course model's file {name!r} in {str(folder)!r} has SHA-256 {actual[:16]}..., "
                             f"not the recorded {digest[:16]}...: it was changed or damaged")
    model = load_hf_checkpoint(folder, dtype=dtype)
    return model, BPETokenizer.from_file(folder / "tokenizer.json")


def export_course_model(work_dir: str | Path, out_dir: str | Path = COURSE_MODEL_DIR,
                        recipe: CourseModelRecipe = RECIPE) -> dict[str, str]:
    """Write the checkpoint directory from a finished run in ``work_dir``; return the files' SHA-256.

    The model is scored again after its weights are rounded to bfloat16, as shipped, and the model card
    (``README.md``) is written from the log.
    """
    from attention_course.checkpoints import load_hf_checkpoint

    work, out = Path(work_dir), Path(out_dir)
    state = torch.load(work / "state.pt", weights_only=False, map_location="cpu")
    if state["step"] != recipe.steps:
        raise ValueError(f"the run in {str(work)!r} stopped at step {state['step']} of {recipe.steps}; "
                         "finish it with `make course-model` first")
    model = new_course_model(recipe)
    model.load_state_dict(state["model"])
    out.mkdir(parents=True, exist_ok=True)
    save_llama_checkpoint(model, out)
    tokenizer = BPETokenizer.from_file(work / "tokenizer.json")
    tokenizer.tokenizer.save(str(out / "tokenizer.json"))
    shipped = load_hf_checkpoint(out)
    corpus = course_corpus(recipe)
    eval_texts = evaluation_text(corpus, recipe.eval_chars)
    eval_ids = encode_files(tokenizer, eval_texts)
    nats, count = evaluate_nats(shipped, eval_ids, recipe.context)
    log = dict(state["log"])
    log["shipped"] = {"dtype": "bfloat16", "nats_per_token": nats / count,
                      "bits_per_byte": bits_per_byte(nats / count, count, log["eval_bytes"])}
    log["tokens_per_second"] = state["step"] * recipe.tokens_per_step / max(log["seconds"], 1e-9)
    log["baselines"] = baseline_scores(tokenizer, corpus, eval_texts)
    (out / "training_log.json").write_text(json.dumps(log, indent=1) + "\n")
    (out / "README.md").write_text(model_card(log, recipe))
    return {name: _sha256(out / name) for name in
            ("config.json", "model.safetensors", "tokenizer.json", "training_log.json", "README.md")}


def baseline_scores(tokenizer: BPETokenizer, corpus: StdlibCorpus, eval_texts: Sequence[str],
                    orders: Sequence[int] = (2, 3, 4, 5)) -> dict[str, dict[str, float]]:
    """Bits per byte and nats per token of the counting baselines on the evaluation text: interpolated
    Kneser-Ney n-grams trained on the same training tokens, and lzma on the evaluation text alone."""
    train_ids, eval_ids = encode_files(tokenizer, corpus.file_texts("train")), encode_files(tokenizer, eval_texts)
    num_bytes = sum(len(t.encode("utf-8")) for t in eval_texts)
    scores = {}
    for order in orders:
        nats = KneserNeyLM(order, len(tokenizer)).fit(train_ids).token_nats(eval_ids)
        scores[f"kneser_ney_{order}"] = {"nats_per_token": float(nats.mean()),
                                         "bits_per_byte": bits_per_byte(float(nats.mean()), nats.size, num_bytes)}
    scores["lzma"] = {"bits_per_byte": lzma_bits_per_byte("".join(eval_texts))}
    return scores


def model_card(log: dict, recipe: CourseModelRecipe = RECIPE) -> str:
    """The model card (``README.md`` of the checkpoint directory), written from the training log."""
    r, shipped, baselines = recipe, log["shipped"], log["baselines"]
    best = min((k for k in baselines if k.startswith("kneser_ney")), key=lambda k: baselines[k]["bits_per_byte"])
    valid = log["valid"]
    last, before = valid[-1], valid[-3] if len(valid) >= 3 else valid[0]
    slope = (last["bits_per_byte"] - before["bits_per_byte"]) / max(last["step"] - before["step"], 1) * 1000
    tokens_seen = r.steps * r.tokens_per_step
    rows = [f"| the course model ({log['parameters'] / 1e6:.2f}M parameters, bfloat16) | "
            f"{shipped['nats_per_token']:.3f} | {shipped['bits_per_byte']:.3f} |"]
    rows += [f"| interpolated Kneser-Ney, order {k.rsplit('_', 1)[1]} | {v['nats_per_token']:.3f} | "
             f"{v['bits_per_byte']:.3f} |" for k, v in baselines.items() if k.startswith("kneser_ney")]
    lzma_bpb = baselines["lzma"]["bits_per_byte"]
    rows.append(f"| lzma (preset 9, extreme), the evaluation text alone | - | {lzma_bpb:.3f} |")
    gain = 1 - shipped["bits_per_byte"] / baselines[best]["bits_per_byte"]
    train_tail = sum(log["loss_every_10"][-50:]) / len(log["loss_every_10"][-50:])
    return f"""---
license: mit
language: code
tags: [llama, course, python-code]
---
# The course model

A {log['parameters'] / 1e6:.2f}M-parameter Llama-style language model of Python source code, trained from scratch by
the course "Attention and the Transformer" with its own library (`attention_course.DecoderOnlyLM`), so that its
lessons on sampling, interpretability and serving have a model that beats counting. It is small: read it as a
specimen, not as a tool.

## Architecture
Llama's choices at a small size: {r.num_layers} blocks, `d_model` {r.d_model}, {r.num_heads} query heads of
{r.d_model // r.num_heads} dimensions sharing {r.num_kv_heads} key/value heads (grouped-query attention), a SwiGLU
feed-forward of width {r.d_ff}, RMSNorm before each sublayer, rotary positions (rotate-half layout, base 10,000),
no biases, the output layer tied to the token embedding, a context of {r.context} tokens. Byte-level BPE with
{r.vocab_size} tokens (256 byte symbols and {r.vocab_size - 256} merges), trained on the training split only.
The files are a Hugging Face Llama checkpoint: `transformers.LlamaForCausalLM.from_pretrained` and
`attention_course.load_hf_checkpoint` both load them, with equal logits (tested).

## Data
The source code of the Python {log['python']} standard library (`load_stdlib_corpus(packages=True)`): the
top-level modules and the modules inside packages, without test suites or `site-packages`, files over
{r.max_file_chars:,} characters left out. A file goes to validation when the CRC-32 of its path relative to the
standard library is 0 modulo 8, so no validation file is ever trained on, on any Python version. Training:
{log['train_files']} files, {log['train_chars']:,} characters, {log['train_tokens']:,} tokens. Evaluation: the first
{r.eval_chars:,} characters of the validation files ({log['eval_tokens']:,} tokens, {log['eval_bytes']:,} bytes).
The standard library is distributed under the Python Software Foundation License; the model is trained on it
as data and ships none of its text.

## Training
`make course-model`: AdamW (betas 0.9, 0.95, weight decay
{r.weight_decay} on matrices), peak learning rate {r.peak_lr} after {r.warmup} warm-up steps, cosine decay to
{r.final_lr_ratio:g} of the peak at step {r.steps}, gradient clipping at {r.clip}, {r.steps:,} steps of {r.batch_size}
random windows of {r.context} tokens: {tokens_seen:,} tokens seen, {tokens_seen / log['train_tokens']:.1f} passes
over the training tokens. GPT-2's initialisation, seed {r.seed}. On two CPU cores (PyTorch {log['torch']}, float32)
the run took {log['seconds'] / 60:.0f} minutes at {log['tokens_per_second']:,.0f} tokens per second. It saves
a resumable state every few minutes; an interrupted run continues where it stopped.

Why this size: at this throughput, 90 minutes buy about {log['tokens_per_second'] * 5400 / 1e6:.0f}M tokens, and
a model of about 2M parameters trained on 20 tokens per parameter (the compute-optimal ratio of Hoffmann et al.
2022) needs about 40M: the compute budget fits a model of this size. The data fit it less well: the
{log['train_tokens'] / 1e6:.1f}M training tokens are seen {tokens_seen / log['train_tokens']:.0f} times (see below).

## Results on the evaluation text
| model | nats/token | bits/byte |
|---|---|---|
{chr(10).join(rows)}

The model's bits per byte are {gain:.1%} below the best Kneser-Ney n-gram (order {best.rsplit('_', 1)[1]}),
{'meeting' if gain >= 0.2 else 'short of'} the course's target of 20%, and
{1 - shipped['bits_per_byte'] / baselines['lzma']['bits_per_byte']:.0%} below lzma.
Over the last {last['step'] - before['step']:,} steps (from step {before['step']:,} to {last['step']:,}) the validation
bits per byte changed by {slope:+.3f} per 1,000 steps, as the learning rate decayed: the curve has flattened.
The training loss of the last 500 steps, {train_tail:.2f} nats per token, is far below the validation loss,
{last['nats_per_token']:.2f}: after
{tokens_seen / log['train_tokens']:.0f} passes the model has memorised much of its training text, and training
longer at this size would mostly memorise more. What would lower the validation loss is more distinct text (the
standard library's own test suites, left out here, hold about 19 MB more) with a model a few times larger, or
regularisation (dropout, stronger weight decay) at this size.

## Limits
A model of Python {log['python']}'s standard library with a {r.context}-token context: it writes code that looks like
the standard library's, often with invented names and wrong logic, and it knows nothing else. Its numbers are for
teaching: how sampling, attention heads and serving behave in a real trained model.
"""


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m attention_course.course_model", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=("train", "export", "all"))
    parser.add_argument("--work", default="_build/course-model", help="the run's resumable state and tokenizer")
    parser.add_argument("--out", default=str(COURSE_MODEL_DIR), help="the checkpoint directory to write")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args(argv)
    if args.command in ("train", "all"):
        train_course_model(args.work, threads=args.threads)
    if args.command in ("export", "all"):
        digests = export_course_model(args.work, args.out)
        print("CHECKSUMS = " + json.dumps(digests, indent=4))


if __name__ == "__main__":
    main()
