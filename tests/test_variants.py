"""The paper's Table 3 variants and pre-norm through the whole tool: train, resume, decode and
export, from the command line (options combined, to keep the suite short)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import MULTI30K, multi30k_test, need, one_line_error, run_cli, small_run
from translate import checkpoint
from translate.translator import Translator


def train_resume_decode(tmp_path: Path, *options: str):
    """Three updates, a resume to five, then a decode of real sentences: the overrides used."""
    need(MULTI30K)
    overrides = small_run(tmp_path, *options, "checkpoint.average_last=0")
    run_cli("train", *overrides, "train.max_steps=3", check=True)
    resumed = run_cli("train", *overrides, "train.max_steps=5", check=True)
    assert "resuming from" in resumed.stderr
    sources = tmp_path / "some.en"
    sources.write_text("\n".join(multi30k_test(5)[0]) + "\n", encoding="utf-8")
    run_cli("decode", *overrides, f"decode.input={sources}", f"decode.output={tmp_path}/some.de", "decode.max_len_b=5",
            check=True)
    assert len((tmp_path / "some.de").read_text(encoding="utf-8").splitlines()) == 5
    return overrides


@pytest.mark.slow  # make test-slow: it keeps the default suite under 10 minutes
def test_pre_norm_with_learned_positions_trains_resumes_decodes_and_exports(tmp_path):
    """The checkpoint records the options; the CTranslate2 export (pre-norm, the learned
    table) scores every target token as our model does."""
    import ctranslate2

    overrides = train_resume_decode(tmp_path, "model.norm=pre", "model.positions=learned")
    payload = checkpoint.load(tmp_path / "run" / "checkpoint_last.pt")
    assert payload["step"] == 5 and payload["model_config"]["norm"] == "pre"
    assert payload["model_config"]["positions"] == "learned" and payload["model_config"]["max_positions"] == 1076
    assert "decoder_norm.weight" in payload["model"] and "positional_encoding.table.weight" in payload["model"]
    run_cli("export", *overrides, f"export.output={tmp_path}/ct2", check=True)
    translator = Translator.from_checkpoint(tmp_path / "run" / "checkpoint_last.pt")
    sources, targets = multi30k_test(20)
    src_ids, tgt_ids = translator.vocabulary.to_ids(sources), translator.vocabulary.to_ids(targets)
    piece = translator.vocabulary.processor.id_to_piece
    BOS, EOS = translator.vocabulary.specials.bos, translator.vocabulary.specials.eos
    results = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=1).score_batch(
        [[piece(i) for i in ids] for ids in src_ids], [[piece(i) for i in ids] for ids in tgt_ids])
    worst = 0.0
    with torch.no_grad():
        for src, tgt, result in zip(src_ids, tgt_ids, results):
            logits = translator.model(torch.tensor([src + [EOS]]), torch.tensor([[BOS] + tgt]))[0]
            ours = F.log_softmax(logits.float(), dim=-1).gather(1, torch.tensor(tgt + [EOS])[:, None])[:, 0]
            worst = max(worst, float((ours - torch.tensor(result.log_probs)).abs().max()))
    assert worst < 1e-4


@pytest.mark.slow  # make test-slow: it keeps the default suite under 10 minutes
def test_per_head_widths_train_resume_decode_and_refuse_an_export_that_cannot_hold_them(tmp_path):
    """Row B's shape (d_k apart from d_model / heads, d_v apart from d_k): CTranslate2 splits
    d_model evenly among heads, so its export says which option it cannot express."""
    overrides = train_resume_decode(tmp_path, "model.d_k=8", "model.d_v=24")
    payload = checkpoint.load(tmp_path / "run" / "checkpoint_last.pt")
    assert (payload["model_config"]["d_k"], payload["model_config"]["d_v"]) == (8, 24)
    assert payload["model"]["encoder_layers.0.self_attn.qkv_proj.weight"].shape == (2 * (8 + 8 + 24), 32)
    one_line_error(run_cli("export", *overrides, f"export.output={tmp_path}/ct2"), "cannot express model.d_k=8")
