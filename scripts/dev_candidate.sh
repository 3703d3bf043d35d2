#!/usr/bin/env bash
# One seed of a recipe candidate, on the dev split only (issue 53: a recipe is chosen on dev, never on
# a test split): `translate train` with the candidate's overrides, then `translate tune` (alpha on dev),
# both with the same config=. No test split is decoded. Beside the run's record, machine.txt keeps
# lscpu, the commit, any ISA forced down, uncommitted changes, the command and its hours; scripts/dev_candidates.py reads the
# records. Run the baseline the same way (no overrides) on the same seed, one after the other, alone.
#
#   scripts/dev_candidate.sh multi30k_lowercase 14 /work/runs/frozen-seed14
#   scripts/dev_candidate.sh multi30k_lowercase 14 /work/runs/layers6-seed14 model.layers=6
#   scripts/dev_candidate.sh multi30k_lowercase 14 /work/runs/v4000-seed14 data.vocab_size=4000 tune.extend_to=5
#
# Overrides of tune.* go to `translate tune`, the rest to `translate train`. PYTHON defaults to the
# checkout's .venv. Refuses a RUN_DIR that exists (a candidate's seed runs once).
set -euo pipefail
# In one function called on the last line, as preset_chain.sh: an edit during the hour cannot change the rest.
main() {
    [[ $# -ge 3 ]] || { sed -n '2,13p' "$0" >&2; exit 2; }  # the usage above
    config=$1 seed=$2 run_dir=$3
    shift 3
    python=${PYTHON:-$(dirname "$0")/../.venv/bin/python}
    train_args=() tune_args=()
    for arg in "$@"; do
        # The config, the seed and the folder are the script's arguments; given again, the run would not be the one named.
        [[ $arg == train.seed=* || $arg == run_dir=* || $arg == config=* ]] && { echo "dev_candidate: $arg is set by the script's arguments" >&2; exit 2; }
        # train would take tune.* and keep it unused in its config: tune, a process of its own, is the verb that reads it.
        if [[ $arg == tune.* ]]; then tune_args+=("$arg"); else train_args+=("$arg"); fi
    done
    checkout=$(dirname "$0")
    source "$checkout/machine_txt.sh"
    new_run_dir dev_candidate "$run_dir" "give a new RUN_DIR"
    common=("config=$config" "run_dir=$run_dir")
    { machine_txt "$checkout"; git -C "$checkout" -c status.relativePaths=false status --short | sed 's/^/uncommitted: /'
      echo "command: translate train ${common[*]} ${train_args[*]} train.seed=$seed && translate tune ${common[*]} ${tune_args[*]}; dev only, no test split decoded"
      echo "started: $(date -u '+%Y-%m-%d %H:%M UTC')"; } >"$run_dir/machine.txt"
    "$python" -m translate train "${common[@]}" ${train_args[@]+"${train_args[@]}"} "train.seed=$seed"
    "$python" -m translate tune "${common[@]}" ${tune_args[@]+"${tune_args[@]}"}
    echo "ended: $(date -u '+%Y-%m-%d %H:%M UTC')" >>"$run_dir/machine.txt"
}
main "$@"; exit
