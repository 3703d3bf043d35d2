"""The `translate decode` verb: beam search over a dataset split or a text file."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence

import torch

from translate import averaging
from translate.core import paths, run_record
from translate.core.command_line import CommandLine
from translate.core.config import DecodeConfig, TranslateConfig
from translate.core.errors import TranslateError
from translate.core.run_record import Decoded, Machine, Weights
from translate.data.loading import load_corpus, read_lines, text_line
from translate.search import Hypothesis
from translate.translator import Decoding, Translator

log = logging.getLogger("translate.verbs.decode")


def write_lines(path: Path, lines: Sequence[str]) -> None:
    """Write a line per entry, atomically (paths.atomic_write): a failure never leaves a
    half-written file in place of an old one."""
    with paths.atomic_write(path) as file:
        file.writelines(line.replace("\r", " ").replace("\n", " ") + "\n" for line in lines)  # a line each


def format_output(translator: Translator, results: List[List[Hypothesis]], nbest: int, first_index: int = 0) -> List[str]:
    """One line per sentence; with nbest > 1, `index<TAB>score<TAB>text` for each hypothesis."""
    if nbest == 1:
        return translator.vocabulary.to_text([hypotheses[0].tokens for hypotheses in results])
    lines = []
    for index, hypotheses in enumerate(results, first_index):
        texts = translator.vocabulary.to_text([h.tokens for h in hypotheses[:nbest]])
        lines.extend(f"{index}\t{h.score:.4f}\t{text}" for h, text in zip(hypotheses, texts))
    return lines


def decode(cfg: TranslateConfig, command: Optional[CommandLine] = None) -> Optional[Path]:
    """Translate decode.input (a file, or - for stdin to stdout) or the decode.split of the
    data; returns the output path. The length penalty: the command line's, else the one tune
    chose for the weights, else the configuration's (Translator.decoding)."""
    checkpoint = averaging.chosen_checkpoint(cfg)
    translator = Translator.from_checkpoint(checkpoint)
    decoding = translator.decoding(cfg.decode, command)
    settings = decoding.settings
    wanted = [cfg.data.src_lang, cfg.data.tgt_lang]
    if translator.languages and list(translator.languages) != wanted:
        src, tgt = translator.languages
        raise TranslateError(f"the checkpoint translates {src}->{tgt}, but the data asks for {wanted[0]}->{wanted[1]}")
    if cfg.decode.input == "-":
        _stream(translator, settings)
        return None
    references: Optional[List[str]] = None
    if cfg.decode.input:
        sources = read_lines(cfg.decode.input)
        what = cfg.decode.input
    else:
        corpus = load_corpus(cfg.data, cfg.decode.split)
        sources, references = corpus.pairs()
        references = translator.references(references)
        what = corpus.description
    output = paths.decode_output(cfg)
    if cfg.decode.input and output.resolve() == Path(cfg.decode.input).resolve():
        raise TranslateError(f"decode.output {output} would overwrite the input")
    problem = paths.usable_folder(output.parent)  # found before the search, not after it
    if problem:
        raise TranslateError(f"cannot write {output}: {problem}")
    method = "sampling" if settings.sampling else f"beam {settings.beam_size}, alpha {settings.length_penalty}"
    method = ("bf16, " if translator.in_bf16(settings) else "") + method
    log.info(f"translating {len(sources):,} sentences of {what} ({method})")
    started = time.monotonic()
    results = translator.search(sources, settings)
    seconds = time.monotonic() - started
    write_lines(output, format_output(translator, results, settings.nbest))
    if references is not None:
        write_lines(paths.decode_reference(cfg), references)
    record_decoded(translator, checkpoint, decoding, None if cfg.decode.input else cfg.decode.split, output)
    tokens = sum(len(hypotheses[0].tokens) + 1 for hypotheses in results)
    log.info(
        f"wrote {output}: {len(sources) / seconds:.1f} sentences/s, {tokens / seconds:.0f} target tokens/s "
        f"({seconds:.1f} s, {torch.get_num_threads()} threads)"
    )
    return output


def record_decoded(translator: Translator, checkpoint: Path, decoding: Decoding, split: Optional[str],
                   output: Path) -> None:
    """Beside the output, what was translated with what (run_record.Decoded): bleu puts it in the
    run record with the score, so that a score names the weights and search it is of."""
    identity, settings = translator.identity, decoding.settings
    assert identity is not None  # read from a checkpoint
    device = translator.device
    Decoded(checkpoint=str(checkpoint), weights=Weights(update=identity.update, averaged=list(identity.averaged),
                                                        fingerprint=identity.fingerprint),
            split=split, beam_size=settings.beam_size, length_penalty=settings.length_penalty,
            length_penalty_origin=decoding.length_penalty_origin, sampling=settings.sampling,
            decode_precision="bf16" if translator.in_bf16(settings) else "fp32", commit=run_record.code_version(),
            machine=Machine.here(torch.cuda.get_device_name(device) if device.type == "cuda" else device.type),
            decoded_at=run_record.utc_now(), output_hash=run_record.file_hash(output)).write(output)


def _stream(translator: Translator, settings: DecodeConfig) -> None:
    """Interactive use: each line from stdin is translated and printed at once. Lines end at
    \n alone, as in files (text mode would also end them at a lone \r)."""
    for index, raw in enumerate(sys.stdin.buffer):
        line = text_line(raw, Path("<stdin>"), index + 1)
        results = translator.search([line], settings, first_line=index + 1)
        for text in format_output(translator, results, settings.nbest, first_index=index):
            print(text.replace("\n", " "), flush=True)
