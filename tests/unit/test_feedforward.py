"""The position-wise feed-forward network."""

import torch
from torch import nn

from attention_course import PositionwiseFeedForward


def test_equals_a_kernel_size_1_convolution():
    torch.manual_seed(0)
    ffn = PositionwiseFeedForward(8, 32).double()
    conv1 = nn.Conv1d(8, 32, kernel_size=1).double()
    conv2 = nn.Conv1d(32, 8, kernel_size=1).double()
    with torch.no_grad():
        conv1.weight.copy_(ffn.linear1.weight.unsqueeze(-1))
        conv1.bias.copy_(ffn.linear1.bias)
        conv2.weight.copy_(ffn.linear2.weight.unsqueeze(-1))
        conv2.bias.copy_(ffn.linear2.bias)
    x = torch.randn(3, 10, 8, dtype=torch.float64)  # (B, L, d_model)
    conv_out = conv2(torch.relu(conv1(x.transpose(1, 2)))).transpose(1, 2)  # Conv1d wants (B, C, L)
    torch.testing.assert_close(ffn(x), conv_out, rtol=0, atol=1e-12)


def test_is_position_wise():
    torch.manual_seed(0)
    ffn = PositionwiseFeedForward(8, 16).double()
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    changed = x.clone()
    changed[:, 2] += 1.0
    difference = (ffn(changed) - ffn(x)).abs().amax(dim=(0, 2))
    assert difference[2] > 0 and (difference[torch.arange(6) != 2] == 0).all()
    # same weights at every position: a single token gives the same result alone or inside a sequence
    torch.testing.assert_close(ffn(x[:, 4:5]), ffn(x)[:, 4:5], rtol=0, atol=1e-14)


def test_matches_torch_encoder_layer_block():
    torch.manual_seed(0)
    reference = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, dtype=torch.float64)
    ffn = PositionwiseFeedForward(8, 16).double()
    with torch.no_grad():
        for ours, theirs in ((ffn.linear1, reference.linear1), (ffn.linear2, reference.linear2)):
            ours.weight.copy_(theirs.weight)
            ours.bias.copy_(theirs.bias)
    x = torch.randn(4, 8, dtype=torch.float64)
    torch.testing.assert_close(ffn(x), reference._ff_block(x), rtol=0, atol=1e-12)
    assert ffn.linear1.out_features == 16 and ffn.linear2.out_features == 8
