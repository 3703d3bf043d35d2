"""The `translate plot` verb, and the one module that draws figures.

plot.kind=attention runs a checkpoint on one sentence and draws its encoder self-attention
(every head in its own colour, as the paper's Figure 3, and a panel per head, as Figures 4
and 5) and its encoder-decoder attention over the decoded translation (a panel per head).
plot.kind=curves draws runs' training loss, dev perplexity and dev BLEU against updates and
minutes, from the TensorBoard events train writes (the run record keeps only the last
validation). curves() and curve_panels() draw any other curves (a benchmark's), spreads() means
over seeds with their error bars (the miniature Table 3's).

Every figure's values are written beside it (<stem>.npz and <stem>.json), so that users and
tests can check what is drawn. matplotlib (the `plot` extra) is imported only here, when a
figure is drawn, on its Agg canvas: no display, no pyplot state.
"""

from __future__ import annotations

import json
import logging
import math
import os
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch

from translate import checkpoint, paths
from translate.compare import run_dirs
from translate.config import PlotConfig, PlotKind, TranslateConfig
from translate.data.loading import read_lines
from translate.decode import Translator
from translate.errors import TranslateError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

log = logging.getLogger("translate.plot")

# The source sentence of the paper's Figure 3 (its layer 5 of 6 follows "making ... more difficult").
PAPER_SENTENCE = ("It is in this spirit that a majority of American governments have passed new laws since 2009 "
                  "making the registration or voting process more difficult.")
EXTRA = "pip install -e '.[plot]'"  # the optional extra that brings matplotlib


@dataclass
class Size:
    """A figure's size: width x height pixels; dpi sets the scale of the text."""

    width: int = 1600
    height: int = 1200
    dpi: int = 100


@dataclass
class Series:
    """One line of a panel: its legend entry and its points."""

    label: str  # a run, a trainer
    x: Sequence[float]
    y: Sequence[float]


@dataclass
class Panel:
    """One pair of axes: labelled axes and the lines drawn on them."""

    x_label: str
    y_label: str
    series: List[Series] = field(default_factory=list)
    title: str = ""


def _matplotlib() -> Tuple[Any, Any]:
    """matplotlib's Figure class and its Agg canvas; one line naming the extra where it is missing."""
    try:  # `import a.b` imports `a` itself first, so a blocked matplotlib fails here even after a first use
        import matplotlib.backends.backend_agg as agg
        import matplotlib.figure
    except ImportError:
        raise TranslateError(f"drawing needs matplotlib, which the plot extra installs: {EXTRA}") from None
    return matplotlib.figure.Figure, agg.FigureCanvasAgg


def new_figure(size: Size) -> "Figure":
    """An empty matplotlib Figure of `size`, laid out so that labels are not cut."""
    figure_class, canvas = _matplotlib()
    figure = figure_class(figsize=(size.width / size.dpi, size.height / size.dpi), dpi=size.dpi, layout="constrained")
    canvas(figure)
    return figure


def save(figure: "Figure", path: Path) -> Path:
    """The figure as a PNG of exactly its size, written atomically."""
    with paths.atomic_write(path, binary=True) as file:
        figure.savefig(file, format="png", dpi=figure.dpi)
    return path


def write_json(path: Path, values: Dict[str, Any]) -> Path:
    with paths.atomic_write(path) as file:
        file.write(json.dumps(values, indent=2, ensure_ascii=False) + "\n")
    return path


# Curves.


def curves(series: Sequence[Series], path: Path, x_label: str, y_label: str, title: str = "",
           size: Optional[Size] = None) -> Path:
    """One panel of lines (one per series, with a legend) as a PNG at `path`; returns it."""
    return curve_panels([Panel(x_label, y_label, list(series))], path, title, size, columns=1)


