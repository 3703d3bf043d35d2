"""The formats `translate export` writes (translate/verbs/export.py is the verb), one module per target:
CTranslate2 (ctranslate2) and Hugging Face transformers (transformers, with its model card,
model_card), each with the translation function that runs what it wrote.

May import translate's foundations and parts (config, errors, paths, run_record, model,
data.vocabulary) and the Translator; no verb, nothing of training, and never Hydra. The
targets' own libraries are imported only when a target is written or run, so that the rest
of translate works without them.
"""
