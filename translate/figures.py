"""Every figure translate draws, on matplotlib's Agg canvas (no display, no pyplot state): curves
(lines on panels), means with their error bars over seeds (spreads), and one sentence's
attention (the paper's Figures 3-5: lines per head, a heatmap per head). matplotlib, the
`plot` extra, is imported only when a figure is drawn. The `translate plot` verb and the
benchmarks draw with these.
"""

from __future__ import annotations

import json
import math
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from translate.core import paths
from translate.core.errors import TranslateError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

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


def matplotlib_parts() -> Tuple[Any, Any]:
    """matplotlib's Figure class and its Agg canvas; one line naming the extra where it is missing."""
    try:  # `import a.b` imports `a` itself first, so a blocked matplotlib fails here even after a first use
        import matplotlib.backends.backend_agg as agg
        import matplotlib.figure
    except ImportError:
        raise TranslateError(f"drawing needs matplotlib, which the plot extra installs: {EXTRA}") from None
    return matplotlib.figure.Figure, agg.FigureCanvasAgg


def new_figure(size: Size) -> "Figure":
    """An empty matplotlib Figure of `size`, laid out so that labels are not cut."""
    figure_class, canvas = matplotlib_parts()
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
        # Wrapped: side by side, three panels' one-line titles ran into each other.
        axes.set(ylabel=y_label, title=textwrap.fill(f"{y_label}: mean ± 1 s.d. over seeds", 36))
        axes.grid(alpha=0.3, axis="y")
    if title:
        figure.suptitle(title)
    return save(figure, path)


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
