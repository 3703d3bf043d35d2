"""Decoding options on a trained checkpoint: batching independence, n-best, sampling, stdin."""

from pathlib import Path

import pytest

from tests.conftest import MULTI30K, need, run_cli
from translate.decode import Translator, format_output
from translate.search import greedy_search


@pytest.fixture(scope="module")
def translator(trained_run):
    run_dir = Path(next(o for o in trained_run if o.startswith("run_dir=")).split("=", 1)[1])
    return Translator.from_checkpoint(run_dir / "checkpoint_last.pt")


@pytest.fixture(scope="module")
def sentences():
    need(MULTI30K)
    import datasets

    rows = datasets.load_dataset(str(MULTI30K), "de-en", split="test")["translation"][:40]
    return [row["en"] for row in rows]


def test_results_do_not_depend_on_batching(translator, sentences):
    together = translator.translate(sentences, beam_size=4, tokens_per_batch=100000, max_len_b=10)
    small = translator.translate(sentences, beam_size=4, tokens_per_batch=50, max_len_b=10)
    alone = [translator.translate([s], beam_size=4, max_len_b=10)[0] for s in sentences[:5]]
    assert together == small
    assert together[:5] == alone


def test_beam_one_is_greedy(translator, sentences):
    from translate.data.batching import pad
    import numpy as np

    ids, specials = translator.vocabulary.encode(sentences[:8]), translator.vocabulary.specials
    state = translator.model.start_state(pad([np.asarray(i) for i in ids], specials.pad, suffix=specials.eos))
    greedy = greedy_search(translator.model.step, state, [len(i) + 11 for i in ids], specials.bos, specials.eos,
                           banned=translator.vocabulary.never_generated)
    beam_one = translator.search(sentences[:8], beam_size=1, max_len_b=10)
    assert [h[0].tokens for h in beam_one] == greedy


def test_nbest_lists_are_sorted_and_formatted(translator, sentences):
    results = translator.search(sentences[:3], beam_size=4, max_len_b=8)
    lines = format_output(translator, results, nbest=3)
    assert len(lines) == 9
    for index in range(3):
        rows = [line.split("\t") for line in lines[3 * index : 3 * index + 3]]
        assert all(row[0] == str(index) for row in rows)
        scores = [float(row[1]) for row in rows]
        assert scores == sorted(scores, reverse=True)
    assert format_output(translator, results, nbest=1) == translator.translate(sentences[:3], beam_size=4, max_len_b=8)


def test_sampling_is_seeded_and_top_k_one_is_greedy(translator, sentences):
    first = translator.search(sentences[:6], sampling=True, seed=3, max_len_b=8)
    again = translator.search(sentences[:6], sampling=True, seed=3, max_len_b=8)
    other = translator.search(sentences[:6], sampling=True, seed=4, temperature=2.0, max_len_b=8)
    assert [h[0].tokens for h in first] == [h[0].tokens for h in again]
    assert [h[0].tokens for h in first] != [h[0].tokens for h in other]
    top1 = translator.search(sentences[:6], sampling=True, top_k=1, max_len_b=8)
    greedy = translator.search(sentences[:6], beam_size=1, max_len_b=8)
    assert [h[0].tokens for h in top1] == [h[0].tokens for h in greedy]
    nucleus = translator.search(sentences[:6], sampling=True, top_p=1e-6, max_len_b=8)  # only the top token
    assert [h[0].tokens for h in nucleus] == [h[0].tokens for h in greedy]


def test_stdin_streams_to_stdout(trained_run):
    import subprocess
    import sys

    from tests.conftest import ROOT

    result = subprocess.run(
        [sys.executable, "-m", "translate", "decode", *trained_run, "decode.input=-", "decode.max_len_b=5"],
        input="A dog.\nTwo men are talking.\n", capture_output=True, text=True, cwd=ROOT, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 2  # translations only: logs go to stderr


def test_bad_decode_options_are_one_line(trained_run):
    result = run_cli("decode", *trained_run, "decode.nbest=9")
    assert result.returncode == 1 and "decode.nbest (9)" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
