#!/bin/bash
# The whole GPU check of the training engine in one device call (about 9 minutes on one H200: timeout_s=600),
# each part under its own timeout so that one stuck part leaves the others' results:
#   1. bench_gpu: big (compiled) and base (eager) at 25k tokens, the loop's lagged host reads
#      side by side with a host wait every update; base and big at the 8-GPU share (3,125).
#   2. gpu_e2e.sh: the CLI on Multi30k: the demo's recipe (train bf16, decode, bleu), then
#      config=base as it is (the paper's warmup) with train.compile=true under torchrun: its
#      loss must fall well below the 6.5-6.7 where base with a tenth of the warmup stalled.
# Here, once: the wheel and data steps in gpu_e2e.sh's header. There (carry .whl and .devdata):
#   bash scripts/gpu_check.sh $OUT
OUTD=${1:?usage: gpu_check.sh OUT_DIR}
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
B="python3 scripts/bench_gpu.py --steps 30 --warmup 6"
timeout 150 $B --models big --tokens 25000 --compile --host-reads lagged immediate 2>&1 | grep -v -i warn | tee -a $OUTD/bench.jsonl
timeout 60 $B --models base --tokens 25000 --host-reads lagged immediate 2>&1 | grep -v -i warn | tee -a $OUTD/bench.jsonl
timeout 45 $B --models base big --tokens 3125 2>&1 | grep -v -i warn | tee -a $OUTD/bench.jsonl
timeout 270 bash scripts/gpu_e2e.sh .devdata tiny 0.75 base 2.5 $OUTD
