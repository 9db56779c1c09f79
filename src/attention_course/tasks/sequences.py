"""Copy and reverse: digit-sequence tasks whose output grows with the input.

Each example is a random sequence of symbols ``x_1 … x_L`` and a target that is the same sequence (``copy``)
or the sequence backwards (``reverse``). The rule is trivial; the difficulty is memory. A model must keep
all L symbols until it writes them out, so a model that squeezes the input into one fixed-size vector
fails as L grows, and a model that can look back at the input (attention) does not.

Token ids, shared by source and target: 0 = PAD, 1 = BOS, 2 = EOS, then one id per symbol
(``3 … 3 + num_symbols - 1``; symbol s is written as the digit s when ``num_symbols <= 10``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attention_course.checks import check_int

__all__ = ["BOS", "EOS", "PAD", "NUM_SPECIAL", "SequenceTask", "decode", "make_sequence_task"]

#: The padding id, which fills sequences up to the batch's length; the loss ignores it.
PAD = 0
#: The beginning-of-sequence id, the decoder's first input.
BOS = 1
#: The end-of-sequence id, the decoder's last output; generation stops there.
EOS = 2
#: Number of special ids (:data:`PAD`, :data:`BOS`, :data:`EOS`); digit ``d`` has id ``d + NUM_SPECIAL``.
NUM_SPECIAL = 3
TASKS = ("copy", "reverse")


@dataclass
class SequenceTask:
    """A generated data set, every tensor right-padded with PAD.

    Attributes:
        src: ``(N, max_len)`` input symbols.
        tgt_in: ``(N, max_len + 1)`` BOS followed by the target: what the decoder reads (teacher forcing).
        tgt_out: ``(N, max_len + 1)`` the target followed by EOS: what the decoder must write.
        lengths: ``(N,)`` the length L of each input sequence.
        vocab_size: number of token ids (specials included).
        task: ``"copy"`` or ``"reverse"``.
    """

    src: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    lengths: Tensor
    vocab_size: int
    task: str

    def __len__(self) -> int:
        return self.src.size(0)

    def subset(self, index: Tensor) -> SequenceTask:
        """The examples selected by ``index`` (a boolean mask ``(N,)`` or integer indices)."""
        return SequenceTask(self.src[index], self.tgt_in[index], self.tgt_out[index], self.lengths[index],
                            self.vocab_size, self.task)


def make_sequence_task(
    num_examples: int,
    min_len: int,
    max_len: int,
    task: str = "reverse",
    num_symbols: int = 10,
    seed: int = 0,
) -> SequenceTask:
    """Generate ``num_examples`` copy or reverse examples with lengths drawn uniformly from ``[min_len, max_len]``.

    Args:
        num_examples: how many examples.
        min_len, max_len: the range of input lengths (inclusive), ``1 <= min_len <= max_len``.
        task: ``"reverse"`` (target = input backwards) or ``"copy"`` (target = input).
        num_symbols: size of the symbol alphabet (10 gives the digits 0-9).
        seed: the data are a deterministic function of the arguments and this seed.

    Returns:
        A :class:`SequenceTask`.

    Example:
        >>> data = make_sequence_task(2, 3, 3, task="reverse", seed=1)
        >>> decode(data.src[0]), decode(data.tgt_out[0])   # e.g. ('529', '925')
    """
    for name, value in (("num_examples", num_examples), ("min_len", min_len), ("max_len", max_len),
                        ("num_symbols", num_symbols)):
        check_int(name, value)
    if min_len > max_len:
        raise ValueError(f"min_len must be <= max_len, got min_len={min_len} and max_len={max_len}")
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (num_examples,), generator=generator)  # (N,)
    symbols = torch.randint(0, num_symbols, (num_examples, max_len), generator=generator) + NUM_SPECIAL
    positions = torch.arange(max_len)  # (max_len,)
    real = positions < lengths.unsqueeze(1)  # (N, max_len): True on the first L positions
    src = symbols.masked_fill(~real, PAD)
    if task == "copy":
        target = src
    else:
        # Reverse only the first L positions: position i of the output takes input position L - 1 - i.
        source_index = (lengths.unsqueeze(1) - 1 - positions).clamp(min=0)  # (N, max_len)
        target = torch.gather(src, 1, source_index).masked_fill(~real, PAD)
    pad_column = torch.full((num_examples, 1), PAD, dtype=torch.long)
    tgt_in = torch.cat([torch.full((num_examples, 1), BOS, dtype=torch.long), target], dim=1)  # (N, max_len + 1)
    tgt_out = torch.cat([target, pad_column], dim=1)
    tgt_out[torch.arange(num_examples), lengths] = EOS  # EOS right after the last symbol
    return SequenceTask(src, tgt_in, tgt_out, lengths, num_symbols + NUM_SPECIAL, task)


def decode(tokens: Tensor | list[int], num_symbols: int = 10) -> str:
    """Readable text for one row of token ids: symbols as digits (letters beyond 9), stopping at EOS or PAD.

    Symbols 0-9 print as digits; with more symbols, ids print as ``<id>``. BOS is skipped.
    """
    ids = tokens.tolist() if isinstance(tokens, Tensor) else list(tokens)
    text = []
    for token in ids:
        if token in (EOS, PAD):
            break
        if token == BOS:
            continue
        symbol = token - NUM_SPECIAL
        text.append(str(symbol) if 0 <= symbol < min(num_symbols, 10) else f"<{token}>")
    return "".join(text)
