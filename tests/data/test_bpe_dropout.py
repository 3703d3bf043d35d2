"""BPE-dropout (data.bpe_dropout): sampled segmentations of the training split, kept in the token
cache beside the deterministic one, spelling the same pairs; epochs train on them in turn, and
dev, test and decoding keep the deterministic one."""

import json

import numpy as np

from tests.conftest import corpus_with_noise, run_cli, small_run
from translate.core import paths
from translate.data.batching import BatchStream, token_batches
from translate.data.loading import load_corpus
from translate.data.preparation import fingerprint, prepare
from translate.data.vocabulary import Vocabulary
from translate.training.trainer import Feed


def text_data(tmp_path, *extra):
    """A plain-text corpus of real Multi30k pairs with an empty and an over-long one that cleaning drops (data=text)."""
    if not (tmp_path / "train.en").exists():  # written once: the corpus's fingerprint follows its files
        corpus_with_noise(tmp_path)
    return ["data=text", f"data.train={tmp_path}/train", f"data.valid={tmp_path}/test", "data.vocab_size=500", *extra]


def spelled(vocabulary, split, i):
    """Pair i of a split, as text."""
    return tuple(vocabulary.to_text([side.tolist()])[0] for side in (split.source(i), split.target(i)))


def test_sampled_segmentation_is_seeded_spells_the_sentence_and_is_longer(tmp_path):
    pairs = corpus_with_noise(tmp_path)
    sentences = [s for pair in pairs[:300] for s in pair]
    vocabulary = Vocabulary.train(sentences, 500)
    plain = vocabulary.to_ids(sentences)
    first = vocabulary.to_sampled_ids(sentences, 0.1, seed=3)
    assert vocabulary.to_sampled_ids(sentences, 0.1, seed=3) == first
    assert vocabulary.to_sampled_ids(sentences, 0.1, seed=4) != first
    assert vocabulary.to_text(first) == vocabulary.to_text(plain)
    assert sum(map(len, first)) > 1.05 * sum(map(len, plain))  # merges skipped: more, shorter pieces
    assert vocabulary.to_sampled_ids(sentences, 0.0, seed=3) == plain  # no merge skipped: the deterministic one


def test_the_cache_keeps_sampled_segmentations_of_the_kept_pairs_built_the_same_every_time(compose, tmp_path):
    cfg = compose("train", *text_data(tmp_path, "data.bpe_dropout=0.1", "data.bpe_dropout_copies=3"))
    data = prepare(cfg.data, log=lambda _: None)
    plain = prepare(compose("train", *text_data(tmp_path)).data, log=lambda _: None)
    assert data.report.train.kept == len(data.train) == len(plain.train) == data.report.train.pairs - 2  # empty, too long
    assert len(data.train_sampled) == 3 and data.report.sampled.kept == 3 * len(data.train)
    # The deterministic splits are those of a cache without BPE-dropout: dev and decoding see no change.
    for name in ("train", "valid"):
        for side in ("src_tokens", "tgt_tokens"):
            assert np.array_equal(getattr(getattr(data, name), side), getattr(getattr(plain, name), side))
    vocabulary = data.vocabulary
    for copy in data.train_sampled:
        assert len(copy) == len(data.train)
        for i in range(0, len(data.train), 97):
            assert spelled(vocabulary, copy, i) == spelled(vocabulary, data.train, i)
        assert copy.src_tokens.size > 1.05 * data.train.src_tokens.size
    assert not np.array_equal(data.train_sampled[0].tgt_tokens[:1000], data.train_sampled[1].tgt_tokens[:1000])
    # The sampled counts are what the files hold; the summary says so.
    assert data.report.sampled.tokens_src == sum(int(copy.src_offsets[-1]) for copy in data.train_sampled)
    assert "BPE-dropout 0.1: 3 sampled segmentations" in data.report.summary()
    # Built again elsewhere: the same bytes (each chunk, copy and side seeded).
    again = prepare(compose("train", *text_data(tmp_path, "data.bpe_dropout=0.1", "data.bpe_dropout_copies=3"),
                            f"data.cache_dir={tmp_path / 'again'}").data, log=lambda _: None)
    assert again.folder != data.folder and again.report.files == data.report.files


