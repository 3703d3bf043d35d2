# Sourced by preset_chain.sh and dev_candidate.sh: the head of a run's machine.txt, one writer for both.
# machine_txt CHECKOUT prints lscpu, the checkout's commit, and any ISA the environment forces down (the
# AVX2 hour's) or TRAIN_ARGS: what makes a run's hour this machine's and not another's.
machine_txt() {
    lscpu
    echo "commit $(git -C "$1" rev-parse HEAD)"
    env | grep -E '^(ATEN_CPU_CAPABILITY|ONEDNN_MAX_CPU_ISA|DNNL_MAX_CPU_ISA|MKL_ENABLE_INSTRUCTIONS|TRAIN_ARGS)=' || true
}
