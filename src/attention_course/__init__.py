"""attention_course: the library behind the course "Attention and the Transformer".

Every algorithm the lessons build step by step lives here once; lessons show it with :func:`show`
and check their hand-built versions against it.
"""

__version__ = "0.1.0"

# Foundations every notebook uses: reproducibility, device, source display, plots
from attention_course.display import show, source_of
from attention_course.plotting import (
    ATTENTION_CMAP,
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
from attention_course.rnn import AttentionGRUDecoder, GRUEncoder, Seq2SeqGRU

# Chapter 9: an encoder-only classifier
from attention_course.classifier import EncoderClassifier, pool_tokens

# Chapter 10: training and decoding the full Transformer
from attention_course.decoding import beam_search, greedy_decode
from attention_course.training import LabelSmoothingLoss, warmup_lr

# Chapter 11: making attention fast
from attention_course.efficient import (
    KVCache,
    cached_greedy_decode,
    layer_macs,
    measure_peak_memory,
    online_softmax_update,
    tiled_attention,
)

# Chapter 13: decoder-only language models
from attention_course.language_model import DecoderOnlyBlock, DecoderOnlyLM
from attention_course.sampling import sample_next_token
from attention_course.vocabulary import Vocabulary

# Chapters 14 and 15: positions for long contexts, attention at inference scale
from attention_course.alibi import alibi_bias, alibi_slopes
from attention_course.cost import kv_cache_bytes
from attention_course.grouped_query import grouped_query_attention
from attention_course.layers import DecoderLayerCache
from attention_course.masks import sliding_window_mask
from attention_course.rotary import apply_rotary

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
    induction_score,
    logit_lens,
    patch,
    path_patch,
    prefix_matching_score,
    previous_token_score,
    run_with_cache,
)

# Chapter 13b: the modern block, one configuration object, real checkpoints
from attention_course.checkpoints import load_hf_checkpoint
from attention_course.config import ModelConfig
from attention_course.feedforward import SwiGLU
from attention_course.masks import window_mask
from attention_course.normalization import RMSNorm
# The course model (chapters 13-17): trained once by `make course-model`, shipped in the package, loaded offline
from attention_course.course_model import load_course_model, save_llama_checkpoint
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
    speculative_accept,
    speculative_generate,
)
