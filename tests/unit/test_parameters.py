"""Parameter counts: shared parameters once, the closed form, and the paper's base and big models."""

import pytest
import torch
from torch import nn

from attention_course import PAPER_CONFIGS, Transformer, count_parameters, transformer_parameter_count


def _paper_model(name, **kwargs):
    config = PAPER_CONFIGS[name]
    with torch.device("meta"):  # shapes only: building the big model costs no memory
        return Transformer(
            config["vocab_size"], config["vocab_size"], d_model=config["d_model"], num_heads=config["num_heads"],
            num_encoder_layers=config["num_layers"], num_decoder_layers=config["num_layers"],
            d_ff=config["d_ff"], dropout=config["dropout"], tie_embeddings=True, **kwargs,
        )


def test_count_parameters_counts_shared_parameters_once():
    shared = nn.Linear(4, 3)
    model = nn.Sequential(shared, nn.ReLU(), nn.Linear(3, 4))
    model[2].weight = nn.Parameter(shared.weight.detach().T.clone())
    assert count_parameters(model) == 12 + 3 + 12 + 4
    model.append(shared)  # the same module twice
    assert count_parameters(model) == 12 + 3 + 12 + 4
    model[0].bias.requires_grad_(False)
    assert count_parameters(model, trainable_only=True) == 12 + 12 + 4


@pytest.mark.parametrize("name", ["base", "big"])
@pytest.mark.parametrize("final_norm", [False, True])
def test_paper_models_match_the_closed_form_and_the_reported_size(name, final_norm):
    config = PAPER_CONFIGS[name]
    model = _paper_model(name, final_norm=final_norm)
    count = count_parameters(model)
    closed_form = transformer_parameter_count(
        config["vocab_size"], config["d_model"], config["d_ff"], config["num_layers"], final_norms=final_norm
    )
    assert count == closed_form
    # the paper's own rows are not mutually consistent, so within 5% is what can be claimed
    assert abs(count - config["reported_parameters"]) / config["reported_parameters"] < 0.05


def test_closed_form_agrees_with_nn_transformer():
    # an independent implementation: nn.Transformer's body plus one shared embedding matrix
    with torch.device("meta"):
        body = nn.Transformer(512, 8, 6, 6, 2048, batch_first=True)
    vocab = 37000
    assert count_parameters(body) + vocab * 512 == transformer_parameter_count(vocab, 512, 2048, 6, final_norms=True)
    assert transformer_parameter_count(vocab, 512, 2048, 6, final_norms=True) == 63_084_544  # errata §2.1 table


def test_untied_and_asymmetric_models_match_the_closed_form():
    with torch.device("meta"):
        model = Transformer(101, 77, d_model=32, num_heads=4, num_encoder_layers=3, num_decoder_layers=2, d_ff=48)
    expected = transformer_parameter_count(101, 32, 48, 3, num_decoder_layers=2, tgt_vocab_size=77,
                                           tie_embeddings=False)
    assert count_parameters(model) == expected
    # tying removes two of the three matrices and the output bias
    untied = transformer_parameter_count(50, 32, 48, 2, tie_embeddings=False)
    assert untied - transformer_parameter_count(50, 32, 48, 2) == 2 * 50 * 32 + 50


def test_heads_do_not_change_the_count():
    with torch.device("meta"):
        counts = {h: count_parameters(Transformer(10, 10, d_model=64, num_heads=h, num_encoder_layers=1,
                                                  num_decoder_layers=1, d_ff=64)) for h in (1, 4, 16)}
    assert len(set(counts.values())) == 1
