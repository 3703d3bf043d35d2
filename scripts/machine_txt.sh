# Sourced by preset_chain.sh and dev_candidate.sh: the run folder's claim and the head of its
# machine.txt, one writer for both.
# machine_txt CHECKOUT prints lscpu, the checkout's commit, and any ISA the environment forces down (the
# AVX2 hour's) or TRAIN_ARGS: what makes a run's hour this machine's and not another's.
machine_txt() {
    lscpu
    echo "commit $(git -C "$1" rev-parse HEAD)"
    env | grep -E '^(ATEN_CPU_CAPABILITY|ONEDNN_MAX_CPU_ISA|DNNL_MAX_CPU_ISA|MKL_ENABLE_INSTRUCTIONS|TRAIN_ARGS)=' || true
}

# new_run_dir SCRIPT RUN_DIR WHY makes RUN_DIR, or, where it exists, says so with WHY and exits 1: a
# seed runs once into a folder of its own, and nothing of an earlier run is written over.
new_run_dir() {
    if [[ -e $2 ]]; then
        echo "$1: $2 exists; $3" >&2
        exit 1
    fi
    mkdir -p "$2"
}
