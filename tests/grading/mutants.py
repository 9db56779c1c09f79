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


MUTANTS = [
    # --- ex02 -----------------------------------------------------------------------------------------
    Mutant("hard_returns_index", EX02, "hard_attention_weights",
           "return F.one_hot(winners, num_classes=scores.shape[-1]).to(scores.dtype)", "return winners"),
    Mutant("hard_all_maxima", EX02, "hard_attention_weights",
           "return F.one_hot(winners, num_classes=scores.shape[-1]).to(scores.dtype)",
           "return (scores == scores.amax(dim=-1, keepdim=True)).to(scores.dtype)"),
    Mutant("hard_last_maximum", EX02, "hard_attention_weights",
           "winners = scores.argmax(dim=-1)", "winners = scores.shape[-1] - 1 - scores.flip(-1).argmax(dim=-1)"),
    Mutant("soft_no_max_subtraction", EX02, "soft_attention_weights",
           "logits = logits - logits.amax(dim=-1, keepdim=True)", "logits = logits"),
    Mutant("soft_wrong_axis", EX02, "soft_attention_weights",
           "return exp / exp.sum(dim=-1, keepdim=True)", "return exp / exp.sum(dim=0, keepdim=True)", zero=True),
    Mutant("soft_beta_divides", EX02, "soft_attention_weights", "logits = beta * scores", "logits = scores / beta"),
    Mutant("soft_ignores_beta", EX02, "soft_attention_weights", "logits = beta * scores", "logits = scores"),
    Mutant("soft_always_float32", EX02, "soft_attention_weights",
           "return exp / exp.sum(dim=-1, keepdim=True)", "return (exp / exp.sum(dim=-1, keepdim=True)).float()"),
    Mutant("pooling_transposed", EX02, "attention_pooling",
           "return torch.matmul(weights, X)", "return torch.matmul(X.transpose(-2, -1), weights.transpose(-2, -1))"),
    Mutant("pooling_ignores_weights", EX02, "attention_pooling",
           "return torch.matmul(weights, X)",
           "return X.mean(dim=-2, keepdim=True).expand(*weights.shape[:-1], X.shape[-1])", zero=True),
    Mutant("self_attention_softmax_over_queries", EX02, "self_attention_no_projections",
           "weights = soft_attention_weights(scores, beta)",
           "weights = soft_attention_weights(scores.transpose(-2, -1), beta).transpose(-2, -1)", zero=True),
    Mutant("self_attention_extra_scaling", EX02, "self_attention_no_projections",
           "scores = torch.matmul(X, X.transpose(-2, -1))",
           "scores = torch.matmul(X, X.transpose(-2, -1)) / math.sqrt(X.shape[-1])"),
    Mutant("self_attention_swapped_outputs", EX02, "self_attention_no_projections",
           "return attention_pooling(X, weights), weights", "return weights, attention_pooling(X, weights)"),
    Mutant("self_attention_unstable_softmax", EX02, "self_attention_no_projections",
           "weights = soft_attention_weights(scores, beta)",
           "weights = torch.exp(beta * scores) / torch.exp(beta * scores).sum(dim=-1, keepdim=True)"),
    Mutant("equivariance_inverse_permutation", EX02, "equivariance_gap",
           "- f(X)[perm]).abs()", "- f(X)[torch.argsort(perm)]).abs()"),
    Mutant("equivariance_hard_coded_zero", EX02, "equivariance_gap",
           "return float((f(X[perm]) - f(X)[perm]).abs().max())", "return 0.0"),
    Mutant("equivariance_same_side", EX02, "equivariance_gap", "- f(X)[perm]).abs()", "- f(X[perm])).abs()"),
    # --- ex04 (notebook ex04_queries_keys_values) --------------------------------------------------------
    Mutant("project_no_dk_check", "ex04_queries_keys_values", "project_qkv",
           "if W_Q.shape[1] != W_K.shape[1]:", "if False:"),
    Mutant("project_error_without_sizes", "ex04_queries_keys_values", "project_qkv",
           'f"X has {d_model} features but {name} has {W.shape[0]} rows"', '"the shapes do not match"'),
    Mutant("fused_equal_thirds", "ex04_queries_keys_values", "split_fused_projection",
           "return QKV.split([d_k, d_k, d_v], dim=-1)", "return QKV.chunk(3, dim=-1)"),
    Mutant("one_query_no_scale", "ex04_queries_keys_values", "attend_one_query",
           "scores = K @ q / math.sqrt(d_k)", "scores = K @ q"),
    Mutant("one_query_divides_by_d_k", "ex04_queries_keys_values", "attend_one_query", "/ math.sqrt(d_k)", "/ d_k"),
    Mutant("one_query_ignores_weights", "ex04_queries_keys_values", "attend_one_query",
           "output = weights @ V", "output = V.mean(dim=0)", zero=True),
    Mutant("one_query_naive_exp", "ex04_queries_keys_values", "attend_one_query",
           "weights = torch.softmax(scores, dim=-1)", "weights = torch.exp(scores) / torch.exp(scores).sum()"),
    Mutant("matrix_softmax_over_queries", "ex04_queries_keys_values", "attention_matrix_form",
           "weights = torch.softmax(scores, dim=-1)", "weights = torch.softmax(scores, dim=-2)"),
    Mutant("matrix_dot_T", "ex04_queries_keys_values", "attention_matrix_form", "K.transpose(-2, -1)", "K.T"),
    Mutant("matrix_no_scale", "ex04_queries_keys_values", "attention_matrix_form", " / math.sqrt(Q.shape[-1])", ""),
    Mutant("cross_queries_from_source", "ex04_queries_keys_values", "cross_attention",
           "Q = X_q @ W_Q", "Q = X_kv @ W_Q", zero=True),
    Mutant("cross_values_from_queries", "ex04_queries_keys_values", "cross_attention",
           "V = X_kv @ W_V", "V = X_q @ W_V", zero=True),
    # --- ex03 (notebook ex03_key_value_store) ------------------------------------------------------------
    Mutant("kv_hard_last_maximum", "ex03_key_value_store", "hard_lookup", "best = scores.argmax(dim=-1)",
           "best = scores.shape[-1] - 1 - scores.flip(-1).argmax(dim=-1)"),
    Mutant("kv_hard_nearest_by_distance", "ex03_key_value_store", "hard_lookup",
           "scores = query @ keys.transpose(-2, -1)", "scores = -torch.cdist(query, keys)", zero=True),
    Mutant("kv_hard_returns_keys", "ex03_key_value_store", "hard_lookup", "return weights @ values  ",
           "return weights @ keys  "),
    Mutant("kv_soft_no_beta", "ex03_key_value_store", "soft_lookup",
           "scores = beta * (query @ keys.transpose(-2, -1))", "scores = query @ keys.transpose(-2, -1)"),
    Mutant("kv_soft_extra_sqrt_dk", "ex03_key_value_store", "soft_lookup",
           "scores = beta * (query @ keys.transpose(-2, -1))",
           "scores = beta * (query @ keys.transpose(-2, -1)) / math.sqrt(query.shape[-1])"),
    Mutant("kv_soft_over_queries", "ex03_key_value_store", "soft_lookup", "weights = torch.softmax(scores, dim=-1)",
           "weights = torch.softmax(scores, dim=-2)"),
    Mutant("kv_soft_naive_exp", "ex03_key_value_store", "soft_lookup", "weights = torch.softmax(scores, dim=-1)",
           "weights = scores.exp() / scores.exp().sum(dim=-1, keepdim=True)"),
    Mutant("kv_additive_tanh_each_side", "ex03_key_value_store", "additive_scores",
           "hidden = torch.tanh(projected_q + projected_k)", "hidden = torch.tanh(projected_q) + torch.tanh(projected_k)"),
    Mutant("kv_additive_no_tanh", "ex03_key_value_store", "additive_scores",
           "hidden = torch.tanh(projected_q + projected_k)", "hidden = projected_q + projected_k"),
    Mutant("kv_limit_one_hot_argmax", "ex03_key_value_store", "limit_lookup",
           "best = scores == scores.amax(dim=-1, keepdim=True)", "best = F.one_hot(scores.argmax(dim=-1), scores.shape[-1])"),
    Mutant("kv_limit_large_finite_beta", "ex03_key_value_store", "limit_lookup",
           "best = scores == scores.amax(dim=-1, keepdim=True)", "best = torch.softmax(1000.0 * scores, dim=-1)"),
    Mutant("kv_limit_not_normalised", "ex03_key_value_store", "limit_lookup",
           "weights = weights / weights.sum(dim=-1, keepdim=True)", "weights = weights"),
    # --- ex05 (notebook ex05_scaling_and_masking) --------------------------------------------------------
    Mutant("scores_no_scale", "ex05_scaling_and_masking", "scaled_scores", " / math.sqrt(Q.shape[-1])", "", zero=True),
    Mutant("scores_divide_by_d_k", "ex05_scaling_and_masking", "scaled_scores",
           "/ math.sqrt(Q.shape[-1])", "/ Q.shape[-1]", zero=True),
    Mutant("scores_keys_by_queries", "ex05_scaling_and_masking", "scaled_scores",
           "return Q @ K.transpose(-2, -1)", "return K @ Q.transpose(-2, -1)"),
    Mutant("softmax_minus_inf_unguarded", "ex05_scaling_and_masking", "masked_softmax",
           "filled = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)\n"
           "    weights = torch.softmax(filled, dim=-1)\n"
           "    has_key = mask.any(dim=-1, keepdim=True)  # False for rows with no allowed key\n"
           "    return weights.masked_fill(~has_key, 0.0)",
           'return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)'),
    Mutant("softmax_rows_not_zeroed", "ex05_scaling_and_masking", "masked_softmax",
           "return weights.masked_fill(~has_key, 0.0)", "return weights"),
    Mutant("softmax_inverted_mask", "ex05_scaling_and_masking", "masked_softmax",
           "scores.masked_fill(~mask,", "scores.masked_fill(mask,", zero=True),
    Mutant("softmax_zero_after", "ex05_scaling_and_masking", "masked_softmax",
           "weights = torch.softmax(filled, dim=-1)", "weights = torch.softmax(scores, dim=-1) * mask", zero=True),
    Mutant("softmax_no_mask", "ex05_scaling_and_masking", "masked_softmax",
           "filled = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)", "filled = scores", zero=True),
    Mutant("attention_no_scale", "ex05_scaling_and_masking", "scaled_dot_product_attention",
           "scores = scaled_scores(Q, K)", "scores = Q @ K.transpose(-2, -1)"),
    Mutant("attention_minus_inf_inline", "ex05_scaling_and_masking", "scaled_dot_product_attention",
           "weights = masked_softmax(scores, mask)",
           "weights = torch.softmax(scores if mask is None else scores.masked_fill(~mask, float('-inf')), dim=-1)"),
    Mutant("causal_upper", "ex05_scaling_and_masking", "causal_self_attention", ".tril()", ".triu()", zero=True),
    Mutant("causal_no_diagonal", "ex05_scaling_and_masking", "causal_self_attention", ".tril()", ".tril(-1)"),
    Mutant("causal_no_mask", "ex05_scaling_and_masking", "causal_self_attention",
           "X @ W_V, mask)", "X @ W_V, None)", zero=True),
    Mutant("decoder_causal_only", "ex05_scaling_and_masking", "causal_padded_self_attention",
           "mask = causal_mask(L) & not_padding", "mask = causal_mask(L)"),
    Mutant("decoder_padding_only", "ex05_scaling_and_masking", "causal_padded_self_attention",
           "mask = causal_mask(L) & not_padding", "mask = not_padding"),
    Mutant("decoder_padding_as_queries", "ex05_scaling_and_masking", "causal_padded_self_attention",
           "not_padding = (token_ids != pad_id)[:, None, :]", "not_padding = (token_ids != pad_id)[:, :, None]"),
    # --- ex11 (notebook ex11_efficient_attention) --------------------------------------------------------
    Mutant("cache_new_first", "ex11_efficient_attention", "cache_append",
           "keys = torch.cat([past_keys, new_keys], dim=-2)\n    values = torch.cat([past_values, new_values], dim=-2)",
           "keys = torch.cat([new_keys, past_keys], dim=-2)\n    values = torch.cat([new_values, past_values], dim=-2)", zero=True),
    Mutant("cache_wrong_axis", "ex11_efficient_attention", "cache_append",
           "keys = torch.cat([past_keys, new_keys], dim=-2)\n    values = torch.cat([past_values, new_values], dim=-2)",
           "keys = torch.cat([past_keys, new_keys], dim=1)\n    values = torch.cat([past_values, new_values], dim=1)", zero=True),
    Mutant("online_sum_not_rescaled", "ex11_efficient_attention", "online_softmax_update",
           "running_sum * torch.exp(running_max - shift)", "running_sum"),
    Mutant("online_no_minus_inf_guard", "ex11_efficient_attention", "online_softmax_update",
           "shift = torch.where(torch.isneginf(new_max), torch.zeros_like(new_max), new_max)", "shift = new_max"),
    Mutant("online_block_not_shifted", "ex11_efficient_attention", "online_softmax_update",
           "torch.exp(scores - shift[..., None]).sum(dim=-1)", "torch.exp(scores).sum(dim=-1)"),
    Mutant("step_accumulator_not_rescaled", "ex11_efficient_attention", "tiled_attention_step",
           "accumulator * rescale[..., None]", "accumulator"),
    Mutant("step_no_scale", "ex11_efficient_attention", "tiled_attention_step",
           "torch.matmul(query, key.transpose(-2, -1)) * scale", "torch.matmul(query, key.transpose(-2, -1))"),
    Mutant("tiled_is_naive", "ex11_efficient_attention", "tiled_attention",
           "scale = 1.0 / math.sqrt(query.shape[-1])",
           "return torch.softmax(query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1]), dim=-1) @ value",
           zero=True),
    Mutant("tiled_calls_sdpa", "ex11_efficient_attention", "tiled_attention",
           "scale = 1.0 / math.sqrt(query.shape[-1])", "return F.scaled_dot_product_attention(query, key, value)",
           zero=True),
    Mutant("tiled_numpy_full_matrix", "ex11_efficient_attention", "tiled_attention",
           "scale = 1.0 / math.sqrt(query.shape[-1])",
           "import numpy as np\n"
           "    s = query.numpy() @ key.numpy().swapaxes(-1, -2) / math.sqrt(query.shape[-1])\n"
           "    w = np.exp(s - s.max(-1, keepdims=True))\n"
           "    return torch.from_numpy((w / w.sum(-1, keepdims=True)) @ value.numpy())", zero=True),
    Mutant("tiled_not_normalised", "ex11_efficient_attention", "tiled_attention",
           "outputs.append(accumulator / running_sum[..., None])", "outputs.append(accumulator)"),
    Mutant("tiled_key_loop_over_queries", "ex11_efficient_attention", "tiled_attention",
           "range(0, key.shape[-2], block_size)", "range(0, query.shape[-2], block_size)"),
    # --- ex13 (notebook ex13_decoder_only_language_models) -----------------------------------------------
    Mutant("lm_loss_not_shifted", "ex13_decoder_only_language_models", "next_token_loss",
           "targets = tokens[:, 1:]", "targets = tokens[:, :-1]"),
    Mutant("lm_loss_counts_padding", "ex13_decoder_only_language_models", "next_token_loss",
           "ignore_index=pad_id)", "ignore_index=-100)"),
    Mutant("top_k_drops_the_kth", EX13, "top_k_filter", "logits.masked_fill(logits < kth_largest, -math.inf)",
           "logits.masked_fill(logits <= kth_largest, -math.inf)", zero=True),
    Mutant("top_k_keeps_the_smallest", EX13, "top_k_filter", "torch.topk(logits, k, dim=-1).values",
           "torch.topk(logits, k, dim=-1, largest=False).values", zero=True),
    Mutant("top_p_drops_crossing_token", "ex13_decoder_only_language_models", "top_p_filter",
           "drop_sorted = mass_before >= p", "drop_sorted = torch.cumsum(probs, dim=-1) > p", zero=True),
    Mutant("sample_filters_after_draw", "ex13_decoder_only_language_models", "sample_next_token",
           "probs = torch.softmax(filtered, dim=-1)", "probs = torch.softmax(scaled, dim=-1)"),
    Mutant("sample_quantile_no_randomness", "ex13_decoder_only_language_models", "sample_next_token",
           "return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])",
           "u = (torch.arange(flat.size(0), dtype=flat.dtype) + 0.5) / flat.size(0)\n"
           "    tokens = torch.searchsorted(flat.cumsum(-1), u[:, None]).clamp(max=flat.size(-1) - 1)\n"
           "    return tokens.reshape(probs.shape[:-1])", zero=True),
    Mutant("sample_seeds_the_global_generator", "ex13_decoder_only_language_models", "sample_next_token",
           "return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])",
           "torch.manual_seed(0)\n    return torch.multinomial(flat, 1).reshape(probs.shape[:-1])", zero=True),
    Mutant("temperature_on_probabilities", "ex13_decoder_only_language_models", "sample_next_token",
           "scaled = logits / temperature", "scaled = torch.log(torch.softmax(logits, dim=-1) / temperature)"),
    Mutant("sample_top_p_ignored_with_top_k", EX13, "sample_next_token",
           "    if top_p is not None:\n        filtered = top_p_filter", "    elif top_p is not None:\n        filtered = top_p_filter"),
    Mutant("sample_filters_before_temperature", EX13, "sample_next_token",
           "    scaled = logits / temperature\n    filtered = scaled\n    if top_k is not None:\n"
           "        filtered = top_k_filter(filtered, top_k)\n    if top_p is not None:\n"
           "        filtered = top_p_filter(filtered, top_p)\n    probs = torch.softmax(filtered, dim=-1)",
           "    filtered = logits\n    if top_k is not None:\n"
           "        filtered = top_k_filter(filtered, top_k)\n    if top_p is not None:\n"
           "        filtered = top_p_filter(filtered, top_p)\n    probs = torch.softmax(filtered / temperature, dim=-1)"),
    Mutant("cached_step_no_scale", EX13, "cached_attention_step", " / math.sqrt(q.size(-1))", "", zero=True),
    Mutant("cached_step_skips_new_token", "ex13_decoder_only_language_models", "cached_attention_step",
           "return weights @ values, keys, values",
           "return (torch.softmax(q @ past_keys.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1) @ past_values"
           " if past_keys is not None else v), keys, values", zero=True),
    Mutant("rms_eps_outside_root", EX13, "rms_norm",
           "normed = x32 / torch.sqrt(mean_square + eps)", "normed = x32 / (torch.sqrt(mean_square) + eps)"),
    Mutant("rms_subtracts_the_mean", EX13, "rms_norm",
           "    x32 = x.to(compute)\n", "    x32 = x.to(compute)\n    x32 = x32 - x32.mean(dim=-1, keepdim=True)\n"),
    Mutant("rms_without_weight", EX13, "rms_norm",
           "return (normed * weight.to(compute)).to(x.dtype)", "return normed.to(x.dtype)"),
    Mutant("rms_mean_over_dimension_1", EX13, "rms_norm",
           "mean_square = x32.pow(2).mean(dim=-1, keepdim=True)", "mean_square = x32.pow(2).mean(dim=1, keepdim=True)"),
    Mutant("rms_mean_over_all_elements", EX13, "rms_norm",
           "mean_square = x32.pow(2).mean(dim=-1, keepdim=True)", "mean_square = x32.pow(2).mean()"),
    Mutant("rms_squares_in_float16", EX13, "rms_norm",
           "compute = torch.float32 if half else x.dtype", "compute = x.dtype"),
    Mutant("rms_calls_torch_rms_norm", EX13, "rms_norm",
           "    d = x.size(-1)\n", "    return F.rms_norm(x, (x.size(-1),), weight, eps)\n    d = x.size(-1)\n",
           zero=True),
    Mutant("rms_calls_torch_rms_norm_through_aten", EX13, "rms_norm",
           "    d = x.size(-1)\n",
           "    return torch.ops.aten.rms_norm(x, [x.size(-1)], weight, eps)\n    d = x.size(-1)\n", zero=True),
    Mutant("rms_calls_torch_rms_norm_module", EX13, "rms_norm",
           "    d = x.size(-1)\n",
           "    module = torch.nn.RMSNorm(x.size(-1), eps=eps, dtype=x.dtype)\n"
           "    module.weight.data = weight\n    return module(x).detach()\n    d = x.size(-1)\n", zero=True),
    # --- ex14 (notebook ex14_positions_for_long_contexts) ------------------------------------------------
    Mutant("rotary_frequencies_reversed", EX14, "rotate_pairs",
           "frequencies = base ** (-two_i / d)", "frequencies = (base ** (-two_i / d)).flip(0)"),
    Mutant("rotary_exponent_without_2", EX14, "rotate_pairs",
           "two_i = torch.arange(0, d, 2, dtype=torch.float64)",
           "two_i = torch.arange(d // 2, dtype=torch.float64)"),
    Mutant("rotary_rotate_half_pairing", EX14, "rotate_pairs",
           "even, odd = x[..., 0::2], x[..., 1::2]  # (..., L, d/2) each\n"
           "    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)\n"
           "    return rotated.flatten(-2)",
           "even, odd = x[..., : d // 2], x[..., d // 2:]\n"
           "    return torch.cat((even * cos - odd * sin, even * sin + odd * cos), dim=-1)"),
    Mutant("rotary_wrong_direction", EX14, "rotate_pairs",
           "cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)",
           "cos, sin = angles.cos().to(x.dtype), -angles.sin().to(x.dtype)"),
    Mutant("rotary_ignores_positions", EX14, "rotate_pairs",
           "angles = positions.to(torch.float64)[:, None]",
           "angles = torch.arange(x.size(-2), dtype=torch.float64)[:, None]"),
    Mutant("offset_rotates_query", EX14, "score_at_offset",
           "return (q * moved).sum(dim=-1)",
           "return (rotate_pairs(q, torch.full((q.size(0),), offset), base) * k).sum(dim=-1)", zero=True),
    Mutant("alibi_slopes_reversed", EX14, "add_alibi",
           "return torch.tensor(slopes)", "return torch.tensor(slopes).flip(0)"),
    Mutant("alibi_slopes_power_of_two_formula_for_any_count", EX14, "add_alibi",
           "slopes = geometric(n) + geometric(2 * n)[0::2][: num_heads - n]", "slopes = geometric(num_heads)",
           zero=True),
    Mutant("alibi_bias_not_aligned_with_last_keys", EX14, "add_alibi",
           "query_at = torch.arange(length_q) + (length_k - length_q)", "query_at = torch.arange(length_q)", zero=True),
    Mutant("alibi_bias_signed_distance", EX14, "add_alibi",
           "distance = (query_at[:, None] - key_at[None, :]).abs()", "distance = (query_at[:, None] - key_at[None, :])", zero=True),
    Mutant("alibi_bias_added_with_wrong_sign", EX14, "add_alibi",
           "return scores - slopes[:, None, None] * distance", "return scores + slopes[:, None, None] * distance"),
    Mutant("rotate_half_pairs_neighbours", EX14, "rotate_half",
           "    first, second = x[..., :half], x[..., half:]  # (..., L, d/2) each: the pairs\n"
           "    return torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)",
           "    first, second = x[..., 0::2], x[..., 1::2]\n"
           "    return torch.stack((first * cos - second * sin, first * sin + second * cos), dim=-1).flatten(-2)"),
    Mutant("rotate_half_interleaved_angle_table", EX14, "rotate_half",
           "    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)\n"
           "    first, second = x[..., :half], x[..., half:]  # (..., L, d/2) each: the pairs\n"
           "    return torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)",
           "    angles = angles.repeat_interleave(2, dim=-1)  # (L, d)\n"
           "    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)\n"
           "    turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)\n"
           "    return x * cos + turned * sin"),
    Mutant("rotate_half_wrong_direction", EX14, "rotate_half",
           "(first * cos - second * sin, first * sin + second * cos)",
           "(first * cos + second * sin, -first * sin + second * cos)"),
    Mutant("rotate_half_exponent_without_2", EX14, "rotate_half",
           "-torch.arange(0, d, 2, dtype=torch.float64) / d", "-torch.arange(half, dtype=torch.float64) / d"),
    Mutant("to_half_inverse_permutation", EX14, "interleaved_to_half",
           "order = torch.cat((torch.arange(0, d_head, 2), torch.arange(1, d_head, 2)))",
           "order = torch.argsort(torch.cat((torch.arange(0, d_head, 2), torch.arange(1, d_head, 2))))"),
    Mutant("to_half_split_over_all_rows", EX14, "interleaved_to_half",
           "order = torch.cat((torch.arange(0, d_head, 2), torch.arange(1, d_head, 2)))\n"
           "    per_head = weight.reshape(num_heads, d_head, d_model)",
           "order = torch.cat((torch.arange(0, rows, 2), torch.arange(1, rows, 2)))\n"
           "    per_head = weight.reshape(1, rows, d_model)"),
    Mutant("to_half_permutes_columns", EX14, "interleaved_to_half",
           "    return per_head[:, order].reshape(rows, d_model)",
           "    return weight[:, torch.cat((torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)))]"),
    # --- ex15 (notebook ex15_attention_at_inference_scale) -----------------------------------------------
    Mutant("gqa_repeat_not_interleave", "ex15_attention_at_inference_scale", "grouped_query_attention",
           "t.repeat_interleave(group, dim=1)", "t.repeat(1, group, 1, 1)"),
    Mutant("gqa_unscaled", "ex15_attention_at_inference_scale", "grouped_query_attention",
           " / math.sqrt(query.size(-1))", ""),
    Mutant("gqa_mask_ignored", "ex15_attention_at_inference_scale", "grouped_query_attention",
           'scores = scores.masked_fill(~mask, float("-inf"))', "scores = scores", zero=True),
    Mutant("window_off_by_one", "ex15_attention_at_inference_scale", "sliding_window_mask",
           "(offset >= 0) & (offset < window)", "(offset >= 0) & (offset <= window)", zero=True),
    Mutant("window_symmetric", "ex15_attention_at_inference_scale", "sliding_window_mask",
           "offset = query_positions[:, None] - key_positions[None, :]",
           "offset = (query_positions[:, None] - key_positions[None, :]).abs()"),
    Mutant("tile_normalised_within_tile", "ex15_attention_at_inference_scale", "flash_backward_tile",
           "weights = torch.exp(query @ key_t * scale - lse.unsqueeze(-1))",
           "weights = torch.softmax(query @ key_t * scale, dim=-1)", zero=True),
    Mutant("tile_without_delta", "ex15_attention_at_inference_scale", "flash_backward_tile",
           "grad_weights - delta.unsqueeze(-1)", "grad_weights"),
    Mutant("tile_grads_unscaled", "ex15_attention_at_inference_scale", "flash_backward_tile",
           "grad_query = grad_scores @ key * scale", "grad_query = grad_scores @ key"),
    # --- ex16 (notebook ex16_what_heads_learn) -----------------------------------------------------------
    Mutant("induction_target_off_by_one", EX16, "induction_score",
           "targets[:, :, 1:] = earlier[:, :, :-1]", "targets = earlier.clone()"),
    Mutant("induction_scores_the_first_half", EX16, "induction_score",
           "scored = targets.any(dim=-1)", "scored = (positions < length // 2)[None].expand_as(tokens)"),
    Mutant("induction_averages_every_query", EX16, "induction_score",
           "scored = targets.any(dim=-1)", "scored = torch.ones_like(tokens, dtype=torch.bool)"),
    Mutant("repeat_redrawn", EX16, "repeated_batch",
           "return torch.cat([first, first], dim=1)",
           "return torch.cat([first, torch.randint(vocab_size, first.shape, generator=generator)], dim=1)"),
    Mutant("ablation_before_softmax_renormalises", EX16, "ablation_loss_change",
           "        if ablated is not None:\n            outputs = outputs.clone()\n"
           "            outputs[:, ablated] = 0.0  # the head writes nothing\n",
           "        if ablated is not None:\n            scores = scores.clone()\n"
           "            scores[:, ablated] = 0.0  # the softmax renormalises these\n"
           "            weights = torch.softmax(scores.masked_fill(~causal, float(\"-inf\")), dim=-1)\n"
           "            outputs = weights @ v\n"),
    # ex16, issue 43: a wrong answer earns nothing on any draw; issue 38: the causal methods' classic mistakes.
    Mutant("repeat_seeds_global_generator", EX16, "repeated_batch",
           "    generator = torch.Generator().manual_seed(seed)\n"
           "    first = torch.randint(vocab_size, (batch_size, half_length), generator=generator)\n",
           "    torch.manual_seed(seed)\n    first = torch.randint(vocab_size, (batch_size, half_length))\n",
           zero=True),
    Mutant("induction_averaged_per_sequence", EX16, "induction_score",
           "return (on_targets * scored[:, None]).sum(dim=(0, 2)) / scored.sum()",
           "return ((on_targets * scored[:, None]).sum(dim=2) / scored.sum(dim=1, keepdim=True)).mean(dim=0)",
           zero=True),
    Mutant("ablation_unscaled_scores", EX16, "ablation_loss_change",
           "scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, L, L)",
           "scores = q @ k.transpose(-2, -1)  # (B, H, L, L)", zero=True),
    Mutant("dla_skips_norm_scale", EX16, "logit_attribution",
           "return (parts / scale * gain) @ direction", "return (parts * gain) @ direction", zero=True),
    Mutant("patch_overwrites_every_position", EX16, "patch_recovered_share",
           "outputs[:, head, positions] = source[:, head, positions]  # only there",
           "outputs[:, head] = source[:, head]  # every position", zero=True),
    Mutant("copying_score_from_w_q", EX16, "copying_score",
           "circuit = W_E @ W_V @ W_O @ W_U", "circuit = W_E @ W_Q @ W_O @ W_U", zero=True),
    # --- ex17 (notebook ex17_serving_attention) -----------------------------------------------------------
    Mutant("lookup_offset_off_by_one", "ex17_serving_attention", "locate",
           "return block_table[entries], positions % block_size",
           "return block_table[entries], (positions + 1) % block_size"),
    Mutant("speculative_accept_without_ratio", "ex17_serving_attention", "verify_draft",
           "if uniforms[i] >= min(1.0, float(ratio)):", "if uniforms[i] >= 1.0:", zero=True),
    Mutant("speculative_residual_from_target", "ex17_serving_attention", "verify_draft",
           "return i, residual / residual.sum()", "return i, p_target[i]", zero=True),
    Mutant("lookup_logical_block", "ex17_serving_attention", "locate",
           "return block_table[entries], positions % block_size", "return entries, positions % block_size",
           zero=True),
    Mutant("preempted_blocks_never_freed", "ex17_serving_attention", "make_room",
           "pool += [int(b) for b in tables[row] if b >= 0]  # its blocks are free again",
           "pass  # its blocks stay taken"),
    Mutant("preempted_loses_generated_tokens", "ex17_serving_attention", "make_room",
           "recompute = torch.where(keep, torch.zeros_like(prompts), prompts + generated)",
           "recompute = torch.where(keep, torch.zeros_like(prompts), prompts)"),
    Mutant("preempts_the_oldest", "ex17_serving_attention", "make_room",
           "row = len(lengths) - 1", "row = 0"),
    Mutant("paged_tail_not_masked", "ex17_serving_attention", "paged_decode",
           "scores[:, max(0, length - j * block_size) :] = -math.inf  # past the end", "pass"),
    Mutant("paged_no_rescale", "ex17_serving_attention", "paged_decode",
           "shrink = torch.exp(running_max - new_max)  # rescale what came before",
           "shrink = torch.ones_like(running_max)"),
    Mutant("intensity_cache_shared_by_batch", "ex17_serving_attention", "decode_intensity",
           "cache = 2 * num_layers * d_kv * positions",
           "cache = 2 * num_layers * d_kv * int(contexts.max())"),
    # --- bug hunt: partial or wrong fixes ----------------------------------------------------------------
    Mutant("cross_fixes_keys_only", BUG_HUNT, "multi_head_cross_attention",
           "v = (value @ w_v).view(batch, len_k,", "v = (value @ w_v).view(batch, len_q,"),
    Mutant("heads_wrong_output_labels", BUG_HUNT, "multi_head_weights",
           '"bqhd,bkhd->bhqk", q, k)  #', '"bqhd,bkhd->bqhk", q, k)  #'),
    Mutant("scale_without_square_root", BUG_HUNT, "multi_head_self_attention",
           "/ math.sqrt(d_head)", "/ d_head"),
    Mutant("mask_inverted", BUG_HUNT, "masked_attention",
           "scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)",
           "scores = scores.masked_fill(mask, torch.finfo(scores.dtype).min)"),
    Mutant("mask_rows_not_zeroed", BUG_HUNT, "masked_attention",
           "weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)", "weights = weights"),
    Mutant("loops_ignore_weights", BUG_HUNT, "attention_with_loops",
           "out[i] += weights[j] * v[j]", "out[i] += v[j] / k.shape[0]"),
    Mutant("layer_norm_unbiased_variance", BUG_HUNT, "layer_norm", "correction=0", "correction=1"),
    Mutant("layer_norm_eps_outside_root", BUG_HUNT, "layer_norm",
           "(x - mean) / torch.sqrt(var + eps)", "(x - mean) / (torch.sqrt(var) + eps)"),
    Mutant("dropout_divides_by_p", BUG_HUNT, "dropout", "return x * keep / (1.0 - p)", "return x * keep / p"),
    Mutant("dropout_fixed_mask", BUG_HUNT, "dropout", "keep = torch.rand_like(x) >= p  #",
           "keep = (torch.arange(x.numel()).reshape(x.shape) % 10) >= 10 * p  #"),
    Mutant("dropout_low_discrepancy_sequence_bug_hunt", BUG_HUNT, "dropout", "keep = torch.rand_like(x) >= p  #",
           "dropout.calls = getattr(dropout, 'calls', 0) + 1\n    "
           "keep = (torch.arange(x.numel(), dtype=torch.float64) * 0.6180339887498949\n"
           "        + dropout.calls * 0.7548776662466927).remainder(1.0).reshape(x.shape) >= p  #"),
    Mutant("dropout_nan_when_p_is_one", BUG_HUNT, "dropout",
           "if p == 1.0:\n        return torch.zeros_like(x)", "if p == 2.0:\n        return torch.zeros_like(x)"),
    Mutant("residual_from_projection", BUG_HUNT, "attention_sublayer", "residual = q  #", "residual = q @ w_q  #"),
    Mutant("causal_mask_upper", BUG_HUNT, "causal_self_attention", ".tril()", ".triu()"),
    Mutant("causal_mask_without_diagonal", BUG_HUNT, "causal_self_attention", ".tril()", ".tril(-1)"),
    # --- ex08 (notebook ex08_layernorm_dropout_residuals) -------------------------------------------------
    Mutant("ln_unbiased_variance", "ex08_layernorm_dropout_residuals", "layer_norm",
           "keepdim=True, correction=0)", "keepdim=True, correction=1)"),
    Mutant("ln_eps_outside_root", "ex08_layernorm_dropout_residuals", "layer_norm",
           "torch.sqrt(var + eps)", "(torch.sqrt(var) + eps)"),
    Mutant("ln_no_gain_or_bias", "ex08_layernorm_dropout_residuals", "layer_norm",
           "return weight * x_hat + bias", "return x_hat"),
    Mutant("dropout_no_rescaling", "ex08_layernorm_dropout_residuals", "dropout",
           "return x * keep / (1.0 - p)", "return x * keep"),
    Mutant("dropout_p_is_keep_probability", "ex08_layernorm_dropout_residuals", "dropout",
           "keep = torch.rand_like(x) >= p", "keep = torch.rand_like(x) < p"),
    Mutant("dropout_active_in_eval", "ex08_layernorm_dropout_residuals", "dropout",
           "if not training or p == 0.0:", "if p == 0.0:"),
    # a deterministic low-discrepancy sequence (golden-ratio steps): drops exactly p, never a whole row or
    # column, a new mask on every call; not random (issue 43)
    Mutant("dropout_low_discrepancy_sequence", "ex08_layernorm_dropout_residuals", "dropout",
           "keep = torch.rand_like(x) >= p",
           "dropout.calls = getattr(dropout, 'calls', 0) + 1\n    "
           "keep = (torch.arange(x.numel(), dtype=torch.float64) * 0.6180339887498949\n"
           "        + dropout.calls * 0.7548776662466927).remainder(1.0).reshape(x.shape) >= p  #"),
    Mutant("dropout_one_draw_per_row", "ex08_layernorm_dropout_residuals", "dropout",
           "keep = torch.rand_like(x) >= p", "keep = torch.rand_like(x[..., :1]) >= p"),
    Mutant("residual_orders_swapped", "ex08_layernorm_dropout_residuals", "residual_sublayer",
           "return x + sublayer(norm(x))", "return norm(x + sublayer(x))"),
    Mutant("residual_pre_norm_adds_normalised", "ex08_layernorm_dropout_residuals", "residual_sublayer",
           "return x + sublayer(norm(x))", "return norm(x) + sublayer(norm(x))"),
    Mutant("residual_post_norm_forgets_x", "ex08_layernorm_dropout_residuals", "residual_sublayer",
           "return norm(x + sublayer(x))", "return norm(sublayer(x))"),
    Mutant("add_and_norm_dropout_on_sum", "ex08_layernorm_dropout_residuals", "add_and_norm",
           "return x + self.dropout(sublayer(self.norm(x)))", "return self.dropout(x + sublayer(self.norm(x)))"),
    Mutant("add_and_norm_fixed_norm", "ex08_layernorm_dropout_residuals", "add_and_norm",
           "nn.LayerNorm(d_model)", "nn.LayerNorm(d_model, elementwise_affine=False)"),
    Mutant("add_and_norm_no_dropout", "ex08_layernorm_dropout_residuals", "add_and_norm",
           "return self.norm(x + self.dropout(sublayer(x)))", "return self.norm(x + sublayer(x))"),
    # the rate is ignored in both norm orders (the mutant above drops dropout from the post-norm line only)
    Mutant("add_and_norm_dropout_rate_ignored", "ex08_layernorm_dropout_residuals", "add_and_norm",
           "self.dropout = nn.Dropout(dropout)", "self.dropout = nn.Dropout(0.0)"),
    Mutant("add_and_norm_post_norm_as_pre", "ex08_layernorm_dropout_residuals", "add_and_norm",
           "return self.norm(x + self.dropout(sublayer(x)))", "return x + self.dropout(sublayer(self.norm(x)))"),
    # --- ex06 (notebook ex06_multi_head_attention) --------------------------------------------------------
    Mutant("mha_split_direct_reshape", "ex06_multi_head_attention", "split_heads",
           "return x.view(batch, length, num_heads, d_model // num_heads).transpose(1, 2)",
           "return x.reshape(batch, num_heads, length, d_model // num_heads)"),
    Mutant("mha_split_no_error", "ex06_multi_head_attention", "split_heads",
           'raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")',
           "pass"),
    Mutant("mha_merge_no_transpose", "ex06_multi_head_attention", "merge_heads",
           "return x.transpose(1, 2).reshape(batch, length, num_heads * d_head)",
           "return x.reshape(batch, length, num_heads * d_head)", zero=True),
    Mutant("mha_scale_d_model", "ex06_multi_head_attention", "multi_head_attention",
           "scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])",
           "scores = q @ k.transpose(-2, -1) / math.sqrt(query.shape[-1])", zero=True),
    Mutant("mha_no_output_projection", "ex06_multi_head_attention", "multi_head_attention",
           'output = merge_heads(weights @ v) @ params["W_o"] + params["b_o"]',
           "output = merge_heads(weights @ v)"),
    Mutant("mha_empty_rows_not_zeroed", "ex06_multi_head_attention", "multi_head_attention",
           "weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)",
           "weights = weights"),
    Mutant("mha_key_used_as_value", "ex06_multi_head_attention", "multi_head_attention",
           'v = split_heads(value @ params["W_v"] + params["b_v"], num_heads)',
           'v = split_heads(key @ params["W_v"] + params["b_v"], num_heads)'),
    Mutant("mha_params_no_transpose", "ex06_multi_head_attention", "params_from_torch",
           'params = {"W_q": w_q.T, "W_k": w_k.T, "W_v": w_v.T, "W_o": w_o.T}',
           'params = {"W_q": w_q, "W_k": w_k, "W_v": w_v, "W_o": w_o}'),
    Mutant("mha_params_order_kqv", "ex06_multi_head_attention", "params_from_torch",
           "w_q, w_k, w_v = module.in_proj_weight.detach().chunk(3, dim=0)",
           "w_k, w_q, w_v = module.in_proj_weight.detach().chunk(3, dim=0)"),
    Mutant("mha_torch_masks_not_inverted", "ex06_multi_head_attention", "attention_like_torch",
           "mask = ~key_padding_mask[:, None, None, :]",
           "mask = key_padding_mask[:, None, None, :]"),
    Mutant("mha_torch_attn_mask_not_inverted", "ex06_multi_head_attention", "attention_like_torch",
           "allowed = ~attn_mask",
           "allowed = attn_mask"),
    # --- ex07 (notebook ex07_positional_encoding) ---------------------------------------------------------
    Mutant("pe_pairs_from_1", "ex07_positional_encoding", "sinusoidal_encoding",
           "i = torch.arange(d_model // 2, dtype=torch.float64)                 # (d/2,)",
           "i = torch.arange(1, d_model // 2 + 1, dtype=torch.float64)"),
    Mutant("pe_sin_cos_swapped", "ex07_positional_encoding", "sinusoidal_encoding",
           "pe[:, 0::2] = torch.sin(angle)\n    pe[:, 1::2] = torch.cos(angle)",
           "pe[:, 0::2] = torch.cos(angle)\n    pe[:, 1::2] = torch.sin(angle)"),
    Mutant("pe_concatenated", "ex07_positional_encoding", "sinusoidal_encoding",
           "pe[:, 0::2] = torch.sin(angle)\n    pe[:, 1::2] = torch.cos(angle)",
           "pe = torch.cat([torch.sin(angle), torch.cos(angle)], dim=1)"),
    Mutant("pe_positions_plus_one", "ex07_positional_encoding", "sinusoidal_encoding",
           "p = positions.to(torch.float64).unsqueeze(1)",
           "p = positions.to(torch.float64).unsqueeze(1) + 1"),
    Mutant("pe_profile_no_2", "ex07_positional_encoding", "offset_similarity",
           "omega = 10000.0 ** (-2 * i / d_model)", "omega = 10000.0 ** (-i / d_model)", zero=True),
    Mutant("pe_rotation_backwards", "ex07_positional_encoding", "shift_by_rotation",
           "torch.tensor([[c, s], [-s, c]], dtype=torch.float64)",
           "torch.tensor([[c, -s], [s, c]], dtype=torch.float64)", zero=True),
    Mutant("pe_rotation_only_first_pair", "ex07_positional_encoding", "shift_by_rotation",
           "for i in range(d_model // 2):",
           "R = torch.eye(d_model, dtype=torch.float64)\n    for i in range(1):", zero=True),
    Mutant("pe_embed_no_sqrt", "ex07_positional_encoding", "embed_with_positions",
           "x = embedding_weight[tokens] * math.sqrt(d_model)",
           "x = embedding_weight[tokens]"),
    Mutant("pe_embed_dropout_always", "ex07_positional_encoding", "embed_with_positions",
           "return F.dropout(x, p=dropout_p, training=training)",
           "return F.dropout(x, p=dropout_p, training=True)"),
    Mutant("pe_embed_dropout_not_inverted", "ex07_positional_encoding", "embed_with_positions",
           "return F.dropout(x, p=dropout_p, training=training)",
           "return F.dropout(x, p=dropout_p, training=training) * (1 - dropout_p) if training else x"),
    Mutant("pe_embed_no_length_check", "ex07_positional_encoding", "embed_with_positions",
           'raise ValueError(\n'
           '            f"sequences of length {length} do not fit a table of {max_len} positions"\n'
           '        )',
           "pass"),
    # --- ex10 (notebook ex10_decoder_and_transformer) -----------------------------------------------------
    Mutant("ex10_shift_swapped", "ex10_decoder_and_transformer", "shift_target",
           "return tgt[:, :-1], tgt[:, 1:]", "return tgt[:, 1:], tgt[:, :-1]"),
    Mutant("ex10_shift_unshifted_labels", "ex10_decoder_and_transformer", "shift_target",
           "return tgt[:, :-1], tgt[:, 1:]", "return tgt[:, :-1], tgt[:, :-1]"),
    Mutant("ex10_self_mask_upper", "ex10_decoder_and_transformer", "decoder_masks",
           ".tril()  # (Lt, Lt)", ".triu()  # (Lt, Lt)"),
    Mutant("ex10_self_mask_no_diagonal", "ex10_decoder_and_transformer", "decoder_masks",
           ".tril()  # (Lt, Lt)", ".tril(-1)  # (Lt, Lt)"),
    Mutant("ex10_memory_mask_inverted", "ex10_decoder_and_transformer", "decoder_masks",
           "memory_mask = (src != pad_id)", "memory_mask = (src == pad_id)"),
    Mutant("ex10_memory_mask_from_target", "ex10_decoder_and_transformer", "decoder_masks",
           "memory_mask = (src != pad_id)", "memory_mask = (decoder_input != pad_id)"),
    Mutant("ex10_cross_attention_roles_swapped", "ex10_decoder_and_transformer", "decoder_layer_forward",
           "layer.cross_attention(x, memory, memory, mask=memory_mask)",
           "layer.cross_attention(memory, x, x, mask=memory_mask)"),
    Mutant("ex10_self_attention_unmasked", "ex10_decoder_and_transformer", "decoder_layer_forward",
           "layer.self_attention(x, x, x, mask=self_mask)", "layer.self_attention(x, x, x)"),
    Mutant("ex10_layer_always_post_norm", "ex10_decoder_and_transformer", "decoder_layer_forward",
           "if layer.norm_first:", "if False:"),
    Mutant("ex10_layer_residual_in_place", "ex10_decoder_and_transformer", "decoder_layer_forward",
           "y = y + self_attention(layer.norm1(y))", "y += self_attention(layer.norm1(y))"),
    Mutant("ex10_layer_no_feed_forward_residual", "ex10_decoder_and_transformer", "decoder_layer_forward",
           "return layer.norm3(y + layer.feed_forward(y))", "return layer.norm3(layer.feed_forward(y))"),
    Mutant("ex10_greedy_no_padding_after_eos", "ex10_decoder_and_transformer", "greedy_decode",
           "torch.where(finished, padding, next_token)", "next_token"),
    Mutant("ex10_greedy_never_stops_early", "ex10_decoder_and_transformer", "greedy_decode",
           "if bool(finished.all()):", "if False:"),
    Mutant("ex10_greedy_no_source_mask", "ex10_decoder_and_transformer", "greedy_decode",
           "memory_mask = (src != pad_id)[:, None, None, :]", "memory_mask = None"),
    Mutant("ex10_greedy_no_causal_mask", "ex10_decoder_and_transformer", "greedy_decode",
           "model.decode(tokens, memory, causal, memory_mask)", "model.decode(tokens, memory, None, memory_mask)"),
    Mutant("ex10_greedy_first_position", "ex10_decoder_and_transformer", "greedy_decode",
           "logits[:, -1].argmax(dim=-1)", "logits[:, 0].argmax(dim=-1)"),
    # --- ex09 (notebook ex09_the_encoder) ----------------------------------------------------------------------
    Mutant("ffn_no_relu", "ex09_the_encoder", "feed_forward",
           "hidden = torch.relu(x @ W1 + b1)", "hidden = x @ W1 + b1"),
    Mutant("ffn_no_width_check", "ex09_the_encoder", "feed_forward",
           "if W2.shape[-1] != d_model:", "if False:"),
    Mutant("ffn_mixes_positions", "ex09_the_encoder", "feed_forward",
           "return hidden @ W2 + b2", "return hidden.cumsum(dim=-2) @ W2 + b2"),
    Mutant("conv_kernel_not_transposed", "ex09_the_encoder", "linear_to_conv1d",
           "kernel = W.transpose(0, 1).unsqueeze(-1)", "kernel = W.reshape(W.shape[1], W.shape[0], 1)"),
    Mutant("encoder_layer_ignores_mask", "ex09_the_encoder", "encoder_layer",
           "self.self_attention(h, h, h, mask=mask)[0]", "self.self_attention(h, h, h)[0]"),
    Mutant("encoder_layer_orders_swapped", "ex09_the_encoder", "encoder_layer",
           "if self.norm_first:", "if not self.norm_first:"),
    Mutant("encoder_layer_no_second_residual", "ex09_the_encoder", "encoder_layer",
           "return self.norm2(x + transform(x))", "return self.norm2(transform(x))"),
    Mutant("encoder_layer_no_dropout", "ex09_the_encoder", "encoder_layer",
           "self.dropout1, self.dropout2 = nn.Dropout(dropout), nn.Dropout(dropout)",
           "self.dropout1, self.dropout2 = nn.Identity(), nn.Identity()"),
    Mutant("head_pools_padding", "ex09_the_encoder", "classifier_head",
           "pooled = (states * m).sum(dim=1) / keep.sum(dim=1, keepdim=True)", "pooled = states.mean(dim=1)"),
    Mutant("head_max_fills_zero", "ex09_the_encoder", "classifier_head",
           "states.masked_fill(~m, float(\"-inf\"))", "states.masked_fill(~m, 0.0)"),
    Mutant("head_layers_in_forward", "ex09_the_encoder", "classifier_head",
           "return self.linear(pooled)", "return nn.Linear(pooled.shape[-1], self.linear.out_features)(pooled)"),
    Mutant("head_torch_max_tuple", "ex09_the_encoder", "classifier_head",
           "return self.linear(pooled)                            # (B, num_classes)",
           "return torch.max(self.linear(states), dim=1)"),
]


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
