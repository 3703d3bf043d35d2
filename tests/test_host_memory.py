"""translate.core.host_memory: freed host memory is reused, not faulted in again page by page;
bf16 products are compiled once a run, not once an epoch."""

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import MULTI30K, SMALL, need, run, run_cli
from translate.core.host_memory import COMPILED_PRODUCTS, keep_compiled_products
from translate.core.precision import native_bf16

# Page faults of an update-like pattern of large blocks (three tensors of varying size, none
# larger than the first updates'), after two updates at the largest size.
PROBE = """
import random, resource, sys, torch
if sys.argv[1] == "keep":
    from translate.core.host_memory import keep_freed_memory
    assert keep_freed_memory()
def update(n):
    a = torch.ones(n); b = torch.ones(n // 2); del a; c = torch.ones(n // 3); del b, c
largest = 64 * 1024 * 1024  # floats: 256 MB
update(largest); update(largest)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
random.seed(0)
for _ in range(8):
    update(random.randint(largest // 2, largest))
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def page_faults(mode: str) -> int:
    result = run([sys.executable, "-c", PROBE, mode], check=True)
    return int(result.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_freed_blocks_are_reused_without_page_faults():
    default = page_faults("default")
    assert default > 8 * 256 * 1024 * 1024 // 4096  # the control: glibc maps large blocks afresh each time
    assert page_faults("keep") < default // 4  # some growth remains: the heap fragments


# One epoch of the SMALL model over Multi30k's 29k training pairs (not its dev split) in bf16 is
# 555 updates and meets about 5,800 compiled products (389 batch shapes): more than oneDNN's and
# ideep's default 1,024, which then compile about 11,000 again in each later epoch.
EPOCH = 555
MANY_SHAPES = [o for o in SMALL if not o.startswith(("data.train_split=", "train.precision=", "train.max_steps=",
                                                      "train.log_every="))] + [
    "train.precision=bf16", "train.threads=2", "valid.every_steps=0", "checkpoint.every_steps=100000",
    "checkpoint.every_minutes=null"]


@pytest.mark.skipif(not native_bf16(), reason="bf16 products in hardware (AMX, AVX512-BF16): oneDNN's compiled kernels")
@pytest.mark.slow  # make test-slow: it keeps the default suite under 10 minutes
def test_bf16_training_compiles_each_product_once_and_its_memory_stays_flat(tmp_path):
    """Two epochs in bf16 (ONEDNN_VERBOSE lists every compiled product): after the first, no
    product is compiled again and the peak memory stays where the first epoch left it."""
    need(MULTI30K)
    result = run_cli("train", *MANY_SHAPES, f"train.max_steps={2 * EPOCH}", f"train.log_every={EPOCH}",
                     f"run_dir={tmp_path / 'run'}", f"data.cache_dir={tmp_path / 'cache'}",
                     env=dict(os.environ, ONEDNN_VERBOSE="profile_create"), stderr=subprocess.STDOUT, check=True)
    epochs = result.stdout.split(f"update {EPOCH}:")  # oneDNN's lines, then this update's log line, ...
    assert len(epochs) == 2, result.stdout[-2000:]
    assert epochs[0].count("create:cache_miss") > 1024  # more than the default caches hold
    assert epochs[1].count("create:cache_miss") == 0  # without keep_compiled_products, about 11,000
    peaks = [float(gb) for gb in re.findall(r" mem ([0-9.]+) GB", result.stdout)]  # at updates 555 and 1,110
    assert len(peaks) == 2 and peaks[1] <= peaks[0] * 1.05, peaks


def test_compiled_products_kept_unless_the_user_says_otherwise(monkeypatch):
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "256")
    keep_compiled_products()
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == str(COMPILED_PRODUCTS)
    assert os.environ["LRU_CACHE_CAPACITY"] == "256"
