#!/usr/bin/env python
"""CPU bf16 and oneDNN's compiled products: what keeping them all (host_memory.keep_compiled_products)
does to training's speed and memory, and the figures behind it. One JSON line per measurement.

- train: `translate train config=tiny` in bf16 with oneDNN's and ideep's default caches (1,024
  products each) and with what training now sets (8,192), rounds interleaved: steady target
  tokens/s and the log's peak memory at each window.
- compilations: the same run with the defaults under ONEDNN_VERBOSE=profile_create: products
  compiled, distinct, reused, and the seconds spent compiling.
- per_product: the memory a kept product costs (one 256 x 1,024 bf16 product per row count, 200
  row counts), with both caches as training sets them and with both off.
- shapes: distinct batch shapes of a tiny epoch and their padding, batch widths rounded up to 1,
  2, 4 or 8 (rounding, the alternative to keeping them all).
- attention: forward and backward of attention in bf16 products (translate.attention.attend) against
  torch's fused fp32 kernel, 256 x 4 heads x 16 x 64 (fp32, the other alternative: no oneDNN
  products for attention).

Needs a CPU with native bf16 (AMX, AVX512-BF16) and the tiny cache (`translate prepare config=tiny`).

    .venv/bin/python scripts/bench_compiled_products.py --updates 240 --rounds 1
    .venv/bin/python scripts/bench_compiled_products.py --only per_product shapes attention
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_fairseq import steady_rate

from translate.core.host_memory import COMPILED_PRODUCTS

ROOT = Path(__file__).resolve().parents[1]
DEFAULTS = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024", "LRU_CACHE_CAPACITY": "1024"}
SETTINGS = {"defaults (1,024)": DEFAULTS, f"kept ({COMPILED_PRODUCTS:,})": {}}  # {}: what translate train sets

# Memory (MB) per new product shape, after a warm-up; argv[1]: "off" turns both caches off first.
PER_PRODUCT = """
import os, random, sys
if sys.argv[1] == "off":
    os.environ.update(ONEDNN_PRIMITIVE_CACHE_CAPACITY="0", LRU_CACHE_CAPACITY="16")  # ideep's 0 crashes
else:
    from translate.core.host_memory import keep_compiled_products
    keep_compiled_products()
import torch
torch.set_num_threads(2)
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
weight = torch.randn(1024, 256).bfloat16().t()  # (256, 1024)
x, y = torch.randn(4096, 256).bfloat16(), torch.empty(4096, 1024).bfloat16()
torch.mm(x, weight, out=y)  # outputs written in place: no allocation beside the products'
rows = random.Random(0).sample(range(1000, 4096), 200)
before = rss()
for n in rows:
    torch.mm(x[:n], weight, out=y[:n])
print((rss() - before) / len(rows))
"""


def emit(**record) -> None:
    print(json.dumps(record), flush=True)


def train(updates: int, folder: Path, env: dict) -> str:
    command = [sys.executable, "-m", "translate", "train", "config=tiny", f"run_dir={folder / str(time.monotonic_ns())}",
               "train.precision=bf16", "train.threads=2", f"train.max_steps={updates}", "train.log_every=20",
               "checkpoint.every_steps=0", "checkpoint.every_minutes=null", "valid.every_steps=0"]
    result = subprocess.run(command, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, check=True)
    return result.stdout + result.stderr


def measure_train(args, folder: Path) -> None:
    for round_ in range(1, args.rounds + 1):
        for name, env in SETTINGS.items():
            log = train(args.updates, folder, env)
            peaks = [float(gb) for gb in re.findall(r"update \d+: .* mem ([0-9.]+) GB", log)]
            emit(measurement="train", round=round_, caches=name, updates=args.updates,
                 target_tokens_per_s=round(steady_rate(log)), peak_memory_gb_every_20_updates=peaks)


def measure_compilations(args, folder: Path) -> None:
    log = train(args.updates, folder, {**DEFAULTS, "ONEDNN_VERBOSE": "profile_create"})
    lines = [line.split(",") for line in log.splitlines() if line.startswith("onednn_verbose") and ",create:" in line]
    misses = [fields for fields in lines if fields[3] == "create:cache_miss"]
    distinct = {tuple(fields[4:-1]) for fields in misses}  # all but the time: engine, implementation, layouts, shapes
    emit(measurement="compilations", caches="defaults (1,024)", updates=args.updates, compiled=len(misses),
         distinct=len(distinct), reused=len(lines) - len(misses),
         seconds_compiling=round(sum(float(fields[-1]) for fields in misses) / 1000, 1))


def measure_per_product() -> None:
    for caches in ("kept", "off"):
        result = subprocess.run([sys.executable, "-c", PER_PRODUCT, caches], cwd=ROOT, capture_output=True, text=True,
                                check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        emit(measurement="per_product", caches=caches, mb_per_new_shape=round(float(result.stdout), 3))


def measure_shapes() -> None:
    from translate.data.batching import token_batches
    from translate.data.preparation import prepare
    from translate.hydra_cli import load_config

    cfg = load_config("train", ["config=tiny"])
    split = prepare(cfg.data, log=lambda *_: None).train
    src, tgt = split.src_lengths, split.tgt_lengths
    batches = token_batches(src, tgt, cfg.train.tokens_per_batch, cfg.train.seed, 0)
    for multiple in (1, 2, 4, 8):
        shapes, real, padded = set(), 0, 0
        for batch in batches:
            widths = [-(-(int(lengths[batch].max()) + 1) // multiple) * multiple for lengths in (src, tgt)]
            shapes.add((len(batch), *widths))
            real += int((src[batch] + 1).sum() + (tgt[batch] + 1).sum())
            padded += len(batch) * sum(widths)
        emit(measurement="shapes", width_multiple=multiple, batches=len(batches), batch_shapes=len(shapes),
             padding=round(1 - real / padded, 3), distinct_rows=len({b * w for b, *ws in shapes for w in ws}))


def measure_attention() -> None:
    import torch

    from translate.attention import attend

    def fp32_products(q, k, v, mask, *, causal):
        with torch.autocast("cpu", enabled=False):
            return attend(q.float(), k.float(), v.float(), mask, causal=causal).to(q.dtype)  # fp32: torch's fused kernel

    torch.set_num_threads(2)
    q, k, v = [torch.randn(256, 4, 16, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    for name, function in (("bf16 products", attend), ("fp32", fp32_products)):
        for step in range(25):
            if step == 5:
                started = time.perf_counter()
            function(q, k, v, None, causal=False).float().sum().backward()
        emit(measurement="attention", products=name, shape="256x4x16x64", forward_backward_ms=round(
            (time.perf_counter() - started) / 20 * 1000, 2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--updates", type=int, default=240, help="updates of each training run")
    parser.add_argument("--rounds", type=int, default=1)
    parts = ["train", "compilations", "per_product", "shapes", "attention"]
    parser.add_argument("--only", nargs="+", choices=parts, default=parts)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        runs = {"train": lambda: measure_train(args, Path(work)), "compilations": lambda: measure_compilations(args, Path(work)),
                "per_product": measure_per_product, "shapes": measure_shapes, "attention": measure_attention}
        for part in args.only:
            runs[part]()


if __name__ == "__main__":
    main()
