#!/usr/bin/env python
"""Data preparation at scale: one JSON line per measurement.

Real parallel text from ../shared/data/text is replicated to N pairs (generated here, in a
temporary folder, never committed), then `prepare` runs end to end with a given
sentencepiece model in a fresh process: pairs/s, peak resident memory, cache size. In the
same run, sentencepiece's own 2-thread encoding of the same sentences sets the speed to
compare with; vocabulary training is timed separately; assembling a 25k-token batch from
the memory-mapped cache is timed last, after loading it (which verifies its files first).

    .venv/bin/python scripts/bench_data.py --pairs 1000000 5000000
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TEXT = ROOT.parent / "shared" / "data" / "text"

SOURCES = ["wmt-train-sample.en-de"] + [f"newstest{year}" for year in range(2008, 2014)]


def emit(**record) -> None:
    print(json.dumps(record), flush=True)


def real_pairs():
    pairs = []
    for prefix in SOURCES:
        en = (TEXT / f"{prefix}.en").read_text(encoding="utf-8").splitlines()
        de = (TEXT / f"{prefix}.de").read_text(encoding="utf-8").splitlines()
        pairs.extend(zip(en, de))
    return pairs


def replicate(pairs, n: int, folder: Path) -> Path:
    """PREFIX.en / PREFIX.de with n pairs: the real pairs repeated in order."""
    prefix = folder / f"corpus{n}"
    with open(f"{prefix}.en", "w", encoding="utf-8") as en, open(f"{prefix}.de", "w", encoding="utf-8") as de:
        for i in range(n):
            source, target = pairs[i % len(pairs)]
            en.write(source + "\n")
            de.write(target + "\n")
    return prefix


# Runs in a fresh process, so that its peak memory is the preparation's alone.
PREPARE = """
import json, resource, sys, time
from translate.data.preparation import prepare
from translate.hydra_cli import load_config
cfg = load_config("prepare", sys.argv[1:])
start = time.perf_counter()
data = prepare(cfg.data, log=lambda _: None)
print(json.dumps({"seconds": time.perf_counter() - start, "pairs": data.report.train.pairs,
                  "kept": data.report.train.kept, "folder": str(data.folder),
                  "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

SPM_ONLY = """
import json, resource, sys, time
import sentencepiece as spm
processor = spm.SentencePieceProcessor(model_file=sys.argv[1])
start, pairs = time.perf_counter(), 0
for side in ("en", "de"):
    with open(f"{sys.argv[2]}.{side}", encoding="utf-8") as handle:
        chunk = []
        for line in handle:
            chunk.append(line.rstrip("\\n"))
            if len(chunk) == 20000:
                processor.encode(chunk, out_type=int, num_threads=2)
                pairs += len(chunk) if side == "en" else 0
                chunk = []
        if chunk:
            processor.encode(chunk, out_type=int, num_threads=2)
            pairs += len(chunk) if side == "en" else 0
print(json.dumps({"seconds": time.perf_counter() - start, "pairs": pairs,
                  "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run(code: str, *args: str) -> dict:
    result = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def bench_prepare(pairs, sizes, model: Path, folder: Path) -> Path:
    """`prepare` on `sizes` pairs each (a fresh process each), against sentencepiece's encoding
    alone; returns the last cache folder."""
    last_folder = None
    for n in sizes:
        prefix = replicate(pairs, n, folder)
        baseline = run(SPM_ONLY, str(model), str(prefix))
        ours = run(PREPARE, "data=text", f"data.train={prefix}", f"data.spm_model={model}",
                   f"data.cache_dir={folder}/cache", f"run_dir={folder}/run")
        cache_bytes = sum(p.stat().st_size for p in Path(ours["folder"]).iterdir())
        emit(measurement="prepare", pairs=n, kept=ours["kept"], seconds=round(ours["seconds"], 2),
             pairs_per_s=round(n / ours["seconds"]), max_rss_mb=round(ours["max_rss_mb"]),
             cache_mb=round(cache_bytes / 2**20, 1))
        emit(measurement="sentencepiece_encode_2_threads", pairs=n, seconds=round(baseline["seconds"], 2),
             pairs_per_s=round(n / baseline["seconds"]), max_rss_mb=round(baseline["max_rss_mb"]))
        emit(measurement="prepare_speed_vs_sentencepiece", pairs=n, ratio=round(baseline["seconds"] / ours["seconds"], 3))
        Path(f"{prefix}.en").unlink()
        Path(f"{prefix}.de").unlink()
        last_folder = Path(ours["folder"])
    return last_folder


def bench_batches(cache_folder: Path, batch_tokens: int) -> None:
    """Batch assembly from the cache, and finding a batch's real target positions (numpy, as
    Batch.real_targets does, against torch's boolean indexing on its default threads)."""
    import numpy as np
    import torch
    from translate.data.batching import collate, token_batches
    from translate.data.cache import load, verify

    started = time.perf_counter()
    data = load(cache_folder)  # verifies every file's size and checksum against the report first
    seconds = time.perf_counter() - started
    started = time.perf_counter()
    verify(cache_folder, data.report)
    emit(measurement="cache_load", pairs=len(data.train), cache_mb=round(sum(r.bytes for r in data.report.files.values()) / 2**20, 1),
         load_seconds=round(seconds, 3), verify_seconds=round(time.perf_counter() - started, 3))
    batches = token_batches(data.train.src_lengths, data.train.tgt_lengths, batch_tokens, seed=1, epoch=0)
    chosen = [batches[i] for i in np.random.default_rng(0).permutation(len(batches))[:200]]
    specials = data.vocabulary.specials
    collate(data.train, chosen[0], specials)
    start = time.perf_counter()
    for batch in chosen:
        collate(data.train, batch, specials)
    emit(measurement="batch_assembly", tokens_per_batch=batch_tokens, batches=len(chosen),
         ms_per_batch=round(1000 * (time.perf_counter() - start) / len(chosen), 3))

    def with_torch(batch):
        real = batch.tgt_out != batch.pad  # (B, T)
        return real.flatten().nonzero().squeeze(1), batch.tgt_out[real]

    assembled = [collate(data.train, batch, specials) for batch in chosen]
    seconds = {}
    for name, find in (("numpy", lambda b: b.real_targets()), ("torch", with_torch)):
        find(assembled[0])
        start = time.perf_counter()
        for batch in assembled:
            find(batch)
        seconds[name] = (time.perf_counter() - start) / len(assembled)
    assert all(torch.equal(a, b) for a, b in zip(assembled[0].real_targets(), with_torch(assembled[0])))
    emit(measurement="real_targets", tokens_per_batch=batch_tokens, threads=torch.get_num_threads(),
         ms_per_batch=round(1000 * seconds["numpy"], 3), torch_ms_per_batch=round(1000 * seconds["torch"], 3),
         speedup_vs_torch=round(seconds["torch"] / seconds["numpy"], 2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, nargs="+", default=[1_000_000, 5_000_000])
    parser.add_argument("--vocab-size", type=int, default=16000)
    parser.add_argument("--batch-tokens", type=int, default=25000)
    args = parser.parse_args()

    from translate.data.vocabulary import Vocabulary

    pairs = real_pairs()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        start = time.perf_counter()
        vocabulary = Vocabulary.train((s for pair in pairs for s in pair), args.vocab_size)
        emit(measurement="vocabulary_training", sentences=2 * len(pairs), vocab_size=len(vocabulary),
             seconds=round(time.perf_counter() - start, 2))
        model = folder / "given.model"
        model.write_bytes(vocabulary.model_bytes)
        bench_batches(bench_prepare(pairs, args.pairs, model, folder), args.batch_tokens)


if __name__ == "__main__":
    main()
