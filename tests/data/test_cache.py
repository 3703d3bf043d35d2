"""The token cache (translate.data.cache): encoded once and mapped again, never trusted half
built, built by one process while the others wait."""

import numpy as np
import pytest

from tests.conftest import MULTI30K, corpus_with_noise, need
from translate.data.loading import load_corpus
from translate.data.preparation import prepare


def test_cache_round_trips_and_is_reused(compose):
    need(MULTI30K)
    cfg = compose("train", "config=tiny", "data.train_split=validation", "data.vocab_size=500")
    logs = []
    data = prepare(cfg.data, log=logs.append)
    assert "preparing" in logs[0]
    sources, targets = load_corpus(cfg.data, "validation").pairs()
    assert len(data.train) == len(sources) == 1014
    decoded = data.vocabulary.to_text([data.train.source(i).tolist() for i in range(20)])
    assert decoded == [" ".join(s.split()) for s in sources[:20]]
    assert data.vocabulary.to_text([data.train.target(7).tolist()]) == [" ".join(targets[7].split())]
    again = prepare(cfg.data, log=logs.append)
    assert "using cached corpus" in logs[-1] and again.folder == data.folder
    assert np.array_equal(np.asarray(again.train.src_tokens), np.asarray(data.train.src_tokens))


def test_interrupted_preparation_leaves_no_trusted_cache(compose, monkeypatch):
    need(MULTI30K)
    cfg = compose("train", "config=tiny", "data.train_split=validation", "data.vocab_size=500")
    import translate.data.preparation as cache

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


def test_a_preparation_killed_part_way_leaves_nothing_after_the_next(compose):
    """SIGKILL mid-build (a rank killed under torchrun's restarts) leaves the staging folder,
    which no clean-up of its own removes: the next build, holding the cache's lock, does."""
    import shutil

    need(MULTI30K)
    cfg = compose("train", "config=tiny", "data.train_split=validation", "data.vocab_size=500")
    folder = prepare(cfg.data, log=lambda _: None).folder
    shutil.rmtree(folder)
    for leftover in (f".{folder.name}.new-killed", f".{folder.name}.old-killed"):
        (folder.parent / leftover).mkdir()
        (folder.parent / leftover / "train.src_tokens.bin").write_bytes(b"half")
    (folder.parent / ".another.new-building").mkdir()  # another cache's: not this build's to touch
    assert len(prepare(cfg.data, log=lambda _: None).train) == 1014
    assert sorted(p.name for p in folder.parent.iterdir() if not p.name.endswith(".lock")) == [".another.new-building",
                                                                                            folder.name]


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
