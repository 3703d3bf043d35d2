"""Mixed precision (translate.core.precision): bf16 and fp16 training on the CPU."""

import numpy as np
import pytest
import torch

from tests.conftest import MULTI30K, need, run_cli, small_run


@pytest.mark.parametrize("precision", ["bf16", pytest.param("fp16", marks=pytest.mark.slow)])  # fp16 on a CPU: make test-slow
def test_reduced_precision_runs_on_cpu(tmp_path, precision):
    need(MULTI30K)
    result = run_cli("train", *small_run(tmp_path, "train.max_steps=4", "train.log_every=2", f"train.precision={precision}"))
    assert result.returncode == 0, result.stderr
    assert f"{precision} on cpu" in result.stderr
    losses = [float(line.split("loss ")[1].split()[0]) for line in result.stderr.splitlines() if "] - update " in line]
    assert len(losses) == 2 and all(np.isfinite(losses))
    payload = torch.load(tmp_path / "run" / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert all(torch.isfinite(t).all() for t in payload["model"].values())
    assert ("scaler" in payload) == (precision == "fp16")


def test_native_bf16_is_read_from_the_cpu_flags(monkeypatch):
    from translate.core import precision

    def cpuinfo(flags):
        monkeypatch.setattr(precision.platform, "system", lambda: "Linux")
        monkeypatch.setattr(precision.Path, "read_text", lambda self: f"processor\t: 0\nflags\t\t: {flags}\n")
        precision.native_bf16.cache_clear()
        return precision.native_bf16()

    try:
        assert cpuinfo("fpu sse avx2 avx512f avx512_bf16") and cpuinfo("avx512f amx_tile amx_bf16")
        assert not cpuinfo("fpu sse avx2 avx512f avx512bw")  # AVX-512 alone emulates bf16
        for cap, native in [("AVX2", False), ("avx512_core", False), ("AVX512_CORE_BF16", True), ("AVX512_CORE_AMX", True), ("ALL", True)]:
            monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)  # the brief's way to force a CPU down to AVX2
            assert cpuinfo("avx512f avx512_bf16 amx_bf16") == native, cap
    finally:
        precision.native_bf16.cache_clear()


def test_cpu_family_and_model_are_read_from_cpuinfo(monkeypatch):
    """"family F model M" from their own lines, not from "model name"; "" where either is missing."""
    from translate.core import precision

    text = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel name\t: AMD EPYC\nmodel\t\t: 2\n"
    monkeypatch.setattr(precision.Path, "read_text", lambda self: text)
    assert precision.cpu_family_model() == "family 26 model 2"
    monkeypatch.setattr(precision.Path, "read_text", lambda self: "processor\t: 0\nmodel name\t: AMD EPYC\n")
    assert precision.cpu_family_model() == ""


@pytest.mark.parametrize("native", [True, False])
def test_auto_picks_bf16_on_cpus_that_have_it(monkeypatch, native):
    from translate.core import precision
    from translate.core.choices import Precision

    monkeypatch.setattr(precision, "native_bf16", lambda: native)
    chosen = precision.MixedPrecision.on(Precision.auto, torch.device("cpu"))
    assert chosen.precision == (Precision.bf16 if native else Precision.fp32)
    assert chosen.peak_dtype() == (torch.bfloat16 if native else torch.float32)  # the MFU's peak
    assert precision.MixedPrecision.on(Precision.fp32, torch.device("cpu")).autocast is None


@pytest.mark.parametrize("causal", [False, True])
def test_bf16_attention_on_cpu_matches_fp32_and_the_fused_kernel(causal):
    """The written-out bf16 path (translate.attention.attend) against torch's fused kernel in fp32
    (the reference) and in bf16 (what it replaces), values and gradients. bf16 keeps 8 bits of
    mantissa: within 2e-2 of fp32 on unit-scale inputs."""
    import torch.nn.functional as F

    from translate.attention import attend

    torch.manual_seed(0)
    q, k, v = (torch.randn(3, 4, 7, 16) for _ in range(3))
    mask = None if causal else torch.rand(3, 1, 1, 7) > 0.3
    if mask is not None:
        mask[..., 0] = True  # every query sees a key
    grads = {}
    for name, dtype, run in (("fp32", torch.float32, F.scaled_dot_product_attention),
                             ("fused bf16", torch.bfloat16, F.scaled_dot_product_attention),
                             ("ours bf16", torch.bfloat16, None)):
        inputs = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        if run is None:
            out = attend(*inputs, mask, causal=causal)
        else:
            out = run(*inputs, attn_mask=mask, is_causal=causal and mask is None)
        assert out.dtype == dtype
        out.float().square().sum().backward()
        grads[name] = (out.float(), *(t.grad.float() for t in inputs))
    for got, fused, reference in zip(grads["ours bf16"], grads["fused bf16"], grads["fp32"]):
        scale = reference.abs().max()
        assert (got - reference).abs().max() <= 2e-2 * scale
        assert (got - fused).abs().max() <= 2e-2 * scale


def test_bf16_training_loss_matches_fp32():
    """One model's label-smoothed loss and gradients under CPU bf16 autocast against fp32:
    the loss within 1%, the gradients' direction within a cosine of 0.99."""
    from translate.core.config import ModelConfig
    from translate.model import Transformer
    from translate.training.loss import LabelSmoothedObjective

    torch.manual_seed(0)
    model = Transformer(ModelConfig(layers=2, d_model=64, d_ff=128, heads=4, vocab_size=300, dropout=0.0))
    objective = LabelSmoothedObjective(model, 0.1)
    src, tgt = torch.randint(4, 300, (6, 11)), torch.randint(4, 300, (6, 9))
    select, target = torch.arange(54), tgt.flatten()
    results = []
    for autocast in (None, torch.autocast("cpu", dtype=torch.bfloat16)):
        model.zero_grad()
        with autocast or torch.autocast("cpu", enabled=False):
            loss, _ = objective(src, tgt, select, target)
        loss.backward()
        results.append((loss.item(), torch.cat([p.grad.flatten() for p in model.parameters()])))
    (loss32, grad32), (loss16, grad16) = results
    assert abs(loss16 - loss32) <= 0.01 * loss32
    assert torch.nn.functional.cosine_similarity(grad16, grad32, dim=0) > 0.99


@pytest.mark.slow  # make test-slow, to keep the default suite under 10 minutes: fp32's exact resume is in the default suite
def test_bf16_runs_resume_bit_for_bit(tmp_path):
    """Interrupted at update 5 and resumed, a bf16 run ends bit for bit where an uninterrupted one does."""
    from tests.conftest import train_resumable
    from translate import checkpoint

    need(MULTI30K)
    straight = train_resumable(tmp_path, "straight", "train.max_steps=8", "train.precision=bf16")
    first = train_resumable(tmp_path, "resumed", "train.max_steps=5", "train.precision=bf16")
    second = train_resumable(tmp_path, "resumed", "train.max_steps=8", "train.precision=bf16")
    assert straight.returncode == first.returncode == second.returncode == 0, second.stderr
    assert "resuming from" in second.stderr
    a, b = (checkpoint.load(tmp_path / folder / "checkpoint_last.pt") for folder in ("straight", "resumed"))
    assert a["step"] == b["step"] == 8
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
    assert a["optimizer"]["state"][0]["exp_avg"].equal(b["optimizer"]["state"][0]["exp_avg"])
