"""One configuration object for the choices a Transformer block makes (chapters 13, 13b, 14 and 15).

The sizes of a model (``d_model``, ``num_heads``, ``d_ff``, ``num_layers``, the vocabulary) stay ordinary
constructor arguments, as they always were. What varies between the 2017 Transformer, GPT-2 and Llama is a
set of *choices*: how positions enter attention, how many key/value heads there are, which normalisation and
which feed-forward activation a block uses, whether projections have biases, how weights are initialised.
:class:`ModelConfig` holds all of them, with defaults equal to the course's original model, and every module
from :class:`~attention_course.MultiHeadAttention` up to :class:`~attention_course.DecoderOnlyLM` takes it as
``config=``. Each module reads the fields that concern it and passes the config on to the modules it builds,
so one object describes a whole model:

    >>> llama_like = ModelConfig(positions="rotary", rotary_pairing="half", num_kv_heads=2,
    ...                          norm="rmsnorm", feed_forward="swiglu", bias=False)

The config is the one way to give these choices (``DecoderOnlyBlock(64, 8, 256, config=ModelConfig(...))``).
The one exception is the course's public signature of ``MultiHeadAttention``, which names ``bias=`` and
``num_kv_heads=``: they are folded into its config, and giving one both ways, differently, is an error.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from attention_course.checks import check_int
from attention_course.rotary import ROTARY_PAIRINGS

__all__ = ["ACTIVATIONS", "FEED_FORWARDS", "INITS", "NORMS", "ROTARY_PAIRINGS", "ModelConfig"]

NORMS = ("layernorm", "rmsnorm")
FEED_FORWARDS = ("relu", "gelu", "gelu_tanh", "swiglu")
ACTIVATIONS = FEED_FORWARDS  # the same names: "swiglu" is an activation with its own gate
INITS = ("default", "gpt2")
_POSITIONS = (None, "rotary", "alibi")


@dataclass(frozen=True)
class ModelConfig:
    """The choices of an attention layer, a Transformer block and a decoder-only model (defaults: today's).

    Attention (read by :class:`~attention_course.MultiHeadAttention`):

    Attributes:
        num_kv_heads: key/value heads; None = one per query head (multi-head attention), fewer =
            grouped-query attention, 1 = multi-query attention.
        positions: ``None`` (positions, if any, are added to the input), ``"rotary"`` or ``"alibi"``.
        rotary_base: the base of the rotary frequencies (10000 in RoFormer and Llama 2).
        rotary_pairing: which features rotate together: ``"interleaved"`` pairs ``(2i, 2i+1)`` (RoFormer,
            the course's chapter 14) and ``"half"`` pairs ``(i, i + d/2)`` (the "rotate-half" layout of
            Llama's Hugging Face checkpoints). The two are the same rotation of permuted features.
        window: sliding-window attention: each query sees itself and the ``window - 1`` positions before
            it (None: the whole causal past). A decoder-only model builds its mask from it and gives its KV
            caches this window.
        bias: biases in the attention projections, the feed-forward layers and the LayerNorms
            (GPT-2: True; Llama: False).

    Block (read by the layers and :class:`~attention_course.DecoderOnlyBlock`):

    Attributes:
        norm: ``"layernorm"`` (Ba et al. 2016) or ``"rmsnorm"`` (Zhang & Sennrich 2019).
        norm_eps: the epsilon of the normalisation.
        feed_forward: ``"relu"`` (the 2017 Transformer), ``"gelu"`` (exact GELU), ``"gelu_tanh"`` (GPT-2's
            tanh approximation) or ``"swiglu"`` (Shazeer 2020; Llama).

    Model (read by :class:`~attention_course.DecoderOnlyLM`):

    Attributes:
        init: ``"default"`` (each module's own initialisation) or ``"gpt2"``: every linear weight
            ``N(0, 0.02²)``, biases zero, and the projections that write into the residual stream (the
            attention's ``w_o`` and the feed-forward's last layer) ``N(0, (0.02/√(2·num_layers))²)``, so
            that the residual stream's variance grows less with depth (Radford et al. 2019, §2.3, scale
            residual layers by ``1/√N``; Hugging Face's GPT-2 and nanoGPT take ``N = 2·num_layers``).
    """

    num_kv_heads: int | None = None
    positions: str | None = None
    rotary_base: float = 10000.0
    rotary_pairing: str = "interleaved"
    window: int | None = None
    bias: bool = True
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    feed_forward: str = "relu"
    init: str = "default"

    def __post_init__(self) -> None:
        if self.num_kv_heads is not None:
            check_int("num_kv_heads", self.num_kv_heads)
        if self.window is not None:
            check_int("window", self.window)
        if self.positions not in _POSITIONS:
            raise ValueError(f"positions must be one of {_POSITIONS}, got {self.positions!r}")
        for name, value, allowed in (("rotary_pairing", self.rotary_pairing, ROTARY_PAIRINGS),
                                     ("norm", self.norm, NORMS), ("feed_forward", self.feed_forward, FEED_FORWARDS),
                                     ("init", self.init, INITS)):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        if isinstance(self.rotary_base, bool) or not isinstance(self.rotary_base, (int, float)) \
                or not self.rotary_base > 1:
            raise ValueError(f"rotary_base must be a number greater than 1, got {self.rotary_base!r}")
        if not isinstance(self.bias, bool):
            raise TypeError(f"bias must be a bool, got {type(self.bias).__name__} {self.bias!r}")
        if isinstance(self.norm_eps, bool) or not isinstance(self.norm_eps, (int, float)) or not self.norm_eps > 0:
            raise ValueError(f"norm_eps must be a positive number, got {self.norm_eps!r}")

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with some fields changed (``dataclasses.replace``), e.g. ``config.replace(norm="rmsnorm")``."""
        return replace(self, **changes)


def resolve_config(config: ModelConfig | None) -> ModelConfig:
    """``config``, or the default :class:`ModelConfig` when it is None; anything else is a ``TypeError``."""
    if config is None:
        return ModelConfig()
    if not isinstance(config, ModelConfig):
        raise TypeError(f"config must be an attention_course.ModelConfig, got {type(config).__name__}")
    return config
