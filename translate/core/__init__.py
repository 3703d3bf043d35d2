"""The foundations every other module stands on: the typed configuration (config) and its fixed
sets of values (choices), Table 3's rows as overrides (variants), errors that reach the user as
one line (errors), the files of a run_dir and the atomic write (paths), fp32/bf16/fp16 (precision),
host memory (host_memory), the run's JSON record (run_record) and the typed JSON objects it and
the data report are (json_fields).

Imports nothing of translate outside this package, and never Hydra or the model.
"""
