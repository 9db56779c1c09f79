"""Simulated learners: notebooks written the way a class writes them, built from the solution notebooks.

Each :class:`Learner` starts from a solution notebook (as a learner would finish it: no solution-only
cells) and applies edits: a part's solution block replaced by another answer (correct but unusual, or
wrong), a cell inserted before a part's graded cell (a helper, an import), an edited check cell, another
check-setup line. ``expect`` says, per part, what the grader must give: ``"full"``, ``"zero"``, or
``"some"`` (less than full). Tests execute each notebook in a real kernel, grade it with the grader, and
compare the two (:mod:`tests.grading.test_learners`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from attention_course.grading.notebook_format import (
    BEGIN_SOLUTION,
    END_SOLUTION,
    TAG_CHECK,
    TAG_GRADED,
    TAG_PREAMBLE,
    TAG_SOLUTION_ONLY,
    cell_part,
    cell_tags,
    notebook_exercise,
)

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = ROOT / "exercises" / "solutions"
SEED = 1234


@dataclass(frozen=True)
class Learner:
    """One simulated submission.

    Attributes:
        name: file stem of the notebook written.
        notebook: stem of the solution notebook it starts from.
        answers: part -> new body of its solution block (indented by 4 spaces where the code is written).
        before: part -> source of a code cell inserted before the part's graded cell.
        checks: part -> new source of the part's check cell.
        expect: part -> "full", "zero" or "some" from the grader (parts not named: "full").
        shown: texts that the notebook's outputs must contain (warnings, messages).
        time_limit: the notebook check's time limit (seconds), set in the check-setup cell.
        preamble: the source of the notebook's preamble cell, e.g. as an older handout had it (the grader
            and the check run the exercise module's preamble, never the notebook's copy).
    """

    name: str
    notebook: str
    answers: dict[str, str] = field(default_factory=dict)
    before: dict[str, str] = field(default_factory=dict)
    checks: dict[str, str] = field(default_factory=dict)
    expect: dict[str, str] = field(default_factory=dict)
    shown: tuple[str, ...] = ()
    time_limit: float | None = None
    preamble: str | None = None


def _replace_block(source: str, body: str) -> str:
    lines = source.split("\n")
    start = next(i for i, line in enumerate(lines) if line.strip() == BEGIN_SOLUTION)
    end = next(i for i, line in enumerate(lines) if line.strip() == END_SOLUTION)
    return "\n".join(lines[:start] + body.strip("\n").split("\n") + lines[end + 1:])


def build(learner: Learner, folder: Path) -> Path:
    """Write ``learner``'s notebook into ``folder`` and return its path."""
    nb = nbformat.read(SOLUTIONS / f"{learner.notebook}.ipynb", as_version=4)
    exercise_id = notebook_exercise(nb)
    cells = []
    for cell in nb.cells:
        if TAG_SOLUTION_ONLY in cell_tags(cell):
            continue
        part = cell_part(cell)
        if cell.cell_type == "code" and re.search(rf'check = exercise\("{exercise_id}"\)', cell.source):
            extra = f", time_limit={learner.time_limit}" if learner.time_limit else ""
            cell.source = cell.source.replace(f'exercise("{exercise_id}")',
                                              f'exercise("{exercise_id}", seed={SEED}{extra})')
        if TAG_PREAMBLE in cell_tags(cell) and learner.preamble is not None:
            cell.source = learner.preamble
        if TAG_GRADED in cell_tags(cell) and part in learner.before:
            cells.append(nbformat.v4.new_code_cell(learner.before[part]))
        if TAG_GRADED in cell_tags(cell) and part in learner.answers:
            cell.source = _replace_block(cell.source, learner.answers[part])
        if TAG_CHECK in cell_tags(cell) and part in learner.checks:
            cell.source = learner.checks[part]
        cells.append(cell)
    nb.cells = cells
    path = folder / f"{learner.name}.ipynb"
    nbformat.write(nb, path)
    return path


EX02, EX03, EX04, EX05 = ("ex02_hard_and_soft_attention", "ex03_key_value_store", "ex04_queries_keys_values",
                          "ex05_scaling_and_masking")
EX06, EX07, EX08, EX09 = ("ex06_multi_head_attention", "ex07_positional_encoding",
                          "ex08_layernorm_dropout_residuals", "ex09_the_encoder")
EX10, EX11, BUG_HUNT = "ex10_decoder_and_transformer", "ex11_efficient_attention", "ex_bug_hunt"

