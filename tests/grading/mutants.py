"""Known-wrong implementations ("mutants") of the exercises' parts, and how to make a notebook of one.

A mutant names a solution notebook, a part, and one exact text replacement inside that part's graded cell
(the text must occur exactly once, so a mutant cannot silently stop applying when the solution changes).
Each is a mistake learners or tutorials make; the grader must take marks away for every one.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import nbformat

from attention_course.grading.notebook_format import TAG_GRADED, cell_part, cell_tags

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = ROOT / "exercises" / "solutions"
EX02 = "ex02_hard_and_soft_attention"
BUG_HUNT = "ex_bug_hunt"
EX13 = "ex13_decoder_only_language_models"
EX14 = "ex14_positions_for_long_contexts"
EX16 = "ex16_what_heads_learn"


@dataclass(frozen=True)
class Mutant:
    name: str
    notebook: str  # stem of the solution notebook
    part: str
    old: str
    new: str
    zero: bool = False  # must score 0 on its part (right only on cases that do not tell it apart)
    #: words the check's message must contain (naming the mistake, not only a number); every mutant declares them
    #: (test_learner_feedback.test_every_known_mistake_declares_the_words_that_name_it)
    says: str = ""
    #: caught only where learner code runs without root's rights, as in the grader's sandbox (its rule is the
    #: sandbox's): judged through the grader's command (test_grader_scores), not in the test process
    sandbox_only: bool = False


MUTANTS = [
    # --- ex02 -----------------------------------------------------------------------------------------
    Mutant("hard_returns_index", EX02, "hard_attention_weights",
           "return F.one_hot(winners, num_classes=scores.shape[-1]).to(scores.dtype)", "return winners",
           says='turn the argmax index into a one-hot vector'),
    Mutant("hard_all_maxima", EX02, "hard_attention_weights",
           "return F.one_hot(winners, num_classes=scores.shape[-1]).to(scores.dtype)",
           "return (scores == scores.amax(dim=-1, keepdim=True)).to(scores.dtype)",
           says='hard attention picks exactly one key'),
    Mutant("hard_last_maximum", EX02, "hard_attention_weights",
           "winners = scores.argmax(dim=-1)", "winners = scores.shape[-1] - 1 - scores.flip(-1).argmax(dim=-1)",
           says='but the first highest score is at key'),
    Mutant("soft_no_max_subtraction", EX02, "soft_attention_weights",
           "logits = logits - logits.amax(dim=-1, keepdim=True)", "logits = logits",
           says="subtract each row's maximum before exponentiating"),
    Mutant("soft_wrong_axis", EX02, "soft_attention_weights",
           "return exp / exp.sum(dim=-1, keepdim=True)", "return exp / exp.sum(dim=0, keepdim=True)", zero=True,
           says='instead of 1'),
    Mutant("soft_beta_divides", EX02, "soft_attention_weights", "logits = beta * scores", "logits = scores / beta",
           says='your weights divide the scores by beta: multiply them by beta instead'),
    Mutant("soft_ignores_beta", EX02, "soft_attention_weights", "logits = beta * scores", "logits = scores",
           says='your weights ignore beta: multiply the scores by it'),
    Mutant("soft_always_float32", EX02, "soft_attention_weights",
           "return exp / exp.sum(dim=-1, keepdim=True)", "return (exp / exp.sum(dim=-1, keepdim=True)).float()",
           says='(the dtype of the inputs)'),
    Mutant("pooling_transposed", EX02, "attention_pooling",
           "return torch.matmul(weights, X)", "return torch.matmul(X.transpose(-2, -1), weights.transpose(-2, -1))",
           says='your output is (weights @ X)ᵀ'),
    Mutant("pooling_ignores_weights", EX02, "attention_pooling",
           "return torch.matmul(weights, X)",
           "return X.mean(dim=-2, keepdim=True).expand(*weights.shape[:-1], X.shape[-1])", zero=True,
           says='every output row is the plain mean of the rows of X'),
    Mutant("self_attention_softmax_over_queries", EX02, "self_attention_no_projections",
           "weights = soft_attention_weights(scores, beta)",
           "weights = soft_attention_weights(scores.transpose(-2, -1), beta).transpose(-2, -1)", zero=True,
           says='instead of 1'),
    Mutant("self_attention_extra_scaling", EX02, "self_attention_no_projections",
           "scores = torch.matmul(X, X.transpose(-2, -1))",
           "scores = torch.matmul(X, X.transpose(-2, -1)) / math.sqrt(X.shape[-1])",
           says='your weights divide the scores by sqrt(d)'),
    Mutant("self_attention_swapped_outputs", EX02, "self_attention_no_projections",
           "return attention_pooling(X, weights), weights", "return weights, attention_pooling(X, weights)",
           says='return them in the order (output, weights)'),
    Mutant("self_attention_unstable_softmax", EX02, "self_attention_no_projections",
           "weights = soft_attention_weights(scores, beta)",
           "weights = torch.exp(beta * scores) / torch.exp(beta * scores).sum(dim=-1, keepdim=True)",
           says="subtract each row's maximum before exponentiating"),
    Mutant("equivariance_inverse_permutation", EX02, "equivariance_gap",
           "- f(X)[perm]).abs()", "- f(X)[torch.argsort(perm)]).abs()",
           says='your gap reorders f(X) by the inverse permutation: equivariance'),
    Mutant("equivariance_hard_coded_zero", EX02, "equivariance_gap",
           "return float((f(X[perm]) - f(X)[perm]).abs().max())", "return 0.0",
           says='but this f is not permutation equivariant'),
    Mutant("equivariance_same_side", EX02, "equivariance_gap", "- f(X)[perm]).abs()", "- f(X[perm])).abs()",
           says='but this f is not permutation equivariant'),
    # --- ex04 (notebook ex04_queries_keys_values) --------------------------------------------------------
    Mutant("project_no_dk_check", "ex04_queries_keys_values", "project_qkv",
           "if W_Q.shape[1] != W_K.shape[1]:", "if False:",
           says='queries and keys must share d_k'),
    Mutant("project_error_without_sizes", "ex04_queries_keys_values", "project_qkv",
           'f"X has {d_model} features but {name} has {W.shape[0]} rows"', '"the shapes do not match"',
           says='your ValueError should name the offending values'),
    Mutant("fused_equal_thirds", "ex04_queries_keys_values", "split_fused_projection",
           "return QKV.split([d_k, d_k, d_v], dim=-1)", "return QKV.chunk(3, dim=-1)",
           says='equal thirds only work when d_v = d_k'),
    Mutant("one_query_no_scale", "ex04_queries_keys_values", "attend_one_query",
           "scores = K @ q / math.sqrt(d_k)", "scores = K @ q",
           says='without the factor 1/sqrt(d_k)'),
    Mutant("one_query_divides_by_d_k", "ex04_queries_keys_values", "attend_one_query", "/ math.sqrt(d_k)", "/ d_k",
           says='divide by sqrt(d_k) instead'),
    Mutant("one_query_ignores_weights", "ex04_queries_keys_values", "attend_one_query",
           "output = weights @ V", "output = V.mean(dim=0)", zero=True,
           says='your output is the plain mean of the values'),
    Mutant("one_query_naive_exp", "ex04_queries_keys_values", "attend_one_query",
           "weights = torch.softmax(scores, dim=-1)", "weights = torch.exp(scores) / torch.exp(scores).sum()",
           says='subtract the largest score before exponentiating'),
    Mutant("matrix_softmax_over_queries", "ex04_queries_keys_values", "attention_matrix_form",
           "weights = torch.softmax(scores, dim=-1)", "weights = torch.softmax(scores, dim=-2)",
           says='instead of 1'),
    Mutant("matrix_dot_T", "ex04_queries_keys_values", "attention_matrix_form", "K.transpose(-2, -1)", "K.T",
           says='shapes do not fit'),
    Mutant("matrix_no_scale", "ex04_queries_keys_values", "attention_matrix_form", " / math.sqrt(Q.shape[-1])", "",
           says='without the factor 1/sqrt(d_k)'),
    Mutant("cross_queries_from_source", "ex04_queries_keys_values", "cross_attention",
           "Q = X_q @ W_Q", "Q = X_kv @ W_Q", zero=True,
           says='cross-attention gives one output per query'),
    Mutant("cross_values_from_queries", "ex04_queries_keys_values", "cross_attention",
           "V = X_kv @ W_V", "V = X_q @ W_V", zero=True,
           says='shapes do not fit'),
    # --- ex03 (notebook ex03_key_value_store) ------------------------------------------------------------
    Mutant("kv_hard_last_maximum", "ex03_key_value_store", "hard_lookup", "best = scores.argmax(dim=-1)",
           "best = scores.shape[-1] - 1 - scores.flip(-1).argmax(dim=-1)",
           says='the highest score (the first one, on a tie)'),
    Mutant("kv_hard_nearest_by_distance", "ex03_key_value_store", "hard_lookup",
           "scores = query @ keys.transpose(-2, -1)", "scores = -torch.cdist(query, keys)", zero=True,
           says='the highest score (the first one, on a tie)'),
    Mutant("kv_hard_returns_keys", "ex03_key_value_store", "hard_lookup", "return weights @ values  ",
           "return weights @ keys  ",
           says='your output rows are the best keys'),
    Mutant("kv_soft_no_beta", "ex03_key_value_store", "soft_lookup",
           "scores = beta * (query @ keys.transpose(-2, -1))", "scores = query @ keys.transpose(-2, -1)",
           says='your weights ignore beta: multiply the scores by beta before the'),
    Mutant("kv_soft_extra_sqrt_dk", "ex03_key_value_store", "soft_lookup",
           "scores = beta * (query @ keys.transpose(-2, -1))",
           "scores = beta * (query @ keys.transpose(-2, -1)) / math.sqrt(query.shape[-1])",
           says='your weights divide the scores by sqrt(d_k): in this exercise beta is'),
    Mutant("kv_soft_over_queries", "ex03_key_value_store", "soft_lookup", "weights = torch.softmax(scores, dim=-1)",
           "weights = torch.softmax(scores, dim=-2)",
           says='instead of 1'),
    Mutant("kv_soft_naive_exp", "ex03_key_value_store", "soft_lookup", "weights = torch.softmax(scores, dim=-1)",
           "weights = scores.exp() / scores.exp().sum(dim=-1, keepdim=True)",
           says="subtract each row's maximum score before exponentiating"),
    Mutant("kv_additive_tanh_each_side", "ex03_key_value_store", "additive_scores",
           "hidden = torch.tanh(projected_q + projected_k)", "hidden = torch.tanh(projected_q) + torch.tanh(projected_k)",
           says='your scores apply tanh to q W_q and to k W_k apart: add them first'),
    Mutant("kv_additive_no_tanh", "ex03_key_value_store", "additive_scores",
           "hidden = torch.tanh(projected_q + projected_k)", "hidden = projected_q + projected_k",
           says='your scores leave out the tanh: apply it to q W_q + k W_k before'),
    Mutant("kv_limit_one_hot_argmax", "ex03_key_value_store", "limit_lookup",
           "best = scores == scores.amax(dim=-1, keepdim=True)", "best = F.one_hot(scores.argmax(dim=-1), scores.shape[-1])",
           says='are tied for the highest score, so each should get weight'),
    Mutant("kv_limit_large_finite_beta", "ex03_key_value_store", "limit_lookup",
           "best = scores == scores.amax(dim=-1, keepdim=True)", "best = torch.softmax(1000.0 * scores, dim=-1)",
           says='are not tied: however small the gap, the higher score takes all the'),
    Mutant("kv_limit_not_normalised", "ex03_key_value_store", "limit_lookup",
           "weights = weights / weights.sum(dim=-1, keepdim=True)", "weights = weights",
           says='instead of 1'),
    # --- ex05 (notebook ex05_scaling_and_masking) --------------------------------------------------------
    Mutant("scores_no_scale", "ex05_scaling_and_masking", "scaled_scores", " / math.sqrt(Q.shape[-1])", "", zero=True,
           says='without the factor 1/sqrt(d_k)'),
    Mutant("scores_divide_by_d_k", "ex05_scaling_and_masking", "scaled_scores",
           "/ math.sqrt(Q.shape[-1])", "/ Q.shape[-1]", zero=True,
           says='divide by sqrt(d_k) instead'),
    Mutant("scores_keys_by_queries", "ex05_scaling_and_masking", "scaled_scores",
           "return Q @ K.transpose(-2, -1)", "return K @ Q.transpose(-2, -1)",
           says='one row per query and one column per key'),
    Mutant("softmax_minus_inf_unguarded", "ex05_scaling_and_masking", "masked_softmax",
           "filled = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)\n"
           "    weights = torch.softmax(filled, dim=-1)\n"
           "    has_key = mask.any(dim=-1, keepdim=True)  # False for rows with no allowed key\n"
           "    return weights.masked_fill(~has_key, 0.0)",
           'return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)',
           says='masking with -inf gives 0/0'),
    Mutant("softmax_rows_not_zeroed", "ex05_scaling_and_masking", "masked_softmax",
           "return weights.masked_fill(~has_key, 0.0)", "return weights",
           says='has no allowed key, so all its weights must be'),
    Mutant("softmax_inverted_mask", "ex05_scaling_and_masking", "masked_softmax",
           "scores.masked_fill(~mask,", "scores.masked_fill(mask,", zero=True,
           says="your weights follow the inverted mask: in this course True means 'may"),
    Mutant("softmax_zero_after", "ex05_scaling_and_masking", "masked_softmax",
           "weights = torch.softmax(filled, dim=-1)", "weights = torch.softmax(scores, dim=-1) * mask", zero=True,
           says='mask the scores before the softmax (zeroing weights after it leaves'),
    Mutant("softmax_no_mask", "ex05_scaling_and_masking", "masked_softmax",
           "filled = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)", "filled = scores", zero=True,
           says='which the mask blocks'),
    Mutant("attention_no_scale", "ex05_scaling_and_masking", "scaled_dot_product_attention",
           "scores = scaled_scores(Q, K)", "scores = Q @ K.transpose(-2, -1)",
           says='without the factor 1/sqrt(d_k)'),
    Mutant("attention_minus_inf_inline", "ex05_scaling_and_masking", "scaled_dot_product_attention",
           "weights = masked_softmax(scores, mask)",
           "weights = torch.softmax(scores if mask is None else scores.masked_fill(~mask, float('-inf')), dim=-1)",
           says='masking with -inf gives 0/0'),
    Mutant("causal_upper", "ex05_scaling_and_masking", "causal_self_attention", ".tril()", ".triu()", zero=True,
           says='which the mask blocks'),
    Mutant("causal_no_diagonal", "ex05_scaling_and_masking", "causal_self_attention", ".tril()", ".tril(-1)",
           says='the diagonal of your weights is zero: a token may attend to itself (j'),
    Mutant("causal_no_mask", "ex05_scaling_and_masking", "causal_self_attention",
           "X @ W_V, mask)", "X @ W_V, None)", zero=True,
           says='which the mask blocks'),
    Mutant("decoder_causal_only", "ex05_scaling_and_masking", "causal_padded_self_attention",
           "mask = causal_mask(L) & not_padding", "mask = causal_mask(L)",
           says='your output ignores the padding: combine the causal mask with the'),
    Mutant("decoder_padding_only", "ex05_scaling_and_masking", "causal_padded_self_attention",
           "mask = causal_mask(L) & not_padding", "mask = not_padding",
           says='the future leaks into the past'),
    Mutant("decoder_padding_as_queries", "ex05_scaling_and_masking", "causal_padded_self_attention",
           "not_padding = (token_ids != pad_id)[:, None, :]", "not_padding = (token_ids != pad_id)[:, :, None]",
           says='blocks the padding queries (rows) instead of the padding keys'),
    # --- ex11 (notebook ex11_efficient_attention) --------------------------------------------------------
    Mutant("cache_new_first", "ex11_efficient_attention", "cache_append",
           "keys = torch.cat([past_keys, new_keys], dim=-2)\n    values = torch.cat([past_values, new_values], dim=-2)",
           "keys = torch.cat([new_keys, past_keys], dim=-2)\n    values = torch.cat([new_values, past_values], dim=-2)", zero=True,
           says='your keys start with the new positions: the cached ones must come'),
    Mutant("cache_wrong_axis", "ex11_efficient_attention", "cache_append",
           "keys = torch.cat([past_keys, new_keys], dim=-2)\n    values = torch.cat([past_values, new_values], dim=-2)",
           "keys = torch.cat([past_keys, new_keys], dim=1)\n    values = torch.cat([past_values, new_values], dim=1)", zero=True,
           says='check which dimension you join along'),
    Mutant("online_sum_not_rescaled", "ex11_efficient_attention", "online_softmax_update",
           "running_sum * torch.exp(running_max - shift)", "running_sum",
           says='the old sum must be rescaled by exp(old maximum - new maximum)'),
    Mutant("online_no_minus_inf_guard", "ex11_efficient_attention", "online_softmax_update",
           "shift = torch.where(torch.isneginf(new_max), torch.zeros_like(new_max), new_max)", "shift = new_max",
           says='a row whose maximum is still -inf gives exp(-inf - (-inf)) = NaN'),
    Mutant("online_block_not_shifted", "ex11_efficient_attention", "online_softmax_update",
           "torch.exp(scores - shift[..., None]).sum(dim=-1)", "torch.exp(scores).sum(dim=-1)",
           says='you exponentiated the new scores without shifting them: the block'),
    Mutant("step_accumulator_not_rescaled", "ex11_efficient_attention", "tiled_attention_step",
           "accumulator * rescale[..., None]", "accumulator",
           says='your accumulator keeps its old value unscaled: when the running'),
    Mutant("step_no_scale", "ex11_efficient_attention", "tiled_attention_step",
           "torch.matmul(query, key.transpose(-2, -1)) * scale", "torch.matmul(query, key.transpose(-2, -1))",
           says='your scores are not multiplied by `scale`'),
    Mutant("tiled_is_naive", "ex11_efficient_attention", "tiled_attention",
           "scale = 1.0 / math.sqrt(query.shape[-1])",
           "return torch.softmax(query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1]), dim=-1) @ value",
           zero=True,
           says='compute scores one'),
    Mutant("tiled_calls_sdpa", "ex11_efficient_attention", "tiled_attention",
           "scale = 1.0 / math.sqrt(query.shape[-1])", "return F.scaled_dot_product_attention(query, key, value)",
           zero=True,
           says='tiled_attention must compute attention itself'),
    Mutant("tiled_numpy_full_matrix", "ex11_efficient_attention", "tiled_attention",
           "scale = 1.0 / math.sqrt(query.shape[-1])",
           "import numpy as np\n"
           "    s = query.numpy() @ key.numpy().swapaxes(-1, -2) / math.sqrt(query.shape[-1])\n"
           "    w = np.exp(s - s.max(-1, keepdims=True))\n"
           "    return torch.from_numpy((w / w.sum(-1, keepdims=True)) @ value.numpy())", zero=True,
           says='compute scores one'),
    # issue 43: the full score matrix built in a grandchild, which the measured process does not hold; the
    # measurement now takes every descendant's peak (a child subreaper reaps them all)
    Mutant("tiled_full_matrix_in_a_grandchild", "ex11_efficient_attention", "tiled_attention",
           "scale = 1.0 / math.sqrt(query.shape[-1])",
           "import io, os\n"
           "    read_end, write_end = os.pipe()\n"
           "    if os.fork() == 0:\n"
           "        torch.set_num_threads(1)\n"
           "        s = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])\n"
           "        buffer = io.BytesIO()\n"
           "        torch.save(torch.softmax(s, dim=-1) @ value, buffer)\n"
           "        with open(write_end, 'wb') as pipe:\n"
           "            pipe.write(buffer.getvalue())\n"
           "        os._exit(0)\n"
           "    os.close(write_end)\n"
           "    with open(read_end, 'rb') as pipe:\n"
           "        data = pipe.read()\n"
           "    os.wait()\n"
           "    return torch.load(io.BytesIO(data))", zero=True,
           says='compute scores one'),
    # the full score matrix, freed, then the process's peak reset through /proc/self/clear_refs (the file the
    # measuring process uses at the large call): while learner code runs the process is not dumpable, so the
    # file belongs to root and cannot be opened
    Mutant("tiled_full_matrix_then_peak_reset", "ex11_efficient_attention", "tiled_attention",
           "scale = 1.0 / math.sqrt(query.shape[-1])",
           "s = torch.softmax(query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1]), dim=-1)\n"
           "    out = s @ value\n"
           "    del s\n"
           "    try:\n"
           "        with open('/proc/self/clear_refs', 'w') as refs:\n"
           "            refs.write('5')\n"
           "    except OSError:\n"
           "        pass\n"
           "    return out", zero=True,
           says='compute scores one', sandbox_only=True),
    Mutant("tiled_not_normalised", "ex11_efficient_attention", "tiled_attention",
           "outputs.append(accumulator / running_sum[..., None])", "outputs.append(accumulator)",
           says="your output is the accumulator itself: divide each query block's"),
    Mutant("tiled_key_loop_over_queries", "ex11_efficient_attention", "tiled_attention",
           "range(0, key.shape[-2], block_size)", "range(0, query.shape[-2], block_size)",
           says='your loop over key blocks runs over the number of queries'),
    # --- ex13 (notebook ex13_decoder_only_language_models) -----------------------------------------------
    Mutant("lm_loss_not_shifted", "ex13_decoder_only_language_models", "next_token_loss",
           "targets = tokens[:, 1:]", "targets = tokens[:, :-1]",
           says='your loss compares the logits at position t with token t: position t'),
    Mutant("lm_loss_counts_padding", "ex13_decoder_only_language_models", "next_token_loss",
           "ignore_index=pad_id)", "ignore_index=-100)",
           says='your loss counts the padded targets'),
    Mutant("top_k_drops_the_kth", EX13, "top_k_filter", "logits.masked_fill(logits < kth_largest, -math.inf)",
           "logits.masked_fill(logits <= kth_largest, -math.inf)", zero=True,
           says='you dropped the k-th largest logit too'),
    Mutant("top_k_keeps_the_smallest", EX13, "top_k_filter", "torch.topk(logits, k, dim=-1).values",
           "torch.topk(logits, k, dim=-1, largest=False).values", zero=True,
           says='your threshold is the k-th smallest logit (torch.topk with'),
    Mutant("top_p_drops_crossing_token", "ex13_decoder_only_language_models", "top_p_filter",
           "drop_sorted = mass_before >= p", "drop_sorted = torch.cumsum(probs, dim=-1) > p", zero=True,
           says='keep a token while the probability of the tokens before it is below'),
    Mutant("sample_filters_after_draw", "ex13_decoder_only_language_models", "sample_next_token",
           "probs = torch.softmax(filtered, dim=-1)", "probs = torch.softmax(scaled, dim=-1)",
           says='your draws ignore the filters: draw from the softmax of the filtered'),
    Mutant("sample_quantile_no_randomness", "ex13_decoder_only_language_models", "sample_next_token",
           "return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])",
           "u = (torch.arange(flat.size(0), dtype=flat.dtype) + 0.5) / flat.size(0)\n"
           "    tokens = torch.searchsorted(flat.cumsum(-1), u[:, None]).clamp(max=flat.size(-1) - 1)\n"
           "    return tokens.reshape(probs.shape[:-1])", zero=True,
           says='two calls with generators seeded differently gave the same tokens'),
    Mutant("sample_seeds_the_global_generator", "ex13_decoder_only_language_models", "sample_next_token",
           "return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])",
           "torch.manual_seed(0)\n    return torch.multinomial(flat, 1).reshape(probs.shape[:-1])", zero=True,
           says='two calls with generators seeded differently gave the same tokens'),
    Mutant("temperature_on_probabilities", "ex13_decoder_only_language_models", "sample_next_token",
           "scaled = logits / temperature", "scaled = torch.log(torch.softmax(logits, dim=-1) / temperature)",
           says='your draws ignore the temperature: divide the logits by it, not the'),
    Mutant("sample_top_p_ignored_with_top_k", EX13, "sample_next_token",
           "    if top_p is not None:\n        filtered = top_p_filter", "    elif top_p is not None:\n        filtered = top_p_filter",
           says='apply both filters'),
    Mutant("sample_filters_before_temperature", EX13, "sample_next_token",
           "    scaled = logits / temperature\n    filtered = scaled\n    if top_k is not None:\n"
           "        filtered = top_k_filter(filtered, top_k)\n    if top_p is not None:\n"
           "        filtered = top_p_filter(filtered, top_p)\n    probs = torch.softmax(filtered, dim=-1)",
           "    filtered = logits\n    if top_k is not None:\n"
           "        filtered = top_k_filter(filtered, top_k)\n    if top_p is not None:\n"
           "        filtered = top_p_filter(filtered, top_p)\n    probs = torch.softmax(filtered / temperature, dim=-1)",
           says='divide the logits by the temperature first'),
    Mutant("cached_step_no_scale", EX13, "cached_attention_step", " / math.sqrt(q.size(-1))", "", zero=True,
           says='divide the scores by sqrt(d)'),
    Mutant("cached_step_skips_new_token", "ex13_decoder_only_language_models", "cached_attention_step",
           "return weights @ values, keys, values",
           "return (torch.softmax(q @ past_keys.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1) @ past_values"
           " if past_keys is not None else v), keys, values", zero=True,
           says='your new token does not attend to itself: append its key and value'),
    Mutant("rms_eps_outside_root", EX13, "rms_norm",
           "normed = x32 / torch.sqrt(mean_square + eps)", "normed = x32 / (torch.sqrt(mean_square) + eps)",
           says='eps belongs inside the square root'),
    Mutant("rms_subtracts_the_mean", EX13, "rms_norm",
           "    x32 = x.to(compute)\n", "    x32 = x.to(compute)\n    x32 = x32 - x32.mean(dim=-1, keepdim=True)\n",
           says='your output matches a LayerNorm without bias: RMSNorm does not'),
    Mutant("rms_without_weight", EX13, "rms_norm",
           "return (normed * weight.to(compute)).to(x.dtype)", "return normed.to(x.dtype)",
           says='your output is normalised but ignores the weight: multiply by it, one'),
    Mutant("rms_mean_over_dimension_1", EX13, "rms_norm",
           "mean_square = x32.pow(2).mean(dim=-1, keepdim=True)", "mean_square = x32.pow(2).mean(dim=1, keepdim=True)",
           says='your mean square is taken over dimension 1'),
    Mutant("rms_mean_over_all_elements", EX13, "rms_norm",
           "mean_square = x32.pow(2).mean(dim=-1, keepdim=True)", "mean_square = x32.pow(2).mean()",
           says='over all the elements of x at once'),
    Mutant("rms_squares_in_float16", EX13, "rms_norm",
           "compute = torch.float32 if half else x.dtype", "compute = x.dtype",
           says='compute the mean square in float32'),
    Mutant("rms_calls_torch_rms_norm", EX13, "rms_norm",
           "    d = x.size(-1)\n", "    return F.rms_norm(x, (x.size(-1),), weight, eps)\n    d = x.size(-1)\n",
           zero=True,
           says='this part asks you to write RMSNorm from its formula'),
    Mutant("rms_calls_torch_rms_norm_through_aten", EX13, "rms_norm",
           "    d = x.size(-1)\n",
           "    return torch.ops.aten.rms_norm(x, [x.size(-1)], weight, eps)\n    d = x.size(-1)\n", zero=True,
           says='this part asks you to write RMSNorm from its formula'),
    Mutant("rms_calls_torch_rms_norm_module", EX13, "rms_norm",
           "    d = x.size(-1)\n",
           "    module = torch.nn.RMSNorm(x.size(-1), eps=eps, dtype=x.dtype)\n"
           "    module.weight.data = weight\n    return module(x).detach()\n    d = x.size(-1)\n", zero=True,
           says='this part asks you to write RMSNorm from its formula'),
    # --- ex14 (notebook ex14_positions_for_long_contexts) ------------------------------------------------
    Mutant("rotary_frequencies_reversed", EX14, "rotate_pairs",
           "frequencies = base ** (-two_i / d)", "frequencies = (base ** (-two_i / d)).flip(0)",
           says='your frequencies are in reverse order'),
    Mutant("rotary_exponent_without_2", EX14, "rotate_pairs",
           "two_i = torch.arange(0, d, 2, dtype=torch.float64)",
           "two_i = torch.arange(d // 2, dtype=torch.float64)",
           says='(the 2 is missing)'),
    Mutant("rotary_rotate_half_pairing", EX14, "rotate_pairs",
           "even, odd = x[..., 0::2], x[..., 1::2]  # (..., L, d/2) each\n"
           "    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)\n"
           "    return rotated.flatten(-2)",
           "even, odd = x[..., : d // 2], x[..., d // 2:]\n"
           "    return torch.cat((even * cos - odd * sin, even * sin + odd * cos), dim=-1)",
           says='you rotated feature i with feature i + d/2'),
    Mutant("rotary_wrong_direction", EX14, "rotate_pairs",
           "cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)",
           "cos, sin = angles.cos().to(x.dtype), -angles.sin().to(x.dtype)",
           says='you rotate the wrong way (by minus the angle): the new even feature'),
    Mutant("rotary_ignores_positions", EX14, "rotate_pairs",
           "angles = positions.to(torch.float64)[:, None]",
           "angles = torch.arange(x.size(-2), dtype=torch.float64)[:, None]",
           says='you rotated row l by the angle of position l: use the positions'),
    Mutant("offset_rotates_query", EX14, "score_at_offset",
           "return (q * moved).sum(dim=-1)",
           "return (rotate_pairs(q, torch.full((q.size(0),), offset), base) * k).sum(dim=-1)", zero=True,
           says='rotating the query by the offset turns it the other way'),
    Mutant("alibi_slopes_reversed", EX14, "add_alibi",
           "return torch.tensor(slopes)", "return torch.tensor(slopes).flip(0)",
           says='your slopes are in reverse order'),
    Mutant("alibi_slopes_power_of_two_formula_for_any_count", EX14, "add_alibi",
           "slopes = geometric(n) + geometric(2 * n)[0::2][: num_heads - n]", "slopes = geometric(num_heads)",
           zero=True,
           says='is not a power of two'),
    Mutant("alibi_bias_not_aligned_with_last_keys", EX14, "add_alibi",
           "query_at = torch.arange(length_q) + (length_k - length_q)", "query_at = torch.arange(length_q)", zero=True,
           says='the queries are the newest positions'),
    Mutant("alibi_bias_signed_distance", EX14, "add_alibi",
           "distance = (query_at[:, None] - key_at[None, :]).abs()", "distance = (query_at[:, None] - key_at[None, :])", zero=True,
           says='use the distance |i - j|: keys after the query (j > i) must get a'),
    Mutant("alibi_bias_added_with_wrong_sign", EX14, "add_alibi",
           "return scores - slopes[:, None, None] * distance", "return scores + slopes[:, None, None] * distance",
           says='your bias has the wrong sign: it must lower the scores of distant'),
    Mutant("rotate_half_pairs_neighbours", EX14, "rotate_half",
           "    first, second = x[..., :half], x[..., half:]  # (..., L, d/2) each: the pairs\n"
           "    return torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)",
           "    first, second = x[..., 0::2], x[..., 1::2]\n"
           "    return torch.stack((first * cos - second * sin, first * sin + second * cos), dim=-1).flatten(-2)",
           says='you paired neighbouring features'),
    Mutant("rotate_half_interleaved_angle_table", EX14, "rotate_half",
           "    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)\n"
           "    first, second = x[..., :half], x[..., half:]  # (..., L, d/2) each: the pairs\n"
           "    return torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)",
           "    angles = angles.repeat_interleave(2, dim=-1)  # (L, d)\n"
           "    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)\n"
           "    turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)\n"
           "    return x * cos + turned * sin",
           says='your cos and sin tables repeat each frequency twice in a row (the'),
    Mutant("rotate_half_wrong_direction", EX14, "rotate_half",
           "(first * cos - second * sin, first * sin + second * cos)",
           "(first * cos + second * sin, -first * sin + second * cos)",
           says='you rotate the wrong way'),
    Mutant("rotate_half_exponent_without_2", EX14, "rotate_half",
           "-torch.arange(0, d, 2, dtype=torch.float64) / d", "-torch.arange(half, dtype=torch.float64) / d",
           says='(the 2 is missing)'),
    Mutant("to_half_inverse_permutation", EX14, "interleaved_to_half",
           "order = torch.cat((torch.arange(0, d_head, 2), torch.arange(1, d_head, 2)))",
           "order = torch.argsort(torch.cat((torch.arange(0, d_head, 2), torch.arange(1, d_head, 2))))",
           says='you applied the inverse permutation (rotate-half to interleaved): new'),
    Mutant("to_half_split_over_all_rows", EX14, "interleaved_to_half",
           "order = torch.cat((torch.arange(0, d_head, 2), torch.arange(1, d_head, 2)))\n"
           "    per_head = weight.reshape(num_heads, d_head, d_model)",
           "order = torch.cat((torch.arange(0, rows, 2), torch.arange(1, rows, 2)))\n"
           "    per_head = weight.reshape(1, rows, d_model)",
           says='you split the even and odd rows of the whole weight: the pairs live'),
    Mutant("to_half_permutes_columns", EX14, "interleaved_to_half",
           "    return per_head[:, order].reshape(rows, d_model)",
           "    return weight[:, torch.cat((torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)))]",
           says="you permuted the columns (the model's input features), not the rows"),
    # --- ex15 (notebook ex15_attention_at_inference_scale) -----------------------------------------------
    Mutant("gqa_repeat_not_interleave", "ex15_attention_at_inference_scale", "grouped_query_attention",
           "t.repeat_interleave(group, dim=1)", "t.repeat(1, group, 1, 1)",
           says='your query heads read the wrong key/value heads: groups are'),
    Mutant("gqa_unscaled", "ex15_attention_at_inference_scale", "grouped_query_attention",
           " / math.sqrt(query.size(-1))", "",
           says='divide the scores by sqrt(d)'),
    Mutant("gqa_mask_ignored", "ex15_attention_at_inference_scale", "grouped_query_attention",
           'scores = scores.masked_fill(~mask, float("-inf"))', "scores = scores", zero=True,
           says='your output ignores the mask: masked keys (False) must get zero weight'),
    Mutant("window_off_by_one", "ex15_attention_at_inference_scale", "sliding_window_mask",
           "(offset >= 0) & (offset < window)", "(offset >= 0) & (offset <= window)", zero=True,
           says='your window is one too wide'),
    Mutant("window_symmetric", "ex15_attention_at_inference_scale", "sliding_window_mask",
           "offset = query_positions[:, None] - key_positions[None, :]",
           "offset = (query_positions[:, None] - key_positions[None, :]).abs()",
           says='your mask lets queries see the future: the window is causal'),
    Mutant("tile_normalised_within_tile", "ex15_attention_at_inference_scale", "flash_backward_tile",
           "weights = torch.exp(query @ key_t * scale - lse.unsqueeze(-1))",
           "weights = torch.softmax(query @ key_t * scale, dim=-1)", zero=True,
           says='your weights are normalised within the tile: the tile holds only some'),
    Mutant("tile_without_delta", "ex15_attention_at_inference_scale", "flash_backward_tile",
           "grad_weights - delta.unsqueeze(-1)", "grad_weights",
           says="your dS is P * dP: the softmax's backward pass subtracts D from dP"),
    Mutant("tile_grads_unscaled", "ex15_attention_at_inference_scale", "flash_backward_tile",
           "grad_query = grad_scores @ key * scale", "grad_query = grad_scores @ key",
           says='your grad_query lacks the factor scale: the scores were multiplied by'),
    # --- ex16 (notebook ex16_what_heads_learn) -----------------------------------------------------------
    Mutant("induction_target_off_by_one", EX16, "induction_score",
           "targets[:, :, 1:] = earlier[:, :, :-1]", "targets = earlier.clone()",
           says='you measured the attention on the earlier occurrence of the token'),
    Mutant("induction_scores_the_first_half", EX16, "induction_score",
           "scored = targets.any(dim=-1)", "scored = (positions < length // 2)[None].expand_as(tokens)",
           says='you scored the queries of the first half: the induction targets are'),
    Mutant("induction_averages_every_query", EX16, "induction_score",
           "scored = targets.any(dim=-1)", "scored = torch.ones_like(tokens, dtype=torch.bool)",
           says='you averaged over every query: only queries whose token occurred'),
    Mutant("repeat_redrawn", EX16, "repeated_batch",
           "return torch.cat([first, first], dim=1)",
           "return torch.cat([first, torch.randint(vocab_size, first.shape, generator=generator)], dim=1)",
           says='the second half of each sequence must repeat the first, token for'),
    Mutant("ablation_before_softmax_renormalises", EX16, "ablation_loss_change",
           "        if ablated is not None:\n            outputs = outputs.clone()\n"
           "            outputs[:, ablated] = 0.0  # the head writes nothing\n",
           "        if ablated is not None:\n            scores = scores.clone()\n"
           "            scores[:, ablated] = 0.0  # the softmax renormalises these\n"
           "            weights = torch.softmax(scores.masked_fill(~causal, float(\"-inf\")), dim=-1)\n"
           "            outputs = weights @ v\n",
           says='your ablated head still writes: you changed its scores (or weights)'),
    # ex16, issue 43: a wrong answer earns nothing on any draw; issue 38: the causal methods' classic mistakes.
    Mutant("repeat_seeds_global_generator", EX16, "repeated_batch",
           "    generator = torch.Generator().manual_seed(seed)\n"
           "    first = torch.randint(vocab_size, (batch_size, half_length), generator=generator)\n",
           "    torch.manual_seed(seed)\n    first = torch.randint(vocab_size, (batch_size, half_length))\n",
           zero=True,
           says="your function changed PyTorch's global random generator"),
    Mutant("induction_averaged_per_sequence", EX16, "induction_score",
           "return (on_targets * scored[:, None]).sum(dim=(0, 2)) / scored.sum()",
           "return ((on_targets * scored[:, None]).sum(dim=2) / scored.sum(dim=1, keepdim=True)).mean(dim=0)",
           zero=True,
           says="you averaged each sequence's queries first and then the sequences"),
    Mutant("ablation_unscaled_scores", EX16, "ablation_loss_change",
           "scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, L, L)",
           "scores = q @ k.transpose(-2, -1)  # (B, H, L, L)", zero=True,
           says='your attention scores are not scaled: divide q @ kᵀ by sqrt(d_head)'),
    Mutant("dla_skips_norm_scale", EX16, "logit_attribution",
           "return (parts / scale * gain) @ direction", "return (parts * gain) @ direction", zero=True,
           says="you skipped the final norm's scale: divide every part by the RMS of"),
    Mutant("patch_overwrites_every_position", EX16, "patch_recovered_share",
           "outputs[:, head, positions] = source[:, head, positions]  # only there",
           "outputs[:, head] = source[:, head]  # every position", zero=True,
           says="you overwrote the head's output at every position: restore it only at"),
    Mutant("copying_score_from_w_q", EX16, "copying_score",
           "circuit = W_E @ W_V @ W_O @ W_U", "circuit = W_E @ W_Q @ W_O @ W_U", zero=True,
           says="you used W_Q: what a head writes is its values' circuit, W_E W_V W_O"),
    # --- ex17 (notebook ex17_serving_attention) -----------------------------------------------------------
    Mutant("lookup_offset_off_by_one", "ex17_serving_attention", "locate",
           "return block_table[entries], positions % block_size",
           "return block_table[entries], (positions + 1) % block_size",
           says='your offsets are one slot off'),
    Mutant("speculative_accept_without_ratio", "ex17_serving_attention", "verify_draft",
           "if uniforms[i] >= min(1.0, float(ratio)):", "if uniforms[i] >= 1.0:", zero=True,
           says='accept with probability min(1, p/q)'),
    Mutant("speculative_residual_from_target", "ex17_serving_attention", "verify_draft",
           "return i, residual / residual.sum()", "return i, p_target[i]", zero=True,
           says="after a rejection your next token comes from the target's"),
    Mutant("lookup_logical_block", "ex17_serving_attention", "locate",
           "return block_table[entries], positions % block_size", "return entries, positions % block_size",
           zero=True,
           says='not the physical block stored there'),
    Mutant("preempted_blocks_never_freed", "ex17_serving_attention", "make_room",
           "pool += [int(b) for b in tables[row] if b >= 0]  # its blocks are free again",
           "pass  # its blocks stay taken",
           says="a preempted sequence's blocks must go back to the free list"),
    Mutant("preempted_loses_generated_tokens", "ex17_serving_attention", "make_room",
           "recompute = torch.where(keep, torch.zeros_like(prompts), prompts + generated)",
           "recompute = torch.where(keep, torch.zeros_like(prompts), prompts)",
           says='a preempted request keeps the tokens it has generated: when'),
    Mutant("preempts_the_oldest", "ex17_serving_attention", "make_room",
           "row = len(lengths) - 1", "row = 0",
           says='preempt the most recently admitted sequence'),
    Mutant("paged_tail_not_masked", "ex17_serving_attention", "paged_decode",
           "scores[:, max(0, length - j * block_size) :] = -math.inf  # past the end", "pass",
           says="the slots of the last block past `length` are not the sequence's"),
    Mutant("paged_no_rescale", "ex17_serving_attention", "paged_decode",
           "shrink = torch.exp(running_max - new_max)  # rescale what came before",
           "shrink = torch.ones_like(running_max)",
           says='when a block raises the running maximum, the running sum and the'),
    Mutant("intensity_cache_shared_by_batch", "ex17_serving_attention", "decode_intensity",
           "cache = 2 * num_layers * d_kv * positions",
           "cache = 2 * num_layers * d_kv * int(contexts.max())",
           says='each sequence reads its own cache: the cache traffic is the sum over'),
    # --- bug hunt: partial or wrong fixes ----------------------------------------------------------------
    Mutant("cross_fixes_keys_only", BUG_HUNT, "multi_head_cross_attention",
           "v = (value @ w_v).view(batch, len_k,", "v = (value @ w_v).view(batch, len_q,",
           says='shapes do not fit'),
    Mutant("heads_wrong_output_labels", BUG_HUNT, "multi_head_weights",
           '"bqhd,bkhd->bhqk", q, k)  #', '"bqhd,bkhd->bqhk", q, k)  #',
           says='put the head axis before the query axis'),
    Mutant("scale_without_square_root", BUG_HUNT, "multi_head_self_attention",
           "/ math.sqrt(d_head)", "/ d_head",
           says='your scores are divided by d_head: scaled dot-product attention'),
    Mutant("mask_inverted", BUG_HUNT, "masked_attention",
           "scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)",
           "scores = scores.masked_fill(mask, torch.finfo(scores.dtype).min)",
           says='which the mask blocks'),
    Mutant("mask_rows_not_zeroed", BUG_HUNT, "masked_attention",
           "weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)", "weights = weights",
           says='a query with no allowed key gets zero weights'),
    Mutant("loops_ignore_weights", BUG_HUNT, "attention_with_loops",
           "out[i] += weights[j] * v[j]", "out[i] += v[j] / k.shape[0]",
           says='every output row is the plain mean of the values: weight value j by'),
    Mutant("layer_norm_unbiased_variance", BUG_HUNT, "layer_norm", "correction=0", "correction=1",
           says='your output uses the unbiased variance'),
    Mutant("layer_norm_eps_outside_root", BUG_HUNT, "layer_norm",
           "(x - mean) / torch.sqrt(var + eps)", "(x - mean) / (torch.sqrt(var) + eps)",
           says='your output divides by std + eps'),
    Mutant("dropout_divides_by_p", BUG_HUNT, "dropout", "return x * keep / (1.0 - p)", "return x * keep / p",
           says='every surviving entry must be multiplied by 1/(1 - p)'),
    Mutant("dropout_fixed_mask", BUG_HUNT, "dropout", "keep = torch.rand_like(x) >= p  #",
           "keep = (torch.arange(x.numel()).reshape(x.shape) % 10) >= 10 * p  #",
           says='whole rows or columns of your output are zero: draw an independent'),
    Mutant("dropout_low_discrepancy_sequence_bug_hunt", BUG_HUNT, "dropout", "keep = torch.rand_like(x) >= p  #",
           "dropout.calls = getattr(dropout, 'calls', 0) + 1\n    "
           "keep = (torch.arange(x.numel(), dtype=torch.float64) * 0.6180339887498949\n"
           "        + dropout.calls * 0.7548776662466927).remainder(1.0).reshape(x.shape) >= p  #",
           says='your mask is not random'),
    Mutant("dropout_nan_when_p_is_one", BUG_HUNT, "dropout",
           "if p == 1.0:\n        return torch.zeros_like(x)", "if p == 2.0:\n        return torch.zeros_like(x)",
           says='return zeros for p = 1'),
    Mutant("residual_from_projection", BUG_HUNT, "attention_sublayer", "residual = q  #", "residual = q @ w_q  #",
           says='your residual adds the projected queries (x @ w_q): the residual'),
    Mutant("causal_mask_upper", BUG_HUNT, "causal_self_attention", ".tril()", ".triu()",
           says='causal leakage'),
    Mutant("causal_mask_without_diagonal", BUG_HUNT, "causal_self_attention", ".tril()", ".tril(-1)",
           says='the mask must keep the diagonal'),
    # --- ex08 (notebook ex08_layernorm_dropout_residuals) -------------------------------------------------
    Mutant("ln_unbiased_variance", "ex08_layernorm_dropout_residuals", "layer_norm",
           "keepdim=True, correction=0)", "keepdim=True, correction=1)",
           says='your output matches the *unbiased* variance (dividing by H -'),
    Mutant("ln_eps_outside_root", "ex08_layernorm_dropout_residuals", "layer_norm",
           "torch.sqrt(var + eps)", "(torch.sqrt(var) + eps)",
           says='your output matches (x - mean) / (std + eps): eps belongs inside the'),
    Mutant("ln_no_gain_or_bias", "ex08_layernorm_dropout_residuals", "layer_norm",
           "return weight * x_hat + bias", "return x_hat",
           says='your output is normalised but ignores the gain and bias: return'),
    Mutant("dropout_no_rescaling", "ex08_layernorm_dropout_residuals", "dropout",
           "return x * keep / (1.0 - p)", "return x * keep",
           says='every surviving entry must be multiplied by 1/(1 - p)'),
    Mutant("dropout_p_is_keep_probability", "ex08_layernorm_dropout_residuals", "dropout",
           "keep = torch.rand_like(x) >= p", "keep = torch.rand_like(x) < p",
           says='p is the probability of *dropping*'),
    Mutant("dropout_active_in_eval", "ex08_layernorm_dropout_residuals", "dropout",
           "if not training or p == 0.0:", "if p == 0.0:",
           says='in evaluation mode dropout must return its input unchanged'),
    # a deterministic low-discrepancy sequence (golden-ratio steps): drops exactly p, never a whole row or
    # column, a new mask on every call; not random (issue 43)
    Mutant("dropout_low_discrepancy_sequence", "ex08_layernorm_dropout_residuals", "dropout",
           "keep = torch.rand_like(x) >= p",
           "dropout.calls = getattr(dropout, 'calls', 0) + 1\n    "
           "keep = (torch.arange(x.numel(), dtype=torch.float64) * 0.6180339887498949\n"
           "        + dropout.calls * 0.7548776662466927).remainder(1.0).reshape(x.shape) >= p  #",
           says='your mask is not random'),
    Mutant("dropout_one_draw_per_row", "ex08_layernorm_dropout_residuals", "dropout",
           "keep = torch.rand_like(x) >= p", "keep = torch.rand_like(x[..., :1]) >= p",
           says='whole rows or columns of your output are zero: draw an independent'),
    Mutant("residual_orders_swapped", "ex08_layernorm_dropout_residuals", "residual_sublayer",
           "return x + sublayer(norm(x))", "return norm(x + sublayer(x))",
           says='your output is the post-norm result; with norm_first=True it should'),
    Mutant("residual_pre_norm_adds_normalised", "ex08_layernorm_dropout_residuals", "residual_sublayer",
           "return x + sublayer(norm(x))", "return norm(x) + sublayer(norm(x))",
           says='you added the *normalised* input; pre-norm adds the raw input: x +'),
    Mutant("residual_post_norm_forgets_x", "ex08_layernorm_dropout_residuals", "residual_sublayer",
           "return norm(x + sublayer(x))", "return norm(sublayer(x))",
           says='you left out the residual: post-norm is norm(x + f(x))'),
    Mutant("add_and_norm_dropout_on_sum", "ex08_layernorm_dropout_residuals", "add_and_norm",
           "return x + self.dropout(sublayer(self.norm(x)))", "return self.dropout(x + sublayer(self.norm(x)))",
           says='your dropout zeroes whole entries of x + f(x): apply it to the'),
    Mutant("add_and_norm_fixed_norm", "ex08_layernorm_dropout_residuals", "add_and_norm",
           "nn.LayerNorm(d_model)", "nn.LayerNorm(d_model, elementwise_affine=False)",
           says='AddAndNorm needs its LayerNorm as self.norm, with learnable weight'),
    Mutant("add_and_norm_no_dropout", "ex08_layernorm_dropout_residuals", "add_and_norm",
           "return self.norm(x + self.dropout(sublayer(x)))", "return self.norm(x + sublayer(x))",
           says='in training mode two calls gave the same output: is dropout (with'),
    # the rate is ignored in both norm orders (the mutant above drops dropout from the post-norm line only)
    Mutant("add_and_norm_dropout_rate_ignored", "ex08_layernorm_dropout_residuals", "add_and_norm",
           "self.dropout = nn.Dropout(dropout)", "self.dropout = nn.Dropout(0.0)",
           says="in training mode your module applies no dropout to the sub-layer's"),
    Mutant("add_and_norm_post_norm_as_pre", "ex08_layernorm_dropout_residuals", "add_and_norm",
           "return self.norm(x + self.dropout(sublayer(x)))", "return x + self.dropout(sublayer(self.norm(x)))",
           says='your module computes the pre-norm order, but norm_first=False'),
    # --- ex06 (notebook ex06_multi_head_attention) --------------------------------------------------------
    Mutant("mha_split_direct_reshape", "ex06_multi_head_attention", "split_heads",
           "return x.view(batch, length, num_heads, d_model // num_heads).transpose(1, 2)",
           "return x.reshape(batch, num_heads, length, d_model // num_heads)",
           says='scrambles heads and positions'),
    Mutant("mha_split_no_error", "ex06_multi_head_attention", "split_heads",
           'raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")',
           "pass",
           says='is not divisible by num_heads'),
    Mutant("mha_merge_no_transpose", "ex06_multi_head_attention", "merge_heads",
           "return x.transpose(1, 2).reshape(batch, length, num_heads * d_head)",
           "return x.reshape(batch, length, num_heads * d_head)", zero=True,
           says='your merge reshapes (B, h, L, d_head) straight to (B, L, h*d_head)'),
    Mutant("mha_scale_d_model", "ex06_multi_head_attention", "multi_head_attention",
           "scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])",
           "scores = q @ k.transpose(-2, -1) / math.sqrt(query.shape[-1])", zero=True,
           says='so divide by sqrt(d_head)'),
    Mutant("mha_no_output_projection", "ex06_multi_head_attention", "multi_head_attention",
           'output = merge_heads(weights @ v) @ params["W_o"] + params["b_o"]',
           "output = merge_heads(weights @ v)",
           says='your output is the concatenated heads; finish with the output'),
    Mutant("mha_empty_rows_not_zeroed", "ex06_multi_head_attention", "multi_head_attention",
           "weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)",
           "weights = weights",
           says='has no allowed key, so its weights must be all zero'),
    Mutant("mha_key_used_as_value", "ex06_multi_head_attention", "multi_head_attention",
           'v = split_heads(value @ params["W_v"] + params["b_v"], num_heads)',
           'v = split_heads(key @ params["W_v"] + params["b_v"], num_heads)',
           says='your values are projected from key'),
    Mutant("mha_params_no_transpose", "ex06_multi_head_attention", "params_from_torch",
           'params = {"W_q": w_q.T, "W_k": w_k.T, "W_v": w_v.T, "W_o": w_o.T}',
           'params = {"W_q": w_q, "W_k": w_k, "W_v": w_v, "W_o": w_o}',
           says='your W_q is the transpose of what the row convention needs: PyTorch'),
    Mutant("mha_params_order_kqv", "ex06_multi_head_attention", "params_from_torch",
           "w_q, w_k, w_v = module.in_proj_weight.detach().chunk(3, dim=0)",
           "w_k, w_q, w_v = module.in_proj_weight.detach().chunk(3, dim=0)",
           says='your W_q holds W_k: in_proj_weight stacks the query, key and value'),
    Mutant("mha_torch_masks_not_inverted", "ex06_multi_head_attention", "attention_like_torch",
           "mask = ~key_padding_mask[:, None, None, :]",
           "mask = key_padding_mask[:, None, None, :]",
           says='without inverting it'),
    Mutant("mha_torch_attn_mask_not_inverted", "ex06_multi_head_attention", "attention_like_torch",
           "allowed = ~attn_mask",
           "allowed = attn_mask",
           says='without inverting it'),
    # --- ex07 (notebook ex07_positional_encoding) ---------------------------------------------------------
    Mutant("pe_pairs_from_1", "ex07_positional_encoding", "sinusoidal_encoding",
           "i = torch.arange(d_model // 2, dtype=torch.float64)                 # (d/2,)",
           "i = torch.arange(1, d_model // 2 + 1, dtype=torch.float64)",
           says='your pairs are counted from 1'),
    Mutant("pe_sin_cos_swapped", "ex07_positional_encoding", "sinusoidal_encoding",
           "pe[:, 0::2] = torch.sin(angle)\n    pe[:, 1::2] = torch.cos(angle)",
           "pe[:, 0::2] = torch.cos(angle)\n    pe[:, 1::2] = torch.sin(angle)",
           says='your even columns hold cosines and the odd ones sines'),
    Mutant("pe_concatenated", "ex07_positional_encoding", "sinusoidal_encoding",
           "pe[:, 0::2] = torch.sin(angle)\n    pe[:, 1::2] = torch.cos(angle)",
           "pe = torch.cat([torch.sin(angle), torch.cos(angle)], dim=1)",
           says='your rows put all sines first and all cosines after; interleave them'),
    Mutant("pe_positions_plus_one", "ex07_positional_encoding", "sinusoidal_encoding",
           "p = positions.to(torch.float64).unsqueeze(1)",
           "p = positions.to(torch.float64).unsqueeze(1) + 1",
           says='your rows are those of positions p + 1'),
    Mutant("pe_profile_no_2", "ex07_positional_encoding", "offset_similarity",
           "omega = 10000.0 ** (-2 * i / d_model)", "omega = 10000.0 ** (-i / d_model)", zero=True,
           says='your frequencies are 10000^(-i/d)'),
    Mutant("pe_rotation_backwards", "ex07_positional_encoding", "shift_by_rotation",
           "torch.tensor([[c, s], [-s, c]], dtype=torch.float64)",
           "torch.tensor([[c, -s], [s, c]], dtype=torch.float64)", zero=True,
           says='your rotation moves backwards'),
    Mutant("pe_rotation_only_first_pair", "ex07_positional_encoding", "shift_by_rotation",
           "for i in range(d_model // 2):",
           "R = torch.eye(d_model, dtype=torch.float64)\n    for i in range(1):", zero=True,
           says='you rotated only the first pair of features: every pair i turns, each'),
    Mutant("pe_embed_no_sqrt", "ex07_positional_encoding", "embed_with_positions",
           "x = embedding_weight[tokens] * math.sqrt(d_model)",
           "x = embedding_weight[tokens]",
           says='multiply the embeddings by sqrt(d_model)'),
    Mutant("pe_embed_dropout_always", "ex07_positional_encoding", "embed_with_positions",
           "return F.dropout(x, p=dropout_p, training=training)",
           "return F.dropout(x, p=dropout_p, training=True)",
           says='dropout must then be the identity'),
    Mutant("pe_embed_dropout_not_inverted", "ex07_positional_encoding", "embed_with_positions",
           "return F.dropout(x, p=dropout_p, training=training)",
           "return F.dropout(x, p=dropout_p, training=training) * (1 - dropout_p) if training else x",
           says='the entries your dropout keeps must be scaled by'),
    Mutant("pe_embed_no_length_check", "ex07_positional_encoding", "embed_with_positions",
           'raise ValueError(\n'
           '            f"sequences of length {length} do not fit a table of {max_len} positions"\n'
           '        )',
           "pass",
           says='expected a ValueError because the sequences have'),
    # --- ex10 (notebook ex10_decoder_and_transformer) -----------------------------------------------------
    Mutant("ex10_shift_swapped", "ex10_decoder_and_transformer", "shift_target",
           "return tgt[:, :-1], tgt[:, 1:]", "return tgt[:, 1:], tgt[:, :-1]",
           says="your two tensors are swapped: the decoder's input starts with <bos>"),
    Mutant("ex10_shift_unshifted_labels", "ex10_decoder_and_transformer", "shift_target",
           "return tgt[:, :-1], tgt[:, 1:]", "return tgt[:, :-1], tgt[:, :-1]",
           says='position t must predict token t + 1'),
    Mutant("ex10_self_mask_upper", "ex10_decoder_and_transformer", "decoder_masks",
           ".tril()  # (Lt, Lt)", ".triu()  # (Lt, Lt)",
           says='your self_mask lets query i see keys j >= i (upper triangle): it must'),
    Mutant("ex10_self_mask_no_diagonal", "ex10_decoder_and_transformer", "decoder_masks",
           ".tril()  # (Lt, Lt)", ".tril(-1)  # (Lt, Lt)",
           says='a real position i may attend exactly to positions 0..i'),
    Mutant("ex10_memory_mask_inverted", "ex10_decoder_and_transformer", "decoder_masks",
           "memory_mask = (src != pad_id)", "memory_mask = (src == pad_id)",
           says="your memory_mask is inverted: True must mean 'may attend', False on"),
    Mutant("ex10_memory_mask_from_target", "ex10_decoder_and_transformer", "decoder_masks",
           "memory_mask = (src != pad_id)", "memory_mask = (decoder_input != pad_id)",
           says="cross-attention may read every source token except the source's padding"),
    Mutant("ex10_cross_attention_roles_swapped", "ex10_decoder_and_transformer", "decoder_layer_forward",
           "layer.cross_attention(x, memory, memory, mask=memory_mask)",
           "layer.cross_attention(memory, x, x, mask=memory_mask)",
           says='does not broadcast to the attention scores'),
    Mutant("ex10_self_attention_unmasked", "ex10_decoder_and_transformer", "decoder_layer_forward",
           "layer.self_attention(x, x, x, mask=self_mask)", "layer.self_attention(x, x, x)",
           says='your self-attention ignores self_mask: pass it to'),
    Mutant("ex10_layer_always_post_norm", "ex10_decoder_and_transformer", "decoder_layer_forward",
           "if layer.norm_first:", "if False:",
           says="your output is the other norm order's: this layer is pre-norm"),
    Mutant("ex10_layer_residual_in_place", "ex10_decoder_and_transformer", "decoder_layer_forward",
           "y = y + self_attention(layer.norm1(y))", "y += self_attention(layer.norm1(y))",
           says='changed its input `y` in place'),
    Mutant("ex10_layer_no_feed_forward_residual", "ex10_decoder_and_transformer", "decoder_layer_forward",
           "return layer.norm3(y + layer.feed_forward(y))", "return layer.norm3(layer.feed_forward(y))",
           says='your feed-forward sub-layer has no residual: post-norm adds its input'),
    Mutant("ex10_greedy_no_padding_after_eos", "ex10_decoder_and_transformer", "greedy_decode",
           "torch.where(finished, padding, next_token)", "next_token",
           says="after a sentence's eos every column holds pad_id"),
    Mutant("ex10_greedy_never_stops_early", "ex10_decoder_and_transformer", "greedy_decode",
           "if bool(finished.all()):", "if False:",
           says='decoding stops as soon as every sentence has produced eos'),
    Mutant("ex10_greedy_no_source_mask", "ex10_decoder_and_transformer", "greedy_decode",
           "memory_mask = (src != pad_id)[:, None, None, :]", "memory_mask = None",
           says='your translations of padded sentences differ: build the source'),
    Mutant("ex10_greedy_no_causal_mask", "ex10_decoder_and_transformer", "greedy_decode",
           "model.decode(tokens, memory, causal, memory_mask)", "model.decode(tokens, memory, None, memory_mask)",
           says='pass a causal mask to model.decode as tgt_mask: a (t, t) bool matrix'),
    Mutant("ex10_greedy_first_position", "ex10_decoder_and_transformer", "greedy_decode",
           "logits[:, -1].argmax(dim=-1)", "logits[:, 0].argmax(dim=-1)",
           says="you took each next token from the first position's logits; the"),
    # --- ex09 (notebook ex09_the_encoder) ----------------------------------------------------------------------
    Mutant("ffn_no_relu", "ex09_the_encoder", "feed_forward",
           "hidden = torch.relu(x @ W1 + b1)", "hidden = x @ W1 + b1",
           says='your output has no non-linearity: apply ReLU to the hidden layer, max'),
    Mutant("ffn_no_width_check", "ex09_the_encoder", "feed_forward",
           "if W2.shape[-1] != d_model:", "if False:",
           says="the FFN's output must have width d_model"),
    Mutant("ffn_mixes_positions", "ex09_the_encoder", "feed_forward",
           "return hidden @ W2 + b2", "return hidden.cumsum(dim=-2) @ W2 + b2",
           says='your output at a position sums the hidden layers of the positions up'),
    Mutant("conv_kernel_not_transposed", "ex09_the_encoder", "linear_to_conv1d",
           "kernel = W.transpose(0, 1).unsqueeze(-1)", "kernel = W.reshape(W.shape[1], W.shape[0], 1)",
           says="your kernel holds W's numbers in W's own order, reshaped to"),
    Mutant("encoder_layer_ignores_mask", "ex09_the_encoder", "encoder_layer",
           "self.self_attention(h, h, h, mask=mask)[0]", "self.self_attention(h, h, h)[0]",
           says='your output matches a layer that ignores the padding mask: pass mask'),
    Mutant("encoder_layer_orders_swapped", "ex09_the_encoder", "encoder_layer",
           "if self.norm_first:", "if not self.norm_first:",
           says='your layer computes the pre-norm order, but norm_first=False'),
    Mutant("encoder_layer_no_second_residual", "ex09_the_encoder", "encoder_layer",
           "return self.norm2(x + transform(x))", "return self.norm2(transform(x))",
           says='your feed-forward sub-layer has no residual: post-norm adds its input'),
    Mutant("encoder_layer_no_dropout", "ex09_the_encoder", "encoder_layer",
           "self.dropout1, self.dropout2 = nn.Dropout(dropout), nn.Dropout(dropout)",
           "self.dropout1, self.dropout2 = nn.Identity(), nn.Identity()",
           says='in training mode (with the dropout inside attention and the FFN'),
    Mutant("head_pools_padding", "ex09_the_encoder", "classifier_head",
           "pooled = (states * m).sum(dim=1) / keep.sum(dim=1, keepdim=True)", "pooled = states.mean(dim=1)",
           says='padding leaked into your pool: average (or take the maximum) over the'),
    Mutant("head_max_fills_zero", "ex09_the_encoder", "classifier_head",
           "states.masked_fill(~m, float(\"-inf\"))", "states.masked_fill(~m, 0.0)",
           says='you filled the padding with 0 before the maximum'),
    Mutant("head_layers_in_forward", "ex09_the_encoder", "classifier_head",
           "return self.linear(pooled)", "return nn.Linear(pooled.shape[-1], self.linear.out_features)(pooled)",
           says='the same input gave different logits on two calls: create the layers'),
    Mutant("head_torch_max_tuple", "ex09_the_encoder", "classifier_head",
           "return self.linear(pooled)                            # (B, num_classes)",
           "return torch.max(self.linear(states), dim=1)",
           says='your head returned a tuple: torch.max along a dimension returns'),
]
#: The mutants that tests judging in their own process (as root, on this project's machines) can judge.
IN_PROCESS = [mutant for mutant in MUTANTS if not mutant.sandbox_only]


def graded_cell(nb: nbformat.NotebookNode, part: str) -> nbformat.NotebookNode:
    cells = [c for c in nb.cells if c.cell_type == "code" and TAG_GRADED in cell_tags(c) and cell_part(c) == part]
    if len(cells) != 1:
        raise ValueError(f"expected one graded cell for part {part!r}, found {len(cells)}")
    return cells[0]


def apply(mutant: Mutant) -> nbformat.NotebookNode:
    """The solution notebook with the mutant's replacement made in its part's graded cell."""
    nb = nbformat.read(SOLUTIONS / f"{mutant.notebook}.ipynb", as_version=4)
    cell = graded_cell(nb, mutant.part)
    cell.source = apply_to(cell.source, mutant)
    return nb


def _top_level_names(source: str, imports: bool = True) -> set[str]:
    """Names a cell binds at its top level (functions, classes, assignments, and imports unless ``imports`` is
    false): what other cells can use."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif imports and isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return names


