"""Loading real corpora (translate.data.loading): the hub layout, plain text by prefix, and
files that are misaligned, not UTF-8 or missing, named in one line."""

import pytest

from tests.conftest import MULTI30K, TEXT, WMT14_MINI, need
from translate.core.errors import TranslateError
from translate.data.loading import load_corpus


def test_local_wmt14_folder_takes_the_hub_path(compose):
    need(WMT14_MINI)
    cfg = compose("train", "config=base", f"data.path={WMT14_MINI}")
    test = load_corpus(cfg.data, "test")
    assert len(test) == 3003  # newstest2014, full
    sources, targets = test.pairs()
    assert sources[0] == "Gutach: Increased safety for pedestrians"
    assert targets[0] == "Gutach: Noch mehr Sicherheit für Fußgänger"
    assert len(load_corpus(cfg.data, "validation")) == 3000  # newstest2013


def test_multi30k_group_finds_the_local_copy(compose):
    need(MULTI30K)
    cfg = compose("train", "config=tiny")
    assert cfg.data.name == "de-en" and cfg.data.path.endswith("multi30k")
    assert len(load_corpus(cfg.data, "test")) == 1000


def test_plain_text_by_prefix(compose):
    need(TEXT)
    cfg = compose("train", "data=text", f"data.train={TEXT}/newstest2013", f"data.test={TEXT}/newstest2014-full.en-de")
    train = load_corpus(cfg.data, "train")
    assert len(train) == 3000
    assert len(load_corpus(cfg.data, "test")) == 3003
    src, tgt = next(train.chunks(5))
    assert len(src) == len(tgt) == 5 and all(isinstance(s, str) and s for s in src)


def test_lowercase_lowers_both_sides_of_every_split(compose, tmp_path):
    """data.lowercase (the Multi30k literature's training text): str.lower on both sides, the
    split's description says so, and the fingerprint differs from the cased corpus's."""
    (tmp_path / "c.en").write_text("A Dog RUNS.\nÄpfel\n")
    (tmp_path / "c.de").write_text("Ein Hund LÄUFT.\nSTRAẞE\n")
    cased = load_corpus(compose("train", "data=text", f"data.train={tmp_path}/c").data, "train")
    lowered = load_corpus(compose("train", "data=text", f"data.train={tmp_path}/c", f"data.test={tmp_path}/c",
                                  "data.lowercase=true").data, "test")
    assert lowered.pairs() == (["a dog runs.", "äpfel"], ["ein hund läuft.", "straße"])
    assert cased.pairs()[0] == ["A Dog RUNS.", "Äpfel"]
    assert lowered.description.endswith("lowercased") and len(lowered) == 2
    assert lowered.fingerprint() != cased.fingerprint()


def test_misaligned_text_names_both_files(compose, tmp_path):
    (tmp_path / "c.en").write_text("a\nb\nc\n")
    (tmp_path / "c.de").write_text("x\ny\n")
    cfg = compose("train", "data=text", f"data.train={tmp_path}/c")
    with pytest.raises(TranslateError, match=r"misaligned corpus: .*c\.en has 3 lines but .*c\.de has 2"):
        load_corpus(cfg.data, "train")


def test_invalid_utf8_names_file_and_line(compose, tmp_path):
    (tmp_path / "c.en").write_bytes(b"good\nbad \xff\n")
    (tmp_path / "c.de").write_bytes(b"gut\nschlecht\n")
    cfg = compose("train", "data=text", f"data.train={tmp_path}/c")
    with pytest.raises(TranslateError, match=r"c\.en:2: invalid UTF-8"):
        load_corpus(cfg.data, "train").pairs()


def test_missing_path_and_split(compose, tmp_path):
    cfg = compose("train", f"data.path={tmp_path}/nowhere")
    with pytest.raises(TranslateError, match="missing data path"):
        load_corpus(cfg.data, "train")
    need(MULTI30K)
    cfg = compose("train", "config=tiny")
    with pytest.raises(TranslateError, match="no split 'nope'"):
        load_corpus(cfg.data, "nope")
