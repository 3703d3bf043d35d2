"""The `translate plot` verb: figures of a checkpoint or of runs (drawn by translate.figures).

plot.kind=attention runs a checkpoint on one sentence and draws its encoder self-attention
(every head in its own colour, as the paper's Figure 3, and a panel per head, as Figures 4
and 5) and its encoder-decoder attention over the decoded translation (a panel per head).
plot.kind=curves draws runs' training loss, dev perplexity and dev BLEU against updates and
minutes, from the TensorBoard events train writes (the run record keeps only the last
validation).

Every figure's values are written beside it (<stem>.npz and <stem>.json), so that users and
tests can check what is drawn.
"""

from __future__ import annotations

import logging
import math
import os
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

import numpy as np
import torch

from translate import averaging, figures
from translate.attention_maps import attention_maps
from translate.core import paths, run_record
from translate.core.choices import PlotKind
from translate.core.command_line import CommandLine
from translate.core.config import DecodeConfig, PlotConfig, TranslateConfig
from translate.core.errors import TranslateError
from translate.data.loading import read_lines
from translate.translator import Decoding, Translator

log = logging.getLogger("translate.verbs.plot")

# The source sentence of the paper's Figure 3 (its layer 5 of 6 follows "making ... more difficult").
PAPER_SENTENCE = ("It is in this spirit that a majority of American governments have passed new laws since 2009 "
                  "making the registration or voting process more difficult.")


class Metric(NamedTuple):
    """What curves of runs draw of one TensorBoard scalar."""

    tag: str  # as train writes it
    key: str  # its name in <stem>.json (as translate table's column)
    label: str  # the axis
    shown: Callable[[float], float]  # the value drawn, of the value recorded


RUN_METRICS = [Metric("train/loss", "train_loss", "training loss (label-smoothed)", float),
               Metric("dev/nll", "dev_ppl", "dev perplexity", math.exp),
               Metric("dev/bleu", "dev_bleu", "dev BLEU (greedy)", float)]


@dataclass
class Points:
    """A run's values of one metric, at each update it was recorded."""

    updates: List[int] = field(default_factory=list)
    minutes: List[float] = field(default_factory=list)  # training wall time to it (pauses between resumes left out)
    values: List[float] = field(default_factory=list)


def recorded(run: Path) -> Dict[str, Points]:
    """The run's RUN_METRICS as its TensorBoard events hold them, by key. Each training of the
    run_dir (a resume) writes a file of its own: its minutes start where the last one's ended,
    and its points replace those of the last one from its first update on."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    # events.out.tfevents.<second opened>.<host>...: one file per training, oldest first
    files = sorted(paths.tensorboard(run).glob("events.out.tfevents.*"), key=lambda p: (int(p.name.split(".")[3]), p.name))
    if not files:
        raise TranslateError(f"{run} has no TensorBoard events in {paths.tensorboard(run)}: the curves come from them")
    found = {metric.key: Points() for metric in RUN_METRICS}
    offset = 0.0  # minutes of the earlier trainings
    for events in files:
        accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0})  # 0: every point
        accumulator.Reload()
        tags = set(accumulator.Tags()["scalars"])
        start = end = accumulator.FirstEventTimestamp() if tags else 0.0
        for metric in RUN_METRICS:
            scalars = accumulator.Scalars(metric.tag) if metric.tag in tags else []
            if scalars:
                minutes = [offset + (s.wall_time - start) / 60 for s in scalars]
                _extend(found[metric.key], [(s.step, m, metric.shown(s.value)) for s, m in zip(scalars, minutes)])
                end = max(end, scalars[-1].wall_time)
        offset += (end - start) / 60
    return found


def _extend(points: Points, new: List[Tuple[int, float, float]]) -> None:
    """Append a resumed training's points, dropping the earlier ones from its first update on."""
    keep = sum(1 for update in points.updates if update < new[0][0])
    points.updates[keep:], points.minutes[keep:], points.values[keep:] = (list(column) for column in zip(*new))


def run_curves(cfg: TranslateConfig, size: figures.Size) -> List[Path]:
    """The curves of plot.runs (or of run_dir): each metric against updates (top row) and
    minutes (bottom row), a line per run; the points beside the figure as <stem>.json."""
    runs = run_record.run_dirs(cfg.plot.runs or [cfg.run_dir])
    values = {str(run): recorded(run) for run in runs}
    panels = [figures.Panel(x_label, m.label, [figures.Series(run, getattr(p[m.key], x), p[m.key].values)
                                               for run, p in values.items()])
              for x, x_label in (("updates", "updates"), ("minutes", "training minutes")) for m in RUN_METRICS]
    output = paths.plot_output(cfg)
    title = f"{len(runs)} run{'s' if len(runs) > 1 else ''}: " + ", ".join(values)
    if len(title) > 120:  # too long for one line: the folder they share
        title = f"{len(runs)} runs in {os.path.commonpath([str(run.resolve()) for run in runs])}"
    figure = figures.curve_panels(panels, output, title, size, columns=len(RUN_METRICS))
    described = {m.key: f"{m.label}, from TensorBoard's {m.tag}" for m in RUN_METRICS}
    points = {run: {key: vars(p) for key, p in metrics.items()} for run, metrics in values.items()}
    return [figure, figures.write_json(paths.beside(output, ".json"), {"metrics": described, "runs": points})]