def _read_names(source: str) -> set[str]:
    return {node.id for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Name)
            and isinstance(node.ctx, ast.Load)}


def linked_parts(notebook: str, mutants: list[Mutant] = ()) -> dict[str, set[str]]:
    """part -> the parts of ``notebook`` whose verdicts a mistake in it can change: those whose graded cell reads a
    name its cell binds at the top level (in the solution or in any of ``mutants``' versions of it), followed
    through chains (c reads b's names, b reads a's: a links to b and c)."""
    nb = nbformat.read(SOLUTIONS / f"{notebook}.ipynb", as_version=4)
    sources: dict[str, list[str]] = {}
    for cell in nb.cells:
        if cell.cell_type == "code" and TAG_GRADED in cell_tags(cell):
            sources.setdefault(cell_part(cell), []).append(cell.source)
    # The solution's imports bind the modules every cell means (a cell's own `import torch` changes nothing for
    # another); a mutant's version counts all it binds.
    bound = {part: set().union(*(_top_level_names(text, imports=False) for text in texts))
             for part, texts in sources.items()}
    for mutant in mutants:
        if mutant.notebook == notebook:
            sources[mutant.part].append(apply_to(graded_cell(nb, mutant.part).source, mutant))
            bound[mutant.part] |= _top_level_names(sources[mutant.part][-1])
    read = {part: set().union(*map(_read_names, texts)) for part, texts in sources.items()}
    links = {part: {other for other in sources if other != part and read[other] & bound[part]} for part in sources}
    changed = True
    while changed:
        changed = False
        for part, linked in links.items():
            reach = set().union(linked, *(links[other] for other in linked)) - {part}
            if reach != linked:
                links[part], changed = reach, True
    return links


