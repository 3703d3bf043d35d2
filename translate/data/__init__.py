"""Data: parallel corpora from `datasets` or plain text (loading), the joint sentencepiece
vocabulary (vocabulary), the token cache on disk (cache) and its data report (report) that the
`translate prepare` verb builds (prepare: cleaning, vocabulary training, encoding), and batches
by token budget (batching), with progress lines for long passes (progress).

May import translate.core.config, translate.core.errors, translate.core.paths and
translate.core.json_fields; nothing of the model, training or export, and never Hydra.
"""
