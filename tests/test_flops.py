"""Compute accounting against the paper's figures (../shared/PAPER.md)."""


import pytest
import torch

from translate.config import ModelConfig
from translate.training.flops import PAPER_COMPUTE, flops_per_target_token, matmul_peak
from translate.model import Transformer


@pytest.mark.parametrize("d_model, d_ff, heads, expected", [(512, 2048, 8, 0.38e9), (1024, 4096, 16, 1.29e9)])
def test_flops_per_target_token_match_the_papers_reading(d_model, d_ff, heads, expected):
    cfg = ModelConfig(d_model=d_model, d_ff=d_ff, heads=heads, layers=6, vocab_size=37000)
    per_token = flops_per_target_token(cfg, 28.0, 28.0)
    assert per_token == pytest.approx(expected, rel=0.06)
    with torch.device("meta"):
        parameters = Transformer(cfg).num_parameters()
    assert per_token == pytest.approx(6 * parameters, rel=0.1)  # 6 x parameters, plus attention


@pytest.mark.parametrize("d_model, hours", [(512, 12), (1024, 3.5 * 24)])
def test_paper_compute_is_the_papers_own_estimate(d_model, hours):
    """Table 2's training cost, as the paper estimates it (footnote 5): training time x 8
    GPUs x 9.5 TFLOP/s, the P100's sustained single-precision rate (12 h base, 3.5 days big)."""
    assert PAPER_COMPUTE[d_model] == pytest.approx(hours * 3600 * 8 * 9.5e12, rel=0.02)


def test_longer_sources_cost_more_per_target_token():
    cfg = ModelConfig(d_model=256, d_ff=1024, heads=4, layers=3, vocab_size=8000)
    assert flops_per_target_token(cfg, 40, 20) > flops_per_target_token(cfg, 20, 20)


def test_matmul_peak_is_measured():
    assert 1e9 < matmul_peak(torch.device("cpu"), seconds=0.2) < 1e14
