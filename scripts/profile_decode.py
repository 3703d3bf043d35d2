#!/usr/bin/env python
"""Where beam-4 decoding's time goes in `translate decode`: one JSON line per measurement.

Translates the sentences of one or more splits in-process (as bench_decode's "ours"), once to
warm up and once under torch.profiler, and prints a summary line (seconds, sentences/s, the
share of the time spent outside any operator: Python, the search's bookkeeping), a line per
kind of work (matrix products, attention, the output projection's log-softmax, the beam's
top-k, the cache reorder, the rest), then the operators with the most self time, in ms per
sentence.

    make demo    # trains runs/tiny-multi30k_en_de first
    .venv/bin/python scripts/profile_decode.py
    .venv/bin/python scripts/profile_decode.py --precision bf16 --top 12
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Dict

import torch
from torch.profiler import ProfilerActivity, profile


from translate.core.choices import Precision
from translate.data.loading import load_corpus
from translate.hydra_cli import load_config
from translate.translator import Translator

ROOT = Path(__file__).resolve().parents[1]

# Kinds of work, by operator name (the first that matches): what beam search spends time on.
KINDS = [
    ("matrix products", ("aten::addmm", "aten::mm", "aten::bmm", "aten::linear", "aten::matmul", "mkldnn", "onednn")),
    ("attention", ("scaled_dot_product", "_flash_attention", "aten::_softmax", "aten::softmax", "aten::baddbmm")),
    ("log-softmax", ("log_softmax",)),
    ("top-k and sort", ("aten::topk", "aten::sort", "aten::argsort", "aten::max", "aten::amax", "aten::gather")),
    ("cache reorder", ("aten::index_select", "aten::index", "aten::take", "aten::cat", "aten::copy_")),
]


def emit(**record) -> None:
    print(json.dumps(record), flush=True)


def kind_of(name: str) -> str:
    return next((kind for kind, keys in KINDS if any(key in name for key in keys)), "other operators")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default=str(ROOT / "runs/tiny-multi30k_en_de/checkpoint_last.pt"))
    parser.add_argument("--config", default="tiny")
    parser.add_argument("--splits", nargs="+", default=["test"])
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--top", type=int, default=15, help="operators listed")
    parser.add_argument("--limit", type=int, default=0, help="first N sentences only (0: all)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    cfg = load_config("decode", [f"config={args.config}", f"decode.checkpoint={args.checkpoint}", "decode.length_penalty=0.6"])
    settings = replace(cfg.decode, precision=Precision(args.precision))
    sources = [s for split in args.splits for s in load_corpus(cfg.data, split).pairs()[0]]
    sources = sources[: args.limit] if args.limit else sources
    translator = Translator.from_checkpoint(Path(args.checkpoint))
    translator.translate(sources[:64], settings)  # warm-up: first-call allocations and kernel choices
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        started = time.perf_counter()
        translator.translate(sources, settings)
        seconds = time.perf_counter() - started
    events = [e for e in profiler.key_averages() if e.self_cpu_time_total > 0]
    total_ms = sum(e.self_cpu_time_total for e in events) / 1e3
    per_sentence = 1e3 * seconds / len(sources)
    emit(measurement="decode_profile", precision=args.precision, threads=args.threads, sentences=len(sources),
         seconds=round(seconds, 2), sentences_per_s=round(len(sources) / seconds, 1), ms_per_sentence=round(per_sentence, 3),
         outside_operators=round(1 - total_ms / (1e3 * seconds), 3))
    kinds: Dict[str, float] = {}
    for event in events:
        kinds[kind_of(event.key)] = kinds.get(kind_of(event.key), 0.0) + event.self_cpu_time_total / 1e3
    for kind, ms in sorted(kinds.items(), key=lambda item: -item[1]):
        emit(measurement="decode_profile_kind", kind=kind, ms_per_sentence=round(ms / len(sources), 3),
             share_of_wall=round(ms / (1e3 * seconds), 3))
    for event in sorted(events, key=lambda e: -e.self_cpu_time_total)[: args.top]:
        emit(measurement="decode_profile_op", op=event.key, kind=kind_of(event.key), calls=event.count,
             ms_per_sentence=round(event.self_cpu_time_total / 1e3 / len(sources), 4),
             share_of_wall=round(event.self_cpu_time_total / 1e6 / seconds, 3))


if __name__ == "__main__":
    main()