def curve_panels(panels: Sequence[Panel], path: Path, title: str = "", size: Optional[Size] = None,
                 columns: int = 2) -> Path:
    """Several panels of lines, `columns` to a row, as one PNG at `path`; returns it. A panel
    with no points says so instead of showing empty axes."""
    figure = new_figure(size or Size())
    rows = math.ceil(len(panels) / columns)
    for index, panel in enumerate(panels):
        axes = figure.add_subplot(rows, columns, index + 1)
        drawn = [s for s in panel.series if len(s.x)]
        for line in drawn:
            axes.plot(line.x, line.y, marker="." if len(line.x) < 30 else None, label=line.label)
        if drawn:
            axes.legend(fontsize="small")
        else:
            axes.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=axes.transAxes)
        axes.set(xlabel=panel.x_label, ylabel=panel.y_label, title=panel.title)
        axes.grid(alpha=0.3)
    if title:
        figure.suptitle(title)
    return save(figure, path)


@dataclass
class Spread:
    """One labelled value over seeds: its mean and its standard deviation (None for one seed)."""

    label: str  # a row of a table
    mean: float
    std: Optional[float] = None


def spreads(panels: Sequence[Tuple[str, Sequence[Spread]]], path: Path, title: str = "",
            size: Optional[Size] = None) -> Path:
    """Means with error bars of one standard deviation, a point per label, one panel per
    (axis label, spreads) pair side by side, as a PNG at `path`; returns it."""
    figure = new_figure(size or Size())
    for index, (y_label, points) in enumerate(panels):
        axes = figure.add_subplot(1, len(panels), index + 1)
        ticks = range(len(points))
        axes.errorbar(list(ticks), [p.mean for p in points], yerr=[p.std or 0.0 for p in points], fmt="o", capsize=6)
        axes.set_xticks(list(ticks), [p.label for p in points], rotation=30, ha="right")
        axes.set(ylabel=y_label, title=f"{y_label}: mean ± 1 s.d. over seeds")
        axes.grid(alpha=0.3, axis="y")
    if title:
        figure.suptitle(title)
    return save(figure, path)


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


def run_curves(cfg: TranslateConfig, size: Size) -> List[Path]:
    """The curves of plot.runs (or of run_dir): each metric against updates (top row) and
    minutes (bottom row), a line per run; the points beside the figure as <stem>.json."""
    runs = run_dirs(cfg.plot.runs or [cfg.run_dir])
    values = {str(run): recorded(run) for run in runs}
    panels = [Panel(x_label, m.label, [Series(run, getattr(p[m.key], x), p[m.key].values) for run, p in values.items()])
              for x, x_label in (("updates", "updates"), ("minutes", "training minutes")) for m in RUN_METRICS]
    output = paths.plot_output(cfg)
    title = f"{len(runs)} run{'s' if len(runs) > 1 else ''}: " + ", ".join(values)
    if len(title) > 120:  # too long for one line: the folder they share
        title = f"{len(runs)} runs in {os.path.commonpath([str(run.resolve()) for run in runs])}"
    figure = curve_panels(panels, output, title, size, columns=len(RUN_METRICS))
    described = {m.key: f"{m.label}, from TensorBoard's {m.tag}" for m in RUN_METRICS}
    points = {run: {key: vars(p) for key, p in metrics.items()} for run, metrics in values.items()}
    return [figure, write_json(paths.beside(output, ".json"), {"metrics": described, "runs": points})]


# Attention.


@dataclass
class AttentionFigure:
    """What one sentence's attention figures draw (and what is written beside them)."""

    checkpoint: str
    layer: int  # counted from 1
    layers: int
    sentence: str
    translation: str
    source: List[str]  # sentencepiece pieces of the source, EOS included
    target: List[str]  # the translation's pieces, EOS included: row t is the attention that chose piece t
    encoder: np.ndarray  # (H, S, S) encoder self-attention: row i is source piece i's weights over the source
    cross: np.ndarray  # (H, T, S) encoder-decoder attention: row t is target piece t's weights over the source

    @property
    def heads(self) -> int:
        return self.encoder.shape[0]


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


