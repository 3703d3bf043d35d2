"""translate.training.host_memory: freed host memory is reused, not faulted in again page by page."""

import sys

import pytest

from tests.conftest import run

# Page faults of an update-like pattern of large blocks (three tensors of varying size, none
# larger than the first updates'), after two updates at the largest size.
PROBE = """
import random, resource, sys, torch
if sys.argv[1] == "keep":
    from translate.training.host_memory import keep_freed_memory
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
