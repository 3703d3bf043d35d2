"""Data: loading (datasets or text files), sentencepiece vocabulary, token cache, batching."""
