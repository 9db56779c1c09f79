"""attention_course: the library behind the course "Attention and the Transformer".

Every algorithm the lessons build step by step lives here once; lessons show it with :func:`show`
and check their hand-built versions against it.
"""

__version__ = "0.1.0"

# Foundations every notebook uses: reproducibility, device, source display, plots
from attention_course.display import show, source_of
from attention_course.plotting import (
    ATTENTION_CMAP,
    DIVERGING_CMAP,
    OKABE_ITO,
    plot_attention,
    plot_attention_grid,
    show_figure,
    use_course_style,
)
from attention_course.interactive import Choice, Slider, Text, Toggle, interactive_figure
from attention_course.runtime import get_device, on_gpu, seed_everything, workload

# Chapter 2: from scores to weights
from attention_course.weighting import attention_pool, hard_attention_weights, soft_attention_weights

# The library: attention and the Transformer
# isort: split
from attention_course.additive import AdditiveAttention
from attention_course.attention import masked_softmax, scaled_dot_product_attention
from attention_course.feedforward import PositionwiseFeedForward
from attention_course.layers import DecoderLayer, EncoderLayer
from attention_course.masks import causal_mask, combine_masks, padding_mask
from attention_course.multihead import MultiHeadAttention
from attention_course.normalization import Dropout, LayerNorm
from attention_course.parameters import PAPER_CONFIGS, count_parameters, transformer_parameter_count
from attention_course.positional import (
    LearnedPositionalEmbedding,
    PositionalEncoding,
    sinusoidal_positional_encoding,
)
from attention_course.transformer import Decoder, Encoder, Transformer

# Chapter 1: the recurrent encoder-decoder with additive attention
from attention_course.rnn import AttentionGRUDecoder, GRUEncoder, Seq2SeqGRU, sequence_accuracy, train_seq2seq

# Chapter 9: an encoder-only classifier
from attention_course.classifier import EncoderClassifier, pool_tokens

# Chapter 10: training and decoding the full Transformer
from attention_course.decoding import beam_search, greedy_decode, length_penalty_factor, sequence_log_probs
from attention_course.training import (
    LabelSmoothingLoss,
    TorchTranslator,
    evaluate_translations,
    teacher_forced_exact_match,
    teacher_forcing,
    train_step,
    train_translator,
    transformer_optimizer,
    translation_loss,
    warmup_lr,
)

# Chapter 11: making attention fast
from attention_course.cost import layer_macs, measure_peak_memory
from attention_course.incremental import (
    DecodingCache,
    cached_greedy_decode,
    cached_self_attention,
    decode_step,
    decoder_layer_step,
)
from attention_course.kv_cache import KVCache
from attention_course.tiled import online_softmax, online_softmax_update, tiled_attention, tiled_attention_step

# Chapter 13: decoder-only language models
from attention_course.language_model import (
    DecoderOnlyBlock,
    DecoderOnlyLM,
    bigram_cross_entropy,
    evaluate_lm,
    next_token_loss,
    prefix_causal_mask,
    random_windows,
    train_language_model,
    unigram_cross_entropy,
    warmup_cosine_lr,
)
from attention_course.prefix_translation import (
    encode_prefix_pairs,
    joint_vocabulary,
    prefix_exact_match,
    prefix_greedy_translate,
    train_prefix_translator,
)
from attention_course.sampling import chi_square_p_value, sample_next_token, top_k_filter, top_p_filter
from attention_course.tokenization import BPETokenizer, CharTokenizer, count_pairs, merge_pair
from attention_course.vocabulary import Vocabulary

# Chapters 14 and 15: positions for long contexts, attention at inference scale
from attention_course.alibi import alibi_bias, alibi_slopes
from attention_course.cost import kv_cache_bytes
from attention_course.grouped_query import grouped_query_attention
from attention_course.layers import DecoderLayerCache
from attention_course.masks import sliding_window_mask
from attention_course.rotary import apply_rotary, rotary_frequencies

# Chapter 16: what attention heads learn
from attention_course.interpretability import (
    ActivationCache,
    AttentionOnlyLM,
    LogitAttribution,
    ablate_heads,
    capture_attention,
    composition_scores,
    copying_fraction,
    copying_score,
    direct_logit_attribution,
    in_context_learning_score,
    induction_score,
    logit_lens,
    patch,
    path_patch,
    per_position_loss,
    prefix_matching_score,
    previous_token_score,
    repeated_random_tokens,
    run_with_cache,
    train_on_repeats,
)

# Chapter 13b: the modern block, one configuration object, real checkpoints
from attention_course.checkpoints import load_hf_checkpoint
from attention_course.config import ModelConfig
from attention_course.feedforward import SwiGLU
from attention_course.masks import window_mask
from attention_course.normalization import RMSNorm
# The course model (chapters 13-17): trained once by `make course-model`, shipped in the package, loaded offline
from attention_course.course_model import (
    COURSE_MODEL_DIR,
    course_corpus,
    encode_files,
    evaluation_text,
    load_course_model,
    new_course_model,
    save_llama_checkpoint,
)
from attention_course.ngram import KneserNeyLM, bits_per_byte, lzma_bits_per_byte

# Chapter 17: serving attention
from attention_course.serving import (
    OutOfBlocksError,
    PagedKVCache,
    Request,
    block_and_offset,
    paged_forward,
    paged_generate,
    serve_continuous,
    serve_static,
    paged_attention,
    speculative_accept,
    speculative_generate,
)
from attention_course.serving_draft import (
    NGramDraft,
    chi_square_power,
    speculative_token_distribution,
    truncated_draft,
)
from attention_course.serving_scheduler import PrefixCache, percentile, serve_preemptive, serve_reserved

# The generated data sets, one module per task: ac.tasks.translation.make_translation_data(...)
# isort: split
from attention_course import tasks
