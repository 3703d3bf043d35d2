"""Loading real corpora (hub layout and plain text), the vocabulary, and the token cache."""

import numpy as np
import pytest

from tests.conftest import MULTI30K, TEXT, WMT14_MINI, need
from translate.data.prepare import fingerprint, prepare
from translate.data.loading import load_corpus
from translate.data.vocabulary import OUR_LAYOUT, Vocabulary
from translate.errors import TranslateError


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


def test_vocabulary_round_trips_and_has_fixed_special_ids():
    sentences = [f"A man number {i} is riding a red bicycle down the street." for i in range(200)]
    vocabulary = Vocabulary.train(sentences, vocab_size=120)
    assert vocabulary.specials == OUR_LAYOUT and len(vocabulary) == vocabulary.piece_count  # nothing added
    assert (vocabulary.processor.pad_id(), vocabulary.processor.eos_id()) == (OUR_LAYOUT.pad, OUR_LAYOUT.eos)
    ids = vocabulary.encode(["A man is riding a bicycle."])
    assert vocabulary.decode(ids) == ["A man is riding a bicycle."]
    assert Vocabulary(vocabulary.model_bytes).encode(["red street"]) == vocabulary.encode(["red street"])


def test_cache_round_trips_and_is_reused(compose):
    need(MULTI30K)
    cfg = compose("train", "config=tiny", "data.train_split=validation", "data.vocab_size=500")
    logs = []
    data = prepare(cfg.data, log=logs.append)
    assert "preparing" in logs[0]
    sources, targets = load_corpus(cfg.data, "validation").pairs()
    assert len(data.train) == len(sources) == 1014
    decoded = data.vocabulary.decode([data.train.source(i).tolist() for i in range(20)])
    assert decoded == [" ".join(s.split()) for s in sources[:20]]
    assert data.vocabulary.decode([data.train.target(7).tolist()]) == [" ".join(targets[7].split())]
    again = prepare(cfg.data, log=logs.append)
    assert "using cached corpus" in logs[-1] and again.folder == data.folder
    assert np.array_equal(np.asarray(again.train.src_tokens), np.asarray(data.train.src_tokens))


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
    (tmp_path / "c.de").write_text("x y\nz w v\n")
    assert fingerprint(base.data, load_corpus(base.data, "train"), None) != key


def test_interrupted_preparation_leaves_no_trusted_cache(compose, monkeypatch):
    need(MULTI30K)
    cfg = compose("train", "config=tiny", "data.train_split=validation", "data.vocab_size=500")
    import translate.data.prepare as cache

    def explode(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cache, "_encode", explode)
    with pytest.raises(KeyboardInterrupt):
        prepare(cfg.data, log=lambda _: None)
    from pathlib import Path

    # The staging folder is gone; only the (empty) lock file may remain: nothing to trust.
    assert not [p for p in Path(cfg.data.cache_dir).iterdir() if not p.name.endswith(".lock")]
    monkeypatch.undo()
    assert len(prepare(cfg.data, log=lambda _: None).train) == 1014


def write_pairs(folder, name, pairs):
    (folder / f"{name}.en").write_text("".join(p[0] + "\n" for p in pairs), encoding="utf-8")
    (folder / f"{name}.de").write_text("".join(p[1] + "\n" for p in pairs), encoding="utf-8")


def corpus_with_noise(tmp_path):
    """Real Multi30k pairs plus one empty, one over-long and one badly proportioned pair."""
    need(MULTI30K)
    import datasets

    rows = datasets.load_dataset(str(MULTI30K), "de-en", split="validation")["translation"]
    pairs = [(r["en"], r["de"]) for r in rows]
    noise = [("", "Ein Hund."), (" ".join(["word"] * 300), "Wort."), ("A dog.", " ".join(["Hund"] * 40))]
    write_pairs(tmp_path, "train", pairs[:500] + noise + pairs[500:])
    write_pairs(tmp_path, "test", pairs[:20])
    return pairs