def attention(translator: Translator, sentence: str, layer: int, cfg: TranslateConfig, name: str) -> AttentionFigure:
    """The sentence translated as decode would (cfg.decode), then the layer's encoder
    self-attention and encoder-decoder attention of a pass over that translation."""
    specials = translator.vocabulary.specials
    source = translator.encode_sources([sentence], cfg.decode.max_source_length)[0] + [specials.eos]
    if len(source) == 1:
        raise TranslateError("the sentence to draw is empty")
    output = translator.search([sentence], cfg.decode)[0][0].tokens
    model = translator.model
    with torch.inference_mode():
        maps = model.attention(torch.tensor([source]), torch.tensor([[specials.bos] + output]))
    pieces = translator.vocabulary.piece_names()
    return AttentionFigure(name, layer, len(model.encoder_layers), sentence, translator.vocabulary.decode([output])[0],
                           [pieces[i] for i in source], [pieces[i] for i in output + [specials.eos]],
                           maps.encoder[layer - 1][0].float().numpy(), maps.cross[layer - 1][0].float().numpy())


def readable(piece: str) -> str:
    """A piece as a label: sentencepiece's word-start mark (▁) dropped, unless it is all there is."""
    return piece[1:] if piece.startswith("\u2581") and len(piece) > 1 else piece


def head_colours(heads: int) -> np.ndarray:
    """(heads, 4) RGBA colours, one a head, as far apart as the palette allows."""
    from matplotlib import colormaps

    if heads <= 10:
        return colormaps["tab10"](np.arange(heads))
    return colormaps["hsv"](np.linspace(0.0, 1.0, heads, endpoint=False))


def _font_size(tokens: int, inches: float) -> float:
    """Points per label so that `tokens` labels fit along `inches`, between 4 and 10."""
    return float(np.clip(inches * 72 / (1.6 * max(tokens, 1)), 4, 10))


def draw_lines(drawn: AttentionFigure, size: Size) -> "Figure":
    """Figure 3: the source pieces in two columns, a line from each query (left) to each key
    (right) per head, in the head's colour with the weight as its opacity."""
    from matplotlib.collections import LineCollection
    from matplotlib.lines import Line2D

    figure = new_figure(size)
    axes = figure.add_subplot()
    S, colours = len(drawn.source), head_colours(drawn.heads)
    query, key = np.meshgrid(np.arange(S), np.arange(S), indexing="ij")  # (S, S) each
    segments = np.stack([np.stack([np.zeros(S * S), query.ravel()], 1), np.stack([np.ones(S * S), key.ravel()], 1)], 1)
    for head in range(drawn.heads):
        weights = drawn.encoder[head].ravel()  # (S*S,)
        seen = weights >= 1 / 255  # fainter lines round to nothing in 8-bit colour: not drawn
        rgba = np.tile(colours[head], (int(seen.sum()), 1))  # (lines, 4)
        rgba[:, 3] = weights[seen]
        axes.add_collection(LineCollection(segments[seen], colors=rgba, linewidths=2))
    labels = [readable(p) for p in drawn.source]
    axes.set_yticks(range(S), labels, fontsize=_font_size(S, size.height / size.dpi))
    axes.tick_params(axis="y", labelright=True, right=True)
    axes.set(xlim=(0, 1), ylim=(S - 0.5, -0.5), xticks=[0, 1], xticklabels=["query (attending)", "key (attended to)"],
             ylabel="source piece")
    axes.legend(handles=[Line2D([], [], color=c, lw=2, label=f"head {h + 1}") for h, c in enumerate(colours)],
                loc="upper center", bbox_to_anchor=(0.5, -0.06), ncols=min(drawn.heads, 8), fontsize="small")
    figure.suptitle(f"{drawn.checkpoint}: encoder self-attention, layer {drawn.layer} of {drawn.layers}, "
                    f"heads 1-{drawn.heads} (a colour each; opacity: weight)")
    return figure


