#!/usr/bin/env bash
# One seed of a preset, by the README's chain and nothing else: `translate train`, `tune` (alpha
# on the dev split), then each held-out test split decoded and scored once by `translate decode`
# and `translate bleu`, all with the same config=. Every score is written by bleu into the run's
# record (RUN_DIR/run_record.json); scripts/results_tables.py makes the tables from there.
#
#   scripts/preset_chain.sh multi30k_lowercase 5 /work/runs/multi30k_lowercase-seed5
#   scripts/preset_chain.sh multi30k_en_fr_lowercase 5 RUN_DIR "test test_2017_flickr"
#
# SPLITS (4th argument) defaults to Multi30k's four test splits; PYTHON to the checkout's .venv.
# TRAIN_ARGS="train.threads=N" sets `translate train`'s threads, which change how fast it runs, not
# the recipe (e.g. 1, for two seeds at once, a core each); machine.txt and the record keep it.
# Refuses a RUN_DIR that exists: a seed is run once, and its test splits scored once.
set -euo pipefail
# All in one function, called on the last line: bash reads a script as it runs it, so an edit to this
# file during an hour's training would have the rest of the run read the edited text at the old offset.
main() {
    if [[ $# -lt 3 ]]; then
        sed -n '2,13p' "$0" >&2
        exit 2
    fi
    config=$1 seed=$2 run_dir=$3
    splits=${4:-test test_2017_flickr test_2017_mscoco test_2018_flickr}
    python=${PYTHON:-$(dirname "$0")/../.venv/bin/python}
    read -r -a train_args <<<"${TRAIN_ARGS:-}"
    for arg in ${train_args[@]+"${train_args[@]}"}; do
        # Only how many cores it uses: anything that changes the recipe would not be the preset's chain.
        [[ $arg == train.threads=* ]] || { echo "preset_chain: TRAIN_ARGS takes train.threads only, not $arg" >&2; exit 2; }
    done
    source "$(dirname "$0")/machine_txt.sh"
    new_run_dir preset_chain "$run_dir" "a seed's test splits are scored once: give a new RUN_DIR"
    # The machine, the commit and any ISA the environment forces down (the AVX2 hour's).
    machine_txt "$(dirname "$0")" >"$run_dir/machine.txt"
    common=("config=$config" "run_dir=$run_dir")
    "$python" -m translate train "${common[@]}" "train.seed=$seed" ${train_args[@]+"${train_args[@]}"}
    "$python" -m translate tune "${common[@]}"
    for split in $splits; do
        "$python" -m translate decode "${common[@]}" "decode.split=$split"
        "$python" -m translate bleu "${common[@]}" "decode.split=$split"
    done
}
main "$@"; exit
