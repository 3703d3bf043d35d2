"""Compute accounting (translate.training.flops) against the paper's figures (../shared/PAPER.md),
the products a real training step runs (counted by torch), and a hand-timed matrix product."""

import json
import re
import time

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from tests.conftest import SHARED_DATA, need
from translate.core.config import ModelConfig
from translate.model import Transformer
from translate.training.flops import PAPER_COMPUTE, flops_per_target_token, matmul_peak


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
    # The reference: Table 2's figure as ../shared/PAPER.md copies it, for this row.
    paper = need(SHARED_DATA.parent / "PAPER.md").read_text(encoding="utf-8")
    row = {512: "Transformer (base)", 1024: "Transformer (big)"}[d_model]
    (figure,) = re.findall(rf"^\| {re.escape(row)} \|.*\| ([0-9.]+e[0-9]+) \|$", paper, flags=re.MULTILINE)
    assert PAPER_COMPUTE[d_model] == float(figure)


def counted_training_flops(cfg: ModelConfig, sentences: int, src_len: int, tgt_len: int) -> float:
    """FLOPs of one forward and backward pass of a model of `cfg` on a batch of sentences of
    these lengths (no padding), counted operator by operator by torch's FlopCounterMode. The
    attention runs on its plain kernel, whose matrix products the counter sees."""
    torch.manual_seed(0)
    model = Transformer(cfg)
    src = torch.randint(4, cfg.vocab_size, (sentences, src_len))
    tgt = torch.randint(4, cfg.vocab_size, (sentences, tgt_len))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(src, tgt).sum().backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("src_len, tgt_len", [
    (12, 12),
    (20, 20),
    (20, 10),
], ids=["S12-T12", "S20-T20", "S20-T10"])
@pytest.mark.parametrize("shape", [dict(d_model=64, d_ff=256, heads=4, layers=2),
                                   dict(d_model=32, d_ff=64, heads=2, layers=1, d_k=8, d_v=24)],  # Table 3 row B
                         ids=["2-layer", "1-layer-d_k-8-d_v-24"])
def test_flops_per_target_token_equal_the_flops_a_training_step_runs(shape, src_len, tgt_len):
    """Every matrix product of a real forward and backward pass, counted by torch, per target
    token: the formula's count exactly (to 1e-6), once the masked half of the decoder's causal
    square is added, which the plain kernel computes and the formula leaves out (T/2 of T)."""
    cfg = ModelConfig(**shape, vocab_size=512, dropout=0.0)  # 512: no padding rows
    sentences = 3
    counted = counted_training_flops(cfg, sentences, src_len, tgt_len) / (sentences * tgt_len)
    masked_half = 6 * cfg.layers * cfg.heads * (cfg.key_width + cfg.value_width) * tgt_len / 2
    assert flops_per_target_token(cfg, src_len, tgt_len) + masked_half == pytest.approx(counted, rel=1e-6)


def test_longer_sources_cost_more_per_target_token():
    cfg = ModelConfig(d_model=256, d_ff=1024, heads=4, layers=3, vocab_size=8000)
    assert flops_per_target_token(cfg, 40, 20) > flops_per_target_token(cfg, 20, 20)


def test_matmul_peak_is_of_the_dtype_asked_for():
    """float64 products run at about half float32's rate on CPUs (half the lanes of a vector):
    a peak that timed float32 whatever it was asked would measure about the same for both. (Its
    rate against the FLOPs it ran: the test below.)"""
    peaks = {torch.float32: [], torch.float64: []}
    for _ in range(3):  # interleaved, the best of each: another process slows one round, not all
        for dtype, found in peaks.items():
            found.append(matmul_peak(torch.device("cpu"), dtype=dtype, seconds=0.2))
    single, double = max(peaks[torch.float32]), max(peaks[torch.float64])
    assert single > 1.3 * double, peaks