def draw_heads(weights: np.ndarray, rows: List[str], columns: List[str], title: str, y_label: str,
               size: Size) -> "Figure":
    """Figures 4 and 5: a heatmap per head (weights (H, rows, columns)), in the head's colour."""
    from matplotlib.colors import LinearSegmentedColormap

    figure = new_figure(size)
    heads = weights.shape[0]
    across = math.ceil(math.sqrt(heads))
    down = math.ceil(heads / across)
    x_font = _font_size(len(columns), size.width / size.dpi / across)
    y_font = _font_size(len(rows), size.height / size.dpi / down)
    for head, colour in enumerate(head_colours(heads)):
        axes = figure.add_subplot(down, across, head + 1)
        shades = LinearSegmentedColormap.from_list(f"head{head}", ["white", colour])
        image = axes.imshow(weights[head], cmap=shades, vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
        axes.set_xticks(range(len(columns)), [readable(p) for p in columns], rotation=90, fontsize=x_font)
        axes.set_yticks(range(len(rows)), [readable(p) for p in rows], fontsize=y_font)
        axes.set(title=f"head {head + 1}", xlabel="source piece (key)", ylabel=y_label)
        figure.colorbar(image, ax=axes, shrink=0.8, label="weight")
    figure.suptitle(title)
    return figure


# The arrays of <stem>.npz, as <stem>.json describes them.
ARRAYS = {"encoder_self_attention": "(heads, source, source): row i, source piece i's weights over the source",
          "encoder_decoder_attention": "(heads, target, source): row t, the weights that chose target piece t"}


def write_attention(drawn: AttentionFigure, output: Path, size: Size) -> List[Path]:
    """The three figures (output itself: Figure 3; <stem>.heads.png; <stem>.cross.png) and the
    weights beside them (<stem>.npz, described in <stem>.json)."""
    where = f"{drawn.checkpoint}: {{}}, layer {drawn.layer} of {drawn.layers}"
    translation = textwrap.shorten(drawn.translation, 120)
    written = [
        save(draw_lines(drawn, size), output),
        save(draw_heads(drawn.encoder, drawn.source, drawn.source, where.format("encoder self-attention"),
                        "source piece (query)", size), paths.beside(output, ".heads.png")),
        save(draw_heads(drawn.cross, drawn.target, drawn.source, where.format("encoder-decoder attention")
                        + f"\n→ {translation}", "output piece (query)", size), paths.beside(output, ".cross.png")),
    ]
    with paths.atomic_write(paths.beside(output, ".npz"), binary=True) as file:
        np.savez(file, encoder_self_attention=drawn.encoder, encoder_decoder_attention=drawn.cross)
    shown = ("checkpoint", "layer", "layers", "heads", "sentence", "translation", "source", "target")
    description = {**{key: getattr(drawn, key) for key in shown}, "arrays": ARRAYS}
    return written + [paths.beside(output, ".npz"), write_json(paths.beside(output, ".json"), description)]


def attention_figures(cfg: TranslateConfig, size: Size) -> List[Path]:
    """plot.kind=attention: one sentence through plot.checkpoint (default: decode's)."""
    sentence = _sentence(cfg.plot)
    source = Path(cfg.plot.checkpoint) if cfg.plot.checkpoint else checkpoint.for_decoding(cfg)
    translator = Translator.from_checkpoint(source)
    layer = _layer(cfg.plot, len(translator.model.encoder_layers))
    return write_attention(attention(translator, sentence, layer, cfg, str(source)), paths.plot_output(cfg), size)


def plot(cfg: TranslateConfig) -> List[Path]:
    """Draw plot.kind; returns the files written, figures first."""
    _matplotlib()  # a missing extra is reported before any work
    size = Size(cfg.plot.width, cfg.plot.height, cfg.plot.dpi)
    written = attention_figures(cfg, size) if cfg.plot.kind == PlotKind.attention else run_curves(cfg, size)
    for path in written:
        log.info(f"wrote {path}")
    return written