def test_the_fingerprint_holds_bpe_dropout_only_when_it_is_on(compose, tmp_path):
    base = compose("train", *text_data(tmp_path))
    corpus = load_corpus(base.data, "train")
    key = fingerprint(base.data, corpus, None)
    copies_alone = compose("train", *text_data(tmp_path, "data.bpe_dropout_copies=4")).data
    assert fingerprint(copies_alone, corpus, None) == key  # off: the caches of runs without it keep their names
    on = fingerprint(compose("train", *text_data(tmp_path, "data.bpe_dropout=0.1")).data, corpus, None)
    assert on != key
    more = compose("train", *text_data(tmp_path, "data.bpe_dropout=0.1", "data.bpe_dropout_copies=4")).data
    assert fingerprint(more, corpus, None) not in (key, on)


def lengths(n, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(1, 40, n), rng.integers(1, 40, n)


def test_the_batch_stream_takes_the_segmentations_in_turn_and_resumes_in_place():
    segmentations = [lengths(500, 1), lengths(500, 2)]
    stream = BatchStream(segmentations, 800, seed=7)
    served = []  # (epoch, batch)
    while True:
        batch = next(stream)  # the stream's epoch is now this batch's
        if stream.epoch == 3:
            break
        served.append((stream.epoch, batch.tolist()))
    for epoch in range(3):
        expected = token_batches(*segmentations[epoch % 2], 800, 7, epoch)
        assert [batch for e, batch in served if e == epoch] == [b.tolist() for b in expected]
    # Resumed in the middle of epoch 1 (the second segmentation): the same batches follow.
    stream = BatchStream(segmentations, 800, seed=7)
    middle = next(i for i, (e, _) in enumerate(served) if e == 1) + 3
    for _ in range(middle):
        next(stream)
    resumed = BatchStream(segmentations, 800, seed=7)
    resumed.load_state_dict(stream.state_dict())
    assert [next(resumed).tolist() for _ in range(20)] == [b for _, b in served[middle:middle + 20]]


def test_each_epoch_collates_its_own_segmentation(compose, tmp_path):
    cfg = compose("train", *text_data(tmp_path, "data.bpe_dropout=0.1", "data.bpe_dropout_copies=2"))
    data = prepare(cfg.data, log=lambda _: None)
    feed = Feed(data, BatchStream(data.training_lengths(), 1500, seed=1), accumulation=1)
    seen = {0: set(), 1: set(), 2: set()}
    while True:
        (batch,) = feed.next_update()
        epoch = feed.batches.epoch
        if epoch == 3:
            break
        split = data.train_sampled[epoch % 2]
        for row, i in enumerate(batch.indices):
            source = batch.src[row][batch.src[row] != data.vocabulary.specials.pad].tolist()
            assert source == split.source(i).tolist() + [data.vocabulary.specials.eos]
        seen[epoch].update(batch.indices.tolist())
    assert all(len(pairs) == len(data.train) for pairs in seen.values())  # each epoch every pair, once


def test_translate_train_with_bpe_dropout_says_so_and_validates_on_the_one_segmentation(tmp_path):
    overrides = small_run(tmp_path, "train.max_steps=4", "train.log_every=2", "data.bpe_dropout=0.1",
                          "data.bpe_dropout_copies=2", "valid.every_steps=4")
    result = run_cli("train", *overrides)
    assert result.returncode == 0, result.stderr
    assert "BPE-dropout 0.1: 2 sampled segmentations" in result.stderr
    report = json.loads(paths.data_report(tmp_path / "run").read_text())
    assert report["sampled"]["kept"] == 2 * report["train"]["kept"]
    # The record's epoch is a sampled segmentation's: their mean tokens, more than the corpus's.
    data = json.loads((tmp_path / "run" / "run_record.json").read_text())["data"]
    assert data["epoch_tokens"]["target"] == report["sampled"]["tokens_tgt"] // 2 > data["train_tokens"]["target"]