LEARNERS = [
    # --- correct but unusual answers (full marks), one notebook per exercise; parity cases mixed in ------
    Learner("ex02_loops_einsum_and_a_helper_cell", EX02, answers={
        "soft_attention_weights": """\
    rows = scores.double().reshape(-1, scores.shape[-1])
    out = torch.empty_like(rows)
    for r in range(rows.shape[0]):  # one row at a time, in float64
        e = torch.exp(beta * rows[r] - (beta * rows[r]).max())
        out[r] = e / e.sum()
    return out.reshape(scores.shape).to(scores.dtype)""",
        "attention_pooling": "    return torch.einsum('...mt,...td->...md', weights, X)",
        "hard_attention_weights": "    return one_hot_of_first_max(scores)",
    }, before={"hard_attention_weights": """\
def one_hot_of_first_max(scores):
    return F.one_hot(scores.argmax(dim=-1), num_classes=scores.shape[-1]).to(scores.dtype)"""},
        # A helper in another cell is carried into the graded run (and the learner told so); a debug print
        # in a check cell that still calls the check is fine.
        checks={"attention_pooling": "print('checking attention_pooling')\n"
                                     "check.attention_pooling(attention_pooling)  # debug line above"},
        shown=("uses `one_hot_of_first_max` from another cell: the grader carries plain functions and imports",
               "checking attention_pooling")),
    Learner("ex03_einsum_and_an_import_cell", EX03, answers={
        "soft_lookup": """\
    weights = torch.softmax(SHARPNESS * beta * torch.einsum('...md,...nd->...mn', query, keys), dim=-1)
    return torch.einsum('...mn,...nv->...mv', weights, values), weights""",
        "hard_lookup": """\
    best = torch.as_tensor(np.asarray((query @ keys.transpose(-2, -1)).argmax(dim=-1)))
    return torch.gather(values, -2, best[..., None].expand(*best.shape, values.shape[-1]))""",
    }, before={"hard_lookup": "import numpy as np\nSHARPNESS = 1.0  # a variable is not carried"},
        expect={"soft_lookup": "zero"},
        shown=("uses `np` from another cell: the grader carries plain functions and imports",
               "`SHARPNESS`, defined in a cell the grader does not run")),
    Learner("ex04_float64_inplace_and_comments", EX04, answers={
        "attention_matrix_form": """\
    scores = (Q.double() @ K.double().transpose(-2, -1)) / math.sqrt(Q.shape[-1])
    weights = torch.softmax(scores, dim=-1)
    return (weights @ V.double()).to(Q.dtype), weights.to(Q.dtype)""",
        "attend_one_query": """\
    q /= math.sqrt(q.shape[-1])  # in place: changes the caller's tensor
    weights = torch.softmax(K @ q, dim=-1)
    return weights @ V, weights""",
    }, checks={"split_fused_projection": "# my check, with a comment\ncheck.split_fused_projection(split_fused_projection)",
               # Extra lines are fine in a check cell (see ex02's learner); an edited call is not.
               "project_qkv": "print('done')\ncheck.project_qkv(project_qkv, hint=1)"},
        expect={"attend_one_query": "zero", "project_qkv": "zero"},
        shown=("changed its input `q` in place", "its check cell was edited or deleted")),
    Learner("ex04_wrong_softmax_axis", EX04, answers={
        "attention_matrix_form": """\
    weights = torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1]), dim=-2)
    return weights @ V, weights""",
    }, expect={"attention_matrix_form": "some", "cross_attention": "some"},
        shown=("First: part 5 uses your attention_matrix_form from part 4, which fails; fix part 4 first.",)),
    Learner("ex05_einsum_and_inplace_mask", EX05, answers={
        "scaled_scores": "    return torch.einsum('...qd,...kd->...qk', Q, K) / Q.shape[-1] ** 0.5",
        "masked_softmax": """\
    if mask is None:
        return torch.softmax(scores, dim=-1)
    has_key = mask.any(dim=-1, keepdim=True)
    mask.logical_not_()  # now True = blocked, in place
    weights = torch.softmax(scores.masked_fill(mask, torch.finfo(scores.dtype).min), dim=-1)
    return weights.masked_fill(~has_key, 0.0)""",
    }, expect={"masked_softmax": "some", "scaled_dot_product_attention": "some"},
        shown=("changed its input `mask` in place",
               "First: part 3 uses your masked_softmax from part 2, which fails; fix part 2 first.")),
    Learner("ex06_loops", EX06, answers={
        "merge_heads": "    return torch.cat([x[:, h] for h in range(x.shape[1])], dim=-1)",
    }),
    Learner("ex07_loops_and_a_forbidden_library_call", EX07, answers={
        "sinusoidal_encoding": """\
    import attention_course as ac  # not allowed in this part: the library has the answer
    table = ac.sinusoidal_positional_encoding(int(positions.max()) + 1, d_model)
    return table[positions.long()]""",
        "offset_similarity": """\
    total = torch.zeros(offsets.shape, dtype=torch.float64)
    for i in range(d_model // 2):
        total = total + torch.cos(offsets.double() * 10000.0 ** (-2 * i / d_model))
    return total""",
    }, expect={"sinusoidal_encoding": "zero"}, shown=("no marks:",)),
    Learner("ex08_float64_and_inplace_residual", EX08, answers={
        "layer_norm": """\
    x64 = x.double()
    mean = x64.mean(dim=-1, keepdim=True)
    var = ((x64 - mean) ** 2).mean(dim=-1, keepdim=True)
    return (weight.double() * (x64 - mean) / torch.sqrt(var + eps) + bias.double()).to(x.dtype)""",
        "residual_sublayer": """\
    if norm_first:
        return x.add_(sublayer(norm(x)))  # in place on the caller's x
    return norm(x + sublayer(x))""",
    }, expect={"residual_sublayer": "some"}, shown=("changed its input `x` in place",)),
    Learner("ex09_functional", EX09, answers={
        "feed_forward": """\
    if W1.shape[0] != x.shape[-1] or W2.shape[-1] != x.shape[-1]:
        raise ValueError(f"W1 has {W1.shape[0]} rows, W2 has {W2.shape[-1]} columns, x has {x.shape[-1]} features")
    return F.linear(F.relu(F.linear(x, W1.T, b1)), W2.T, b2)""",
    }),
    Learner("ex10_library_mask_and_narrow", EX10, answers={
        "shift_target": "    return tgt.narrow(1, 0, tgt.size(1) - 1), tgt.narrow(1, 1, tgt.size(1) - 1)",
        "greedy_decode": """\
    memory_mask = (src != pad_id)[:, None, None, :]
    memory = model.encode(src, memory_mask)
    tokens = torch.full((src.size(0), 1), bos_id, dtype=torch.long)
    finished = torch.zeros(src.size(0), dtype=torch.bool)
    for _ in range(max_len):
        causal = ac.causal_mask(tokens.size(1))  # allowed here: the course's mask helper
        next_token = model.decode(tokens, memory, causal, memory_mask)[:, -1].argmax(dim=-1)
        next_token = torch.where(finished, torch.full_like(next_token, pad_id), next_token)
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        finished = finished | (next_token == eos_id)
        if bool(finished.all()):
            break
    return tokens""",
    }),
    Learner("ex10_infinite_loop", EX10, answers={
        "greedy_decode": """\
    memory_mask = (src != pad_id)[:, None, None, :]
    memory = model.encode(src, memory_mask)
    tokens = torch.full((src.size(0), 1), bos_id, dtype=torch.long)
    done = torch.zeros(src.size(0), dtype=torch.bool)
    while not done.all():  # never stops when a row never emits eos
        causal = torch.ones(tokens.size(1), tokens.size(1), dtype=torch.bool).tril()
        next_token = model.decode(tokens, memory, causal, memory_mask)[:, -1].argmax(dim=-1)
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        done = done | (next_token == eos_id)
    return tokens""",
    }, expect={"greedy_decode": "zero"}, time_limit=3,
        # handed out before ex10's preamble imported the course library: still graded the same
        preamble="import math\n\nimport torch\nimport torch.nn.functional as F\nfrom torch import nn",
        shown=("your function `greedy_decode` did not return within 3 s (an infinite loop?)",)),
    Learner("ex11_preallocated", EX11, answers={
        "cache_append": """\
    if past_keys is None:
        return new_keys, new_values
    out = []
    for past, new in ((past_keys, new_keys), (past_values, new_values)):
        joined = past.new_empty(*past.shape[:-2], past.shape[-2] + new.shape[-2], past.shape[-1])
        joined[..., :past.shape[-2], :] = past
        joined[..., past.shape[-2]:, :] = new
        out.append(joined)
    return tuple(out)""",
    }),
    # the loss from log_softmax + gather with a padding mask (float64), the cached step in einsum
    Learner("ex13_gather_and_a_padding_mask", "ex13_decoder_only_language_models", answers={
        "next_token_loss": """\
    log_probs = torch.log_softmax(logits[:, :-1].double(), dim=-1)  # (B, L-1, V)
    targets = tokens[:, 1:]
    picked = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, L-1)
    real = targets != pad_id
    return (-(picked * real).sum() / real.sum()).to(logits.dtype)""",
        "cached_attention_step": """\
    q, k, v = (torch.einsum("bld,de->ble", x_new, w) for w in (w_q, w_k, w_v))
    keys = k if past_keys is None else torch.cat([past_keys, k], dim=1)
    values = v if past_values is None else torch.cat([past_values, v], dim=1)
    scores = torch.einsum("bqd,bkd->bqk", q, keys) / q.shape[-1] ** 0.5
    return torch.einsum("bqk,bkd->bqd", scores.softmax(dim=-1), values), keys, values""",
        "rms_norm": """\
    if weight.dim() != 1 or weight.numel() != x.shape[-1]:
        raise ValueError(f"{weight.numel()} gains for {x.shape[-1]} features")
    x64 = x.double()
    inverse_rms = torch.rsqrt(x64.square().mean(-1, keepdim=True) + eps)
    return (x64 * inverse_rms * weight.double()).to(x.dtype)""",
    }),
    # rotary as complex multiplication, the query turned back instead of the key forward, slopes by loop
    Learner("ex14_complex_numbers_and_loops", "ex14_positions_for_long_contexts", answers={
        "rotate_pairs": """\
    if x.shape[-1] % 2:
        raise ValueError(f"odd feature size {x.shape[-1]}")
    pairs = torch.view_as_complex(x.double().reshape(*x.shape[:-1], -1, 2).contiguous())
    freqs = torch.tensor([base ** (-2 * i / x.shape[-1]) for i in range(x.shape[-1] // 2)],
                         dtype=torch.float64)
    turn = torch.polar(torch.ones(len(positions), len(freqs), dtype=torch.float64),
                       positions.double()[:, None] * freqs)
    return torch.view_as_real(pairs * turn).flatten(-2).to(x.dtype)""",
        "score_at_offset": """\
    back = rotate_pairs(q, torch.full((q.shape[0],), -offset), base)  # q R_(-offset)^T
    return torch.einsum("nd,nd->n", back, k)""",
        "add_alibi": """\
    n = 1
    while 2 * n <= num_heads:
        n *= 2
    slopes = [2 ** (-8 * h / n) for h in range(1, n + 1)]
    h = 1
    while len(slopes) < num_heads:
        slopes.append(2 ** (-8 * h / (2 * n)))
        h += 2
    return torch.tensor(slopes, dtype=torch.float64)""",
        "rotate_half": """\
    d = x.shape[-1]
    if d % 2:
        raise ValueError(f"odd feature size {d}")
    pairs = torch.complex(x[..., : d // 2].double(), x[..., d // 2:].double())
    freqs = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    turn = torch.polar(torch.ones(len(positions), d // 2, dtype=torch.float64),
                       positions.double()[:, None] * freqs)
    return torch.cat(((pairs * turn).real, (pairs * turn).imag), dim=-1).to(x.dtype)""",
        # Hugging Face's conversion of Meta's Llama weights: pairs as a (d_head/2, 2) view, transposed
        "interleaved_to_half": """\
    rows, d_model = weight.shape
    if rows % num_heads:
        raise ValueError(f"{rows} rows for {num_heads} heads")
    if rows // num_heads % 2:
        raise ValueError(f"head size {rows // num_heads} is odd")
    pairs = weight.view(num_heads, rows // num_heads // 2, 2, d_model)
    return pairs.transpose(1, 2).reshape(rows, d_model)""",
    }),
    # ex15: query groups as a view (no copies) and einsum, the window as two comparisons, the tile in einsum
    Learner("ex15_views_and_einsum", "ex15_attention_at_inference_scale", answers={
        "grouped_query_attention": """\
    b, h, lq, d = query.shape
    h_kv = key.shape[1]
    grouped = query.reshape(b, h_kv, h // h_kv, lq, d)  # (B, H_kv, G, Lq, d)
    scores = torch.einsum("bgrld,bgkd->bgrlk", grouped, key).reshape(b, h, lq, -1) / math.sqrt(d)
    if mask is not None:
        scores = scores.masked_fill(mask.logical_not(), -math.inf)
    weights = scores.softmax(dim=-1).reshape(b, h_kv, h // h_kv, lq, -1)
    return torch.einsum("bgrlk,bgkd->bgrld", weights, value).reshape(b, h, lq, -1)""",
        "sliding_window_mask": """\
    not_future = query_positions.unsqueeze(1) >= key_positions.unsqueeze(0)
    recent = query_positions.unsqueeze(1) - window < key_positions.unsqueeze(0)
    return not_future & recent""",
        "flash_backward_tile": """\
    p = torch.exp(torch.einsum("...qd,...kd->...qk", query, key) * scale - lse[..., None])
    ds = p * (torch.einsum("...qd,...kd->...qk", grad_output, value) - delta[..., None])
    return (torch.einsum("...qk,...kd->...qd", ds, key) * scale,
            torch.einsum("...qk,...qd->...kd", ds, query) * scale,
            torch.einsum("...qk,...qd->...kd", p, grad_output))""",
    }),
    # ex16: a generator seeded in two steps and .repeat, the induction score by loops, heads summed one by one
    Learner("ex16_loops_and_skipped_heads", "ex16_what_heads_learn", answers={
        "repeated_batch": """\
    g = torch.Generator()
    g.manual_seed(seed)
    return torch.randint(0, vocab_size, (batch_size, half_length), generator=g).repeat(1, 2)""",
        "induction_score": """\
    total = torch.zeros(weights.shape[1], dtype=weights.dtype)
    count = 0
    for b in range(tokens.shape[0]):
        for i in range(tokens.shape[1]):
            keys = [j + 1 for j in range(i) if tokens[b, j] == tokens[b, i]]
            if keys:
                total = total + weights[b, :, i, keys].sum(dim=-1)
                count += 1
    return total / count""",
        "ablation_loss_change": """\
    def logits_without(skip):
        length = x.shape[1]
        future = torch.triu(torch.ones(length, length, dtype=torch.bool), diagonal=1)
        residual = x
        for h in range(W_Q.shape[0]):
            if h == skip:
                continue
            scores = (x @ W_Q[h]) @ (x @ W_K[h]).transpose(1, 2) * W_Q.shape[-1] ** -0.5
            pattern = scores.masked_fill(future, -math.inf).softmax(dim=-1)
            residual = residual + pattern @ (x @ W_V[h]) @ W_O[h]
        return residual @ W_U

    def cross_entropy(z):
        return F.cross_entropy(z[:, :-1].flatten(0, 1), tokens[:, 1:].flatten()).item()

    return cross_entropy(logits_without(head)) - cross_entropy(logits_without(-1))""",
    }),
    # ex17: the lookup by index_select and subtraction, the draft checked all at once (a running product of
    # acceptances), the intensity summed sequence by sequence
    Learner("ex17_vectorised_verification", "ex17_serving_attention", answers={
        "locate": """\
    entries = torch.div(positions, block_size, rounding_mode="floor")
    return block_table.index_select(0, entries), positions - entries * block_size""",
        "verify_draft": """\
    k = draft_tokens.numel()
    rows = torch.arange(k)
    ratios = p_target[rows, draft_tokens] / p_draft[rows, draft_tokens]
    still_accepted = (uniforms < ratios.clamp(max=1.0)).long().cumprod(dim=0)  # 1 until the first no
    n = int(still_accepted.sum())
    if n == k:
        return n, p_target[k]
    residual = torch.clamp(p_target[n] - p_draft[n], min=0.0)
    return n, residual / residual.sum()""",
        "decode_intensity": """\
    flops, cache_values = 0, 0
    for length in contexts.tolist():  # every sequence: its own FLOPs, its own keys and values
        flops += 2 * num_params + 4 * num_layers * d_model * length
        cache_values += 2 * num_layers * d_kv * length
    return flops / (bytes_per_value * num_params + bytes_per_value * cache_values)""",
    }),
    Learner("bug_hunt_float64", BUG_HUNT, answers={
        "layer_norm": """\
    x64 = x.double()
    mean = x64.mean(dim=-1, keepdim=True)
    var = ((x64 - mean) ** 2).mean(dim=-1, keepdim=True)
    normalized = ((x64 - mean) / torch.sqrt(var + eps)).to(x.dtype)""",
    }),
    # ex17: blocks found with torch.div and index_select, the draft verified with a while loop, the intensity from Python numbers
    Learner("ex17_index_select_and_a_while_loop", "ex17_serving_attention", answers={
        "locate": """\
    entries = torch.div(positions, block_size, rounding_mode="floor")
    return block_table.index_select(0, entries), torch.remainder(positions, block_size)""",
        "verify_draft": """\
    accepted = 0
    while accepted < len(draft_tokens):
        token = int(draft_tokens[accepted])
        if float(uniforms[accepted]) * float(p_draft[accepted, token]) >= float(p_target[accepted, token]):
            residual = torch.clamp(p_target[accepted] - p_draft[accepted], min=0)
            return accepted, residual / residual.sum()
        accepted += 1
    return accepted, p_target[accepted]""",
        "decode_intensity": """\
    positions = sum(int(c) for c in contexts)
    flops = 2 * num_params * len(contexts) + 4 * num_layers * d_model * positions
    moved = bytes_per_value * (num_params + 2 * num_layers * d_kv * positions)
    return flops / moved""",
    }),
]
