"""translate: the Transformer of "Attention Is All You Need", trained, decoded and scored."""

__version__ = "0.1.0"
