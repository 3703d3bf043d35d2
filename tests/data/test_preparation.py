"""The prepare verb (translate.data.preparation): the cache's fingerprint, cleaning and its counts,
a given sentencepiece model, the data report, and splits that are empty or lack a side."""

import pytest

from tests.conftest import TEXT, corpus_with_noise, need, run_cli, write_pairs
from translate.core.errors import TranslateError
from translate.data.loading import load_corpus
from translate.data.preparation import fingerprint, prepare
from translate.data import report


def test_fingerprint_follows_data_and_vocabulary_settings(compose, tmp_path):
    (tmp_path / "c.en").write_text("a b\nc d\n")
    (tmp_path / "c.de").write_text("x y\nz w\n")
    base = compose("train", "data=text", f"data.train={tmp_path}/c")
    corpus = load_corpus(base.data, "train")
    key = fingerprint(base.data, corpus, None)
    assert fingerprint(base.data, load_corpus(base.data, "train"), None) == key
    assert fingerprint(compose("train", "data=text", f"data.train={tmp_path}/c", "data.vocab_size=100").data, corpus, None) != key
    assert fingerprint(compose("train", "data=text", f"data.train={tmp_path}/c", "data.max_length=10").data, corpus, None) != key
    assert fingerprint(compose("train", "data=text", f"data.train={tmp_path}/c", "train.seed=5").data, corpus, None) == key
    lowercased = compose("train", "data=text", f"data.train={tmp_path}/c", "data.lowercase=true").data
    assert fingerprint(lowercased, load_corpus(lowercased, "train"), None) != key
    (tmp_path / "c.de").write_text("x y\nz w v\n")
    assert fingerprint(base.data, load_corpus(base.data, "train"), None) != key


def test_cleaning_counts_each_reason_and_spares_test_sets(compose, tmp_path):
    pairs = corpus_with_noise(tmp_path)
    cfg = compose("train", "data=text", f"data.train={tmp_path}/train", f"data.test={tmp_path}/test",
                  "data.vocab_size=500", "data.max_length=100", "data.max_length_ratio=5")
    data = prepare(cfg.data, log=lambda _: None)
    train = data.report.train
    assert (train.pairs, train.empty, train.too_long, train.ratio) == (len(pairs) + 3, 1, 1, 1)
    assert train.kept == len(data.train) == len(pairs)
    assert data.report.test_overlap == report.TestOverlap(sentences=20, source=20, target=20)
    assert 0.99 < data.report.coverage <= 1.0
    assert train.tokens_src == int(data.train.src_offsets[-1])
    # Test sets keep every line, however noisy: decode reads them whole.
    write_pairs(tmp_path, "test", [("", "Ein Hund.")] + pairs[:3])
    assert len(load_corpus(cfg.data, "test")) == 4


def test_an_existing_sentencepiece_model_wins_over_vocab_size(compose, tmp_path):
    corpus_with_noise(tmp_path)
    first = compose("train", "data=text", f"data.train={tmp_path}/train", "data.vocab_size=300")
    built = prepare(first.data, log=lambda _: None)
    model = tmp_path / "given.model"
    model.write_bytes(built.vocabulary.model_bytes)
    given = compose("train", "data=text", f"data.train={tmp_path}/train", f"data.spm_model={model}", "data.vocab_size=999")
    reused = prepare(given.data, log=lambda _: None)
    assert reused.vocabulary.model_bytes == built.vocabulary.model_bytes and len(reused.vocabulary) <= 300
    assert reused.folder != built.folder
    other = compose("train", "data=text", f"data.train={tmp_path}/train", f"data.spm_model={model}", "data.vocab_size=5")
    assert fingerprint(other.data, load_corpus(other.data, "train"), None) == reused.folder.name
    missing = compose("train", "data=text", f"data.train={tmp_path}/train", f"data.spm_model={tmp_path}/none.model")
    with pytest.raises(TranslateError, match="missing sentencepiece model"):
        prepare(missing.data, log=lambda _: None)


def test_prepare_verb_writes_the_report(tmp_path):
    corpus_with_noise(tmp_path)
    result = run_cli("prepare", "data=text", f"data.train={tmp_path}/train", "data.vocab_size=300",
                     f"data.cache_dir={tmp_path}/cache", f"run_dir={tmp_path}/run")
    assert result.returncode == 0, result.stderr
    assert "kept" in result.stdout and (tmp_path / "run" / "data_report.json").is_file()


def write_parquet(folder, split, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"translation": rows}), folder / f"{split}-00000-of-00001.parquet")


def test_hub_rows_with_a_missing_side_are_counted_as_dropped(compose, tmp_path):
    need(TEXT)
    en = (TEXT / "newstest2012.en").read_text(encoding="utf-8").splitlines()[:300]
    de = (TEXT / "newstest2012.de").read_text(encoding="utf-8").splitlines()[:300]
    rows = [{"en": e, "de": d} for e, d in zip(en, de)]
    rows[5] = {"en": en[5], "de": None}
    rows[9] = {"en": None, "de": de[9]}
    write_parquet(tmp_path / "hub", "train", rows)
    cfg = compose("train", f"data.path={tmp_path}/hub", "data.name=null", "data.vocab_size=300", "data.max_length_ratio=0")
    data = prepare(cfg.data, log=lambda _: None)
    assert data.report.train.empty == 2 and len(data.train) == 298


def test_an_empty_split_is_a_clear_error(compose, tmp_path):
    (tmp_path / "c.en").write_text("")
    (tmp_path / "c.de").write_text("")
    cfg = compose("train", "data=text", f"data.train={tmp_path}/c")
    with pytest.raises(TranslateError, match=r"c\.\{en,de\} is empty"):
        prepare(cfg.data, log=lambda _: None)
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "hub").mkdir()
    schema = pa.schema([("translation", pa.struct([("de", pa.string()), ("en", pa.string())]))])
    pq.write_table(pa.Table.from_pylist([], schema=schema), tmp_path / "hub" / "train-00000-of-00001.parquet")
    cfg = compose("train", f"data.path={tmp_path}/hub", "data.name=null")
    with pytest.raises(TranslateError, match=r"(cannot load dataset '.*hub'|is empty)"):
        prepare(cfg.data, log=lambda _: None)
