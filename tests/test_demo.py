"""The demo's quality bar (slow: about 17 minutes): `make test-slow` runs it.

A tiny Transformer trained as make demo trains it (config=tiny train.init=fairseq), 15 minutes
on Multi30k EN-DE on this 2-core CPU, must translate test_2016_flickr at least as well as
fairseq 0.12.2 does with the same size, data and vocabulary
(measured here: sacreBLEU 22.6 after 17 minutes, beam 4).
"""

import json

import pytest

from tests.conftest import MULTI30K, need, run_cli

FAIRSEQ_SACREBLEU = 22.6


@pytest.mark.slow
def test_tiny_multi30k_in_15_minutes_matches_fairseq(tmp_path):
    need(MULTI30K)
    overrides = ["config=tiny", "train.init=fairseq", f"run_dir={tmp_path}/run", f"data.cache_dir={tmp_path}/cache"]
    run_cli("train", *overrides, "train.max_minutes=15", check=True, timeout=1500)
    run_cli("decode", *overrides, check=True)
    result = run_cli("bleu", *overrides, "bleu.format=json", check=True)
    report = json.loads(result.stdout)
    assert report["lines"] == 1000
    assert report["scores"]["sacrebleu"]["value"] >= FAIRSEQ_SACREBLEU
