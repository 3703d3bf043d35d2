"""The CTranslate2 export (translate.formats.ctranslate2): the model computes what ours does,
token by token and sentence by sentence, on our vocabulary layout and on sentencepiece's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Tuple

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import multi30k_test, run_cli, run_dir_of
from translate.core.config import DecodeConfig
from translate.translator import Translator


@pytest.fixture(scope="module")
def exported(trained_run, tmp_path_factory) -> Tuple[Path, Path]:
    """The trained_run checkpoint exported through the CLI: (checkpoint, model folder)."""
    folder = tmp_path_factory.mktemp("export") / "ct2"
    run_cli("export", *trained_run, f"export.output={folder}", check=True)
    return run_dir_of(trained_run) / "checkpoint_last.pt", folder


def test_export_writes_a_self_contained_model(exported):
    checkpoint, folder = exported
    payload = torch.load(checkpoint, map_location="cpu", weights_only=False)
    assert (folder / "model.bin").stat().st_size > 0
    assert (folder / "sentencepiece.model").read_bytes() == payload["vocabulary"]
    pieces = json.loads((folder / "shared_vocabulary.json").read_text(encoding="utf-8"))
    assert pieces[:4] == ["<pad>", "<unk>", "<s>", "</s>"] and len(pieces) == payload["model_config"]["vocab_size"]
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    assert config["add_source_eos"] is True and config["decoder_start_token"] == "<s>"


def test_scores_equal_our_teacher_forced_log_probs(exported):
    """The exact check: every target token's log-probability, EOS included, on real pairs.
    Fails with cos/sin swapped (error ~5), pre-norm (~100) or no source EOS (~0.03)."""
    import ctranslate2

    checkpoint, folder = exported
    translator = Translator.from_checkpoint(checkpoint)
    sources, targets = multi30k_test(50)
    src_ids, tgt_ids = translator.vocabulary.to_ids(sources), translator.vocabulary.to_ids(targets)
    piece = translator.vocabulary.processor.id_to_piece
    BOS, EOS = translator.vocabulary.specials.bos, translator.vocabulary.specials.eos
    results = ctranslate2.Translator(str(folder), device="cpu", intra_threads=1).score_batch(
        [[piece(i) for i in ids] for ids in src_ids], [[piece(i) for i in ids] for ids in tgt_ids]
    )
    worst, compared = 0.0, 0
    with torch.no_grad():
        for src, tgt, result in zip(src_ids, tgt_ids, results):
            logits = translator.model(torch.tensor([src + [EOS]]), torch.tensor([[BOS] + tgt]))[0]
            ours = F.log_softmax(logits.float(), dim=-1).gather(1, torch.tensor(tgt + [EOS])[:, None])[:, 0]
            theirs = torch.tensor(result.log_probs)
            assert theirs.shape == ours.shape
            worst = max(worst, float((ours - theirs).abs().max()))
            compared += len(ours)
    assert compared > 1000
    assert worst < 1e-4, f"largest log-prob difference {worst:.2e} over {compared} tokens"


def test_greedy_translations_equal_decode(exported):
    """200 real sentences, greedy. The 30-step model mostly runs to the length cap, whose
    limit both sides share, so capped outputs are compared too (the longest agreements)."""
    from translate.formats.ctranslate2 import ctranslate2_translate

    checkpoint, folder = exported
    translator = Translator.from_checkpoint(checkpoint)
    sources, _ = multi30k_test(200)
    ours = translator.translate(sources, DecodeConfig(beam_size=1))
    theirs = ctranslate2_translate(folder, sources, DecodeConfig(beam_size=1), threads=1)
    same = sum(a == b for a, b in zip(ours, theirs))
    assert same >= 0.99 * len(sources), f"{same}/{len(sources)} identical"


def test_a_sentencepiece_default_layout_trains_decodes_averages_and_exports(foreign_run, tmp_path):
    """sentencepiece's defaults (unk 0, bos 1, eos 2, no pad): prepared, trained (foreign_run),
    decoded with the average of its last checkpoints, and exported to CTranslate2, which
    translates as we do (the added pad id never reaches sentencepiece)."""
    from translate.formats.ctranslate2 import ctranslate2_translate

    sources, _ = multi30k_test(100)
    (tmp_path / "in.en").write_text("\n".join(sources) + "\n", encoding="utf-8")
    run_cli("decode", *foreign_run, f"decode.input={tmp_path / 'in.en'}", f"decode.output={tmp_path / 'out.de'}",
            "decode.beam_size=1", check=True)
    average = run_dir_of(foreign_run) / "checkpoint_average.pt"
    translator = Translator.from_checkpoint(average)
    assert translator.vocabulary.specials.pad == len(translator.vocabulary) - 1  # added after the pieces
    decoded = (tmp_path / "out.de").read_text(encoding="utf-8").splitlines()
    assert decoded == translator.translate(sources, DecodeConfig(beam_size=1))
    folder = tmp_path / "ct2"
    run_cli("export", *foreign_run, f"export.output={folder}", check=True)
    pieces = json.loads((folder / "shared_vocabulary.json").read_text(encoding="utf-8"))
    assert pieces[:3] == ["<unk>", "<s>", "</s>"] and pieces[-1] == "<pad>"
    theirs = ctranslate2_translate(folder, sources, DecodeConfig(beam_size=1), threads=1)
    assert sum(a == b for a, b in zip(decoded, theirs)) >= 99
