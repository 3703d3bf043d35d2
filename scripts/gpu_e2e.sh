#!/bin/bash
# End-to-end check of the CLI on a GPU machine without Hydra or datasets installed:
# translate train (bf16, eager), decode (beam 4) and bleu with one preset, then
# train.compile=true with another under torchrun (one process: torchrun's device choice and
# the compiled objective; one GPU cannot hold two NCCL ranks, so no process group), on
# Multi30k exported to plain text.
#
# Here (once):  echo /.whl/ >> .git/info/exclude; echo /.devdata/ >> .git/info/exclude
#   .venv/bin/pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform any -d .whl hydra-core==1.3.8 omegaconf==2.3.1 sacremoses==0.2.0
#   .venv/bin/pip wheel --no-deps -w .whl antlr4-python3-runtime==4.9.3
#   bash scripts/gpu_e2e.sh --export .devdata        # Multi30k (../shared/data) as text files
# There (carry .whl and .devdata):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#   PYTHONPATH=/tmp/site:$PWD bash scripts/gpu_e2e.sh .devdata tiny 1.0 base 2.5 $OUT
# (the demo's recipe, then config=base as it is, compiled; with 400 warmup updates instead
# of the paper's 4,000, base's loss once stalled at 6.6 here: post-norm at 3x the peak rate.)
set -o pipefail
if [ "$1" = "--export" ]; then
    mkdir -p "$2" && .venv/bin/python - "$2" <<'PY'
import sys, datasets
for split, name in [("train", "train"), ("validation", "valid"), ("test", "test")]:
    rows = datasets.load_dataset("../shared/data/multi30k", "de-en", split=split)["translation"]
    for lang in ("en", "de"):
        open(f"{sys.argv[1]}/{name}.{lang}", "w").write("\n".join(r[lang] for r in rows) + "\n")
PY
    exit
fi
DATA=$1; CONFIG=$2; MINUTES=$3; COMPILE_CONFIG=$4; COMPILE_MINUTES=$5; OUTD=$6; shift 6
export PYTHONUNBUFFERED=1
RUNS=$(mktemp -d)  # fresh run directories: never resume or refuse an earlier run's checkpoint
# Whole logs, line by line (no tail): a run cut short by a timeout still leaves what it printed.
DATA_ARGS="data=text data.train=$DATA/train data.valid=$DATA/valid data.test=$DATA/test data.cache_dir=$RUNS/cache $*"
COMMON="config=$CONFIG $DATA_ARGS"
python3 -m translate train $COMMON run_dir=$RUNS/run train.max_minutes=$MINUTES 2>&1 | grep --line-buffered -v Warning > $OUTD/train.log
python3 -m translate decode $COMMON run_dir=$RUNS/run 2>&1 | grep --line-buffered -v Warning > $OUTD/decode.log
python3 -m translate bleu $COMMON run_dir=$RUNS/run 2>&1 | tee $OUTD/bleu.log
python3 -m torch.distributed.run --standalone --nproc_per_node=1 -m translate train config=$COMPILE_CONFIG $DATA_ARGS \
    run_dir=$RUNS/compiled train.compile=true train.max_minutes=$COMPILE_MINUTES 2>&1 | grep --line-buffered -v Warning > $OUTD/train_compiled.log
tail -n 3 $OUTD/train.log $OUTD/decode.log $OUTD/train_compiled.log