def test_matmul_peak_is_at_least_the_rate_of_the_whole_call_and_at_most_twice_it():
    """The reference: the FLOPs of every product matmul_peak runs (on one thread), counted by
    torch's FlopCounterMode, over the wall time of the whole call, timed here. Its peak per
    thread is its best window's rate, so at least that; its warm-up (one window of seventeen)
    and set-up (two random matrices) are less than half the call, so at most twice that. The
    threads torch runs are restored."""
    threads = torch.get_num_threads()
    with FlopCounterMode(display=False):  # the counter's first use costs time of its own
        torch.ones(2, 2) @ torch.ones(2, 2)
    with FlopCounterMode(display=False) as counter:
        started = time.perf_counter()
        peak = matmul_peak(torch.device("cpu"), seconds=0.5)
        took = time.perf_counter() - started
    timed = counter.get_total_flops() / took
    assert 1.0 <= peak / threads / timed < 2.0, (peak, threads, timed)
    assert torch.get_num_threads() == threads


def test_matmul_peak_is_the_best_window_after_a_warm_up(monkeypatch):
    """The warm-up's rate is never the peak, however fast; of the timed windows, the best is
    (a window slowed by another process, or by the kernel's first calls, is passed over); on a
    CPU, one thread's, times the threads torch runs."""
    from translate.training import flops

    windows = iter([(50, 0.1), (2, 0.4), (4, 0.4), (3, 0.4), (1, 0.4)])  # (products, seconds); the first warms up
    threads = []
    monkeypatch.setattr(flops, "_products_for", lambda a, b, seconds: (threads.append(torch.get_num_threads()), next(windows))[1])
    per_product = 2 * 64**3
    peak = flops.matmul_peak(torch.device("cpu"), seconds=0.01, windows=4, size=64)
    assert peak == pytest.approx(torch.get_num_threads() * 4 * per_product / 0.4)
    assert threads == [1] * 5


def test_the_peak_says_what_it_is():
    """The log line's MFU names its peak: its rate (all processes) and the dtype it timed."""
    from translate.training.flops import Accounting

    accounting = Accounting(1e9, 0.42e12, None, torch.device("cpu"), peak_dtype=torch.bfloat16)
    assert accounting.peak_label() == "0.42 TFLOP/s bf16 peak"
    assert Accounting(1e9, 1.5e11, None, torch.device("cpu")).peak_label() == "0.15 TFLOP/s fp32 peak"


def test_the_peak_is_the_best_this_machine_has_shown(tmp_path, monkeypatch):
    """Each start-up's measurement joins the record of its machine, instructions, dtype and
    threads: a slow start-up takes the best one before it; another dtype or a narrower
    instruction set is a peak of its own; an unreadable record leaves the measurement alone."""
    from translate.training.flops import machine_peak

    record, cpu = tmp_path / "cache" / "translate" / "peaks.json", torch.device("cpu")  # its folder made on first use
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    assert machine_peak(cpu, torch.float32, 2.0e11, record) == (2.0e11, 1)
    assert machine_peak(cpu, torch.float32, 1.7e11, record) == (2.0e11, 2)  # a slow spell is passed over
    assert machine_peak(cpu, torch.float32, 2.1e11, record) == (2.1e11, 3)
    assert machine_peak(cpu, torch.bfloat16, 4.0e11, record) == (4.0e11, 1)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert machine_peak(cpu, torch.float32, 1.5e11, record) == (1.5e11, 1)
    assert len(json.loads(record.read_text())) == 3
    record.write_text("{not json")
    assert machine_peak(cpu, torch.float32, 1.6e11, record) == (1.6e11, 1)
    assert record.read_text() == "{not json"  # left for the user to look at


def test_the_label_says_how_many_start_ups_the_peak_is_the_best_of():
    from translate.training.flops import Accounting

    accounting = Accounting(1e9, 0.2e12, None, torch.device("cpu"), peak_start_ups=3)
    assert accounting.peak_label() == "0.20 TFLOP/s fp32 peak (best of 3 start-ups)"
