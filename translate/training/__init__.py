"""Training: the `translate train` verb and everything its loop needs.

The trainer (set-up, train, clean-up, as a recipe) drives one update at a time: the
forward and backward pass and the optimizer step (update), the label-smoothed loss (loss),
Adam (optim) at the paper's rate (schedule), mixed precision (precision); around the loop:
resuming exactly and stop signals (resume), one training per run_dir (run_lock), dev
metrics (validate), compute accounting (flops), what it logs and records (monitor,
run_record), the processes of a job (distributed) and the host allocator (host_memory).

May import translate's shared modules (config, errors, paths, model, search, decode,
score, checkpoint) and translate.data; never Hydra, nor translate.export. The verbs outside
it use two of its modules: run_record (bleu, table and the model card read and add to the
run's record) and host_memory (decode reuses freed host memory as training does).
"""