def test_cleaning_counts_each_reason_and_spares_test_sets(compose, tmp_path):
    pairs = corpus_with_noise(tmp_path)
    cfg = compose("train", "data=text", f"data.train={tmp_path}/train", f"data.test={tmp_path}/test",
                  "data.vocab_size=500", "data.max_length=100", "data.max_length_ratio=5")
    data = prepare(cfg.data, log=lambda _: None)
    train = data.report["train"]
    assert (train["pairs"], train["empty"], train["too_long"], train["ratio"]) == (len(pairs) + 3, 1, 1, 1)
    assert train["kept"] == len(data.train) == len(pairs)
    assert data.report["test_overlap"] == {"sentences": 20, "source": 20, "target": 20}
    assert 0.99 < data.report["coverage"] <= 1.0
    assert train["tokens_src"] == int(data.train.src_offsets[-1])
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


def _prepare_in_process(overrides, queue):
    from translate.hydra_cli import load_config

    logs = []
    data = prepare(load_config("train", overrides).data, log=logs.append)
    queue.put((str(data.folder), any("preparing" in line for line in logs)))


def test_concurrent_processes_prepare_once(tmp_path):
    """Two processes (as under torchrun) start together: one prepares, the other waits and maps."""
    corpus_with_noise(tmp_path)
    import multiprocessing

    overrides = ["data=text", f"data.train={tmp_path}/train", "data.vocab_size=300",
                 f"data.cache_dir={tmp_path}/cache", f"run_dir={tmp_path}/run"]
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    processes = [context.Process(target=_prepare_in_process, args=(overrides, queue)) for _ in range(2)]
    for process in processes:
        process.start()
    results = [queue.get(timeout=300) for _ in processes]
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    assert results[0][0] == results[1][0]
    assert sorted(built for _, built in results) == [False, True]


def test_prepare_verb_writes_the_report(tmp_path):
    corpus_with_noise(tmp_path)
    from tests.conftest import run_cli

    result = run_cli("prepare", "data=text", f"data.train={tmp_path}/train", "data.vocab_size=300",
                     f"data.cache_dir={tmp_path}/cache", f"run_dir={tmp_path}/run")
    assert result.returncode == 0, result.stderr
    assert "kept" in result.stdout and (tmp_path / "run" / "data_report.json").is_file()


def test_vocabulary_sample_is_seeded():
    need(TEXT)
    sentences = (TEXT / "newstest2012.en").read_text(encoding="utf-8").splitlines()
    first = Vocabulary.train(sentences, vocab_size=500, sample_size=1000)
    again = Vocabulary.train(sentences, vocab_size=500, sample_size=1000)
    other = Vocabulary.train(sentences, vocab_size=500, sample_size=1000, seed=2)
    assert first.model_bytes == again.model_bytes
    assert first.model_bytes != other.model_bytes  # the sample (of 1,000 of 3,003) is what changed


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
    assert data.report["train"]["empty"] == 2 and len(data.train) == 298


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


def test_reservoir_sample_is_uniform_and_seeded():
    from translate.data.vocabulary import reservoir_sample

    items = [str(i) for i in range(10000)]
    sample = reservoir_sample(items, 1000, seed=1)
    assert len(set(sample)) == 1000 and set(sample) <= set(items)
    assert sample == reservoir_sample(items, 1000, seed=1) != reservoir_sample(items, 1000, seed=2)
    assert reservoir_sample(items[:10], 1000, seed=1) == items[:10]
    # Uniform: over many seeds, each decile of the input is equally represented.
    counts = np.zeros(10)
    for seed in range(50):
        counts += np.bincount([int(x) // 1000 for x in reservoir_sample(items, 200, seed)], minlength=10)
    assert counts.min() > 0.8 * counts.mean() and counts.max() < 1.2 * counts.mean()