def pack(mutants: list[Mutant] | None = None) -> list[list[Mutant]]:
    """The mutants grouped into as few notebooks as first-fit finds: each group holds mutants of one solution
    notebook, at most one per part, and no two in linked parts (:func:`linked_parts`, either way), so each part's verdict
    in the group's notebook is the verdict its mutant alone would get (the unmutated parts run the solution's
    code). A notebook costs a sandbox start (about 3 s of CPU, importing PyTorch); checking a part costs a
    fraction of that, so one notebook per group rather than per mutant cuts the grading to about a third."""
    mutants = MUTANTS if mutants is None else mutants
    links = {notebook: linked_parts(notebook, mutants) for notebook in dict.fromkeys(m.notebook for m in mutants)}
    groups: list[list[Mutant]] = []
    for mutant in mutants:
        for group in groups:
            if group[0].notebook == mutant.notebook and all(
                    other.part != mutant.part and other.part not in links[mutant.notebook][mutant.part]
                    and mutant.part not in links[mutant.notebook][other.part] for other in group):
                group.append(mutant)
                break
        else:
            groups.append([mutant])
    return groups


def apply_to(source: str, mutant: Mutant) -> str:
    """``source`` (the graded cell of the mutant's part) with the mutant's one replacement made."""
    count = source.count(mutant.old)
    if count != 1:
        raise ValueError(f"mutant {mutant.name}: {mutant.old!r} occurs {count} times in the {mutant.part} cell")
    return source.replace(mutant.old, mutant.new)


def write_packed_mutants(folder: Path, mutants: list[Mutant] | None = None) -> dict[str, list[Mutant]]:
    """Write one notebook per group of :func:`pack` into ``folder`` (every mutant of the group applied);
    returns file name -> the group's mutants."""
    folder.mkdir(parents=True, exist_ok=True)
    written: dict[str, list[Mutant]] = {}
    for number, group in enumerate(pack(mutants)):
        nb = nbformat.read(SOLUTIONS / f"{group[0].notebook}.ipynb", as_version=4)
        for mutant in group:
            cell = graded_cell(nb, mutant.part)
            cell.source = apply_to(cell.source, mutant)
        name = f"{group[0].notebook}__group{number:03d}.ipynb"
        nbformat.write(nb, folder / name)
        written[name] = group
    return written


def write_mutants(folder: Path, mutants: list[Mutant] | None = None) -> dict[str, Mutant]:
    """Write one notebook per mutant (default: all of :data:`MUTANTS`) into ``folder``; returns file name ->
    mutant."""
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for mutant in MUTANTS if mutants is None else mutants:
        name = f"{mutant.notebook}__{mutant.name}.ipynb"
        nbformat.write(apply(mutant), folder / name)
        written[name] = mutant
    return written
