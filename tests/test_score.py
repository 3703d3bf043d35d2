"""BLEU equals sacrebleu's own; mismatched files fail clearly."""

import pytest
import sacrebleu

from tests.conftest import TEXT, need, run_cli
from translate.score import corpus_bleu
from translate.errors import TranslateError


def test_bleu_equals_sacrebleu_on_real_text():
    need(TEXT)
    refs = (TEXT / "newstest2013.de").read_text(encoding="utf-8").splitlines()[:300]
    # A "system" that drops every fifth word: a real, imperfect hypothesis.
    hyps = [" ".join(w for i, w in enumerate(r.split()) if i % 5 != 4) for r in refs]
    score, signature = corpus_bleu(hyps, refs)
    expected = sacrebleu.corpus_bleu(hyps, [refs])
    assert score.score == pytest.approx(expected.score, abs=1e-9)
    assert 20 < score.score < 90
    assert "tok:13a" in str(signature)


def test_bleu_verb_on_files(tmp_path):
    need(TEXT)
    refs = (TEXT / "newstest2013.en").read_text(encoding="utf-8").splitlines()[:100]
    hyps = [r.lower() for r in refs]
    (tmp_path / "hyp").write_text("\n".join(hyps) + "\n", encoding="utf-8")
    (tmp_path / "ref").write_text("\n".join(refs) + "\n", encoding="utf-8")
    result = run_cli("bleu", f"bleu.hyp={tmp_path}/hyp", f"bleu.ref={tmp_path}/ref", f"run_dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    expected = sacrebleu.corpus_bleu(hyps, [refs]).score
    assert f"sacreBLEU {expected:.2f}" in result.stdout


def test_mismatched_line_counts(tmp_path):
    (tmp_path / "hyp").write_text("a\nb\n")
    (tmp_path / "ref").write_text("a\n")
    result = run_cli("bleu", f"bleu.hyp={tmp_path}/hyp", f"bleu.ref={tmp_path}/ref", f"run_dir={tmp_path}")
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0 and "2 lines but" in result.stderr
    with pytest.raises(TranslateError):
        corpus_bleu(["a", "b"], ["a"])
