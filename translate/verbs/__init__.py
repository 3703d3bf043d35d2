"""The verbs, side by side: one module each (`translate bleu` is verbs/bleu.py), each a function
of the typed TranslateConfig that the command line (translate.cli) imports only when its verb
runs. A verb uses the parts, the engines and the foundations below it, never another verb; only
the train verb imports translate.training.
"""
