"""The `translate export` verb: a checkpoint as a CTranslate2 model (translate.formats.ctranslate2)
or as a Hugging Face transformers model (translate.formats.transformers), written into a staging
folder and swapped in whole, so that a reader never sees half an export.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Optional

from translate import averaging
from translate.core import paths
from translate.core.choices import ExportFormat
from translate.core.command_line import CommandLine
from translate.core.config import TranslateConfig
from translate.core.errors import TranslateError
from translate.translator import Translator  # the same loading and checks as decode

log = logging.getLogger("translate.verbs.export")


def export(cfg: TranslateConfig, command: Optional[CommandLine] = None) -> Path:
    """Export the checkpoint decode would use (or export.checkpoint), with the decode settings
    for its weights (Translator.decoding: the alpha tune chose for them, unless the command line
    gives one); returns the folder."""
    output = paths.export_dir(cfg)
    if output.exists() and not _replaceable(output):
        raise TranslateError(f"export.output {output} exists and is not a translate export; choose another folder")
    source = Path(cfg.export.checkpoint) if cfg.export.checkpoint else averaging.chosen_checkpoint(cfg)
    translator = Translator.from_checkpoint(source)
    decoding = translator.decoding(cfg.decode, command)
    if translator.lowercase:
        log.warning(f"{source} was trained on lowercased text (data.lowercase): the export does not lowercase "
                    "its input as translate decode does; lowercase it first (the marker and model card say so)")
    problem = paths.usable_folder(output.parent)
    if problem:
        raise TranslateError(f"export.output {output}: {problem}")
    with paths.atomic_folder(output, "the export") as staging:
        if cfg.export.format == ExportFormat.transformers:
            from translate.formats.transformers import write_transformers

            write_transformers(translator, staging, decoding, run_dir=source.parent)
        else:
            from translate.formats.ctranslate2 import write_ctranslate2

            write_ctranslate2(translator, staging, decoding)
        marker = {"format": str(cfg.export.format), "checkpoint": str(source.resolve()),
                  "languages": list(translator.languages or []), "specials": translator.vocabulary.specials.as_dict(),
                  "max_source_length": cfg.decode.max_source_length, "lowercase": translator.lowercase,
                  "beam_size": decoding.settings.beam_size, "length_penalty": decoding.settings.length_penalty,
                  "length_penalty_origin": decoding.length_penalty_origin}
        (staging / paths.EXPORT_MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
    log.info(f"wrote {output}: {cfg.export.format} model of {source}")
    return output


def _replaceable(folder: Path) -> bool:
    """An empty folder or one of our own previous exports."""
    return folder.is_dir() and (not any(folder.iterdir()) or (folder / paths.EXPORT_MARKER).is_file())

