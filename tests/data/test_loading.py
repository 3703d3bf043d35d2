"""Loading real corpora (translate.data.loading): the hub layout, plain text by prefix, and
files that are misaligned, not UTF-8 or missing, named in one line; without the hub, datasets'
cache at once, or one line saying how to give a local copy."""

import os
import time

import pytest

from tests.conftest import MULTI30K, TEXT, WMT14_MINI, free_port, need, one_line_error, run_cli
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


# A hub nothing answers, on any machine: a port no one listens on (this suite runs offline, and
# the real hub, where reachable, would start downloading WMT14).
def _closed_hub() -> str:
    return f"http://127.0.0.1:{free_port()}"


@pytest.mark.parametrize("offline", ["unreachable", "HF_HUB_OFFLINE"])
def test_without_the_hub_the_paper_preset_fails_at_once_in_one_line(tmp_path, offline):
    """A newcomer's first command, with nothing cached: one line naming the hub and data.path,
    within seconds, with none of huggingface_hub's retries or their warnings."""
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT=_closed_hub())
    if offline == "HF_HUB_OFFLINE":
        env["HF_HUB_OFFLINE"] = "1"
    started = time.monotonic()
    result = run_cli("train", "config=base", f"run_dir={tmp_path}/run", env=env, timeout=120)
    seconds = time.monotonic() - started
    reason = f"the Hugging Face Hub ({env['HF_ENDPOINT']}) cannot be reached" if offline == "unreachable" \
        else "offline mode is on (HF_HUB_OFFLINE)"
    one_line_error(result, f"cannot load dataset 'wmt/wmt14' (de-en): {reason}, and datasets' cache "
                   f"({tmp_path / 'hf' / 'datasets'}) holds no copy of it: give a local copy with "
                   "data.path=DIR (docs/data.md)")
    assert seconds < 15, seconds


def test_without_the_hub_a_hub_dataset_comes_from_datasets_cache_at_once(compose, tmp_path, monkeypatch):
    """A hub id loaded once before (its Arrow files in datasets' cache) loads offline without
    waiting for the hub: here Multi30k's local copy, cached under the hub id's name."""
    need(MULTI30K)
    import datasets

    cache = tmp_path / "hf-datasets"
    datasets.load_dataset(str(MULTI30K), "de-en", split="test", cache_dir=str(cache))
    (cache / "multi30k").rename(cache / "bentrevett___multi30k")  # where a load of the hub id writes
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(cache))
    monkeypatch.setattr(datasets.config, "HF_ENDPOINT", _closed_hub())
    cfg = compose("train", "config=tiny", "data.path=bentrevett/multi30k")
    assert cfg.data.name is None  # the hub copy has no per-pair configs
    started = time.monotonic()
    test = load_corpus(cfg.data, "test")
    assert len(load_corpus(cfg.data, "validation")) == 1014
    assert time.monotonic() - started < 10
    assert len(test) == 1000 and test.pairs()[0][0] == "A man in an orange hat starring at something."
    assert not datasets.config.HF_HUB_OFFLINE  # the offline mode lasted for the loads alone
