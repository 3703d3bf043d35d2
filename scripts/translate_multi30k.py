#!/usr/bin/env python
"""Translate Multi30k's validation and four test sets (4,546 sentences, as one list) with beam
search in-process, and write them to OUTPUT: the outputs of two trees compared with `cmp`. The
`translate` package is whichever is first on the path, so a second tree runs with
PYTHONPATH=<its folder>. Prints the seconds to stderr.

    .venv/bin/python scripts/translate_multi30k.py RUN/checkpoint_last.pt /tmp/new.de
    (cd OLD_TREE && PYTHONPATH=$PWD .../.venv/bin/python .../scripts/translate_multi30k.py RUN/checkpoint_last.pt /tmp/old.de)
    cmp /tmp/new.de /tmp/old.de
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

SPLITS = ["validation", "test", "test_2017_flickr", "test_2018_flickr", "test_2017_mscoco"]
MULTI30K = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "multi30k"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("output")
    parser.add_argument("--config", default="tiny", help="preset whose decode settings are used")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    from translate.data.loading import load_corpus
    from translate.hydra_cli import load_config
    from translate.translator import Translator

    cfg = load_config("decode", [f"config={args.config}", f"decode.checkpoint={args.checkpoint}", f"data.path={MULTI30K}"])
    sources = [s for split in SPLITS for s in load_corpus(cfg.data, split).pairs()[0]]
    translator = Translator.from_checkpoint(Path(args.checkpoint))
    started = time.perf_counter()
    outputs = translator.translate(sources, cfg.decode)
    Path(args.output).write_text("\n".join(outputs) + "\n", encoding="utf-8")
    print(f"{args.output}: {len(sources)} sentences in {time.perf_counter() - started:.2f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
