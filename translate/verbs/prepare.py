"""The `translate prepare` verb: the corpus cleaned, the vocabulary built and the corpus encoded
into the token cache once (translate.data.preparation; `translate train` does it too when nothing
is cached), with the data report in run_dir."""

from __future__ import annotations

import logging
from pathlib import Path

from translate.core import paths
from translate.core.config import TranslateConfig
from translate.data import preparation


def prepare(cfg: TranslateConfig) -> Path:
    """`translate prepare`: build (or find) the cache and put its data report in run_dir."""
    data = preparation.prepare(cfg.data, log=logging.getLogger("translate.verbs.prepare").info)
    destination = paths.data_report(Path(cfg.run_dir))
    preparation.write_report(data, destination)
    print(data.report.summary() + f"\nreport: {destination}  cache: {data.folder}")
    return destination
