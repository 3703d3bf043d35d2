"""Training: the Trainer, which the `translate train` verb (translate/verbs/train.py) runs, and every
part of its loop.

The trainer (set-up, train, clean-up, as a recipe) drives one update at a time: the
forward and backward pass and the optimizer step (update), the label-smoothed loss (loss),
Adam (optim) at the paper's rate (schedule); around the loop: resuming exactly (resume), stop
signals (stop_signals), train.max_minutes and its projected end (time_limit), one training per
run_dir (run_lock), dev metrics and when to stop (validate), compute accounting (flops), what
it logs and records (monitor) and the processes of a job (distributed).

May import translate's foundations (config, errors, paths, precision, host_memory,
run_record), its parts (model, search, checkpoint, metrics, data) and the Translator; no verb,
and never Hydra. Only the train verb imports this package.
"""
