"""Export: the `translate export` verb (verb) and one module per target it writes:
CTranslate2 (ctranslate2) and Hugging Face transformers (transformers, with its model card,
model_card).

May import translate's shared modules (config, errors, checkpoint, decode's Translator),
translate.data.vocabulary and the run record (translate.training.run_record); nothing of the
training loop, and never Hydra. The targets' own libraries are imported only when a target
is written or run, so that the rest of translate works without them.
"""
