"""Data: parallel corpora from `datasets` or plain text (loading), the joint sentencepiece
vocabulary (vocabulary), the token cache on disk (cache) with its data report (report), and its
preparation (preparation: cleaning, vocabulary training, encoding; `translate prepare` and
`translate train` run it), and batches by token budget (batching), with progress lines for long
passes (progress).

May import translate.core.config, translate.core.errors, translate.core.paths and
translate.core.json_fields; nothing of the model, training or export, and never Hydra.
"""