def _sentence(settings: PlotConfig) -> str:
    """plot.sentence, or line plot.line of plot.input, or the paper's Figure 3 sentence."""
    if settings.input is None:
        return PAPER_SENTENCE if settings.sentence is None else settings.sentence
    lines = read_lines(settings.input)
    if settings.line > len(lines):
        raise TranslateError(f"plot.line={settings.line}: {settings.input} has {len(lines)} lines")
    return lines[settings.line - 1]


def _layer(settings: PlotConfig, layers: int) -> int:
    if settings.layer > layers:
        plural = "s" if layers > 1 else ""
        raise TranslateError(f"plot.layer={settings.layer}: the model has {layers} layer{plural} (counted from 1)")
    return settings.layer or layers


def attention(translator: Translator, sentence: str, layer: int, settings: DecodeConfig, name: str) -> figures.AttentionFigure:
    """The sentence translated as decode would (settings), then the layer's encoder
    self-attention and encoder-decoder attention of a pass over that translation."""
    specials = translator.vocabulary.specials
    source = translator.encode_sources([sentence], settings.max_source_length)[0] + [specials.eos]
    if len(source) == 1:
        raise TranslateError("the sentence to draw is empty")
    output = translator.search([sentence], settings)[0][0].tokens
    model = translator.model
    with torch.inference_mode():
        maps = attention_maps(model, torch.tensor([source]), torch.tensor([[specials.bos] + output]))
    pieces = translator.vocabulary.piece_names()
    return figures.AttentionFigure(
        checkpoint=name, layer=layer, layers=len(model.encoder_layers), sentence=sentence,
        translation=translator.vocabulary.to_text([output])[0], source=[pieces[i] for i in source],
        target=[pieces[i] for i in output + [specials.eos]], encoder=maps.encoder[layer - 1][0].float().numpy(),
        cross=maps.cross[layer - 1][0].float().numpy())


# The arrays of <stem>.npz, as <stem>.json describes them.
ARRAYS = {"encoder_self_attention": "(heads, source, source): row i, source piece i's weights over the source",
          "encoder_decoder_attention": "(heads, target, source): row t, the weights that chose target piece t"}


def write_attention(drawn: figures.AttentionFigure, output: Path, size: figures.Size,
                    decoding: Optional[Decoding] = None) -> List[Path]:
    """The three figures (output itself: Figure 3; <stem>.heads.png; <stem>.cross.png) and the
    weights beside them (<stem>.npz, described in <stem>.json with the decode settings that
    translated the sentence, `decoding`)."""
    where = f"{drawn.checkpoint}: {{}}, layer {drawn.layer} of {drawn.layers}"
    translation = textwrap.shorten(drawn.translation, 120)
    written = [
        figures.save(figures.draw_lines(drawn, size), output),
        figures.save(figures.draw_heads(drawn.encoder, drawn.source, drawn.source, where.format("encoder self-attention"),
                        "source piece (query)", size), paths.beside(output, ".heads.png")),
        figures.save(figures.draw_heads(drawn.cross, drawn.target, drawn.source, where.format("encoder-decoder attention")
                        + f"\n→ {translation}", "output piece (query)", size), paths.beside(output, ".cross.png")),
    ]
    with paths.atomic_write(paths.beside(output, ".npz"), binary=True) as file:
        np.savez(file, encoder_self_attention=drawn.encoder, encoder_decoder_attention=drawn.cross)
    shown = ("checkpoint", "layer", "layers", "heads", "sentence", "translation", "source", "target")
    description = {**{key: getattr(drawn, key) for key in shown}, "arrays": ARRAYS}
    if decoding is not None:
        description.update(beam_size=decoding.settings.beam_size, length_penalty=decoding.settings.length_penalty,
                           length_penalty_origin=decoding.length_penalty_origin)
    return written + [paths.beside(output, ".npz"), figures.write_json(paths.beside(output, ".json"), description)]


def attention_figures(cfg: TranslateConfig, size: figures.Size, command: Optional[CommandLine] = None) -> List[Path]:
    """plot.kind=attention: one sentence through plot.checkpoint (default: decode's), translated
    with the decode settings for its weights (Translator.decoding)."""
    sentence = _sentence(cfg.plot)
    source = Path(cfg.plot.checkpoint) if cfg.plot.checkpoint else averaging.chosen_checkpoint(cfg)
    translator = Translator.from_checkpoint(source)
    decoding = translator.decoding(cfg.decode, command)
    layer = _layer(cfg.plot, len(translator.model.encoder_layers))
    drawn = attention(translator, sentence, layer, decoding.settings, str(source))
    return write_attention(drawn, paths.plot_output(cfg), size, decoding)


def plot(cfg: TranslateConfig, command: Optional[CommandLine] = None) -> List[Path]:
    """Draw plot.kind; returns the files written, figures first."""
    figures.matplotlib_parts()  # a missing extra is reported before any work
    size = figures.Size(cfg.plot.width, cfg.plot.height, cfg.plot.dpi)
    written = attention_figures(cfg, size, command) if cfg.plot.kind == PlotKind.attention else run_curves(cfg, size)
    for path in written:
        log.info(f"wrote {path}")
    return written
