"""`translate plot` (translate.verbs.plot): attention figures whose weights are the model's own, PNGs
of the size asked, curves that are what the runs recorded, and one line where matplotlib is
missing."""

from __future__ import annotations

import json
import math
import re
import sys
import time
from pathlib import Path
from typing import List

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.conftest import MULTI30K, need, run_cli, script_module, small_run
from translate import figures
from translate.attention_maps import attention_maps
from translate.cli import run_verb
from translate.hydra_cli import load_config
from translate.translator import Translator
from translate.verbs import plot

LAYERS = 2  # the figures draw the second: its inputs come through the first


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> List[str]:
    """A small model of two layers, trained 4 updates with a validation (loss and BLEU) every 2."""
    need(MULTI30K)
    overrides = small_run(tmp_path_factory.mktemp("plot"), f"model.layers={LAYERS}", "train.max_steps=4",
                          "train.log_every=2", "valid.every_steps=2", "valid.bleu_sentences=10", "train.threads=1")
    run_cli("train", *overrides, check=True)
    return overrides + ["decode.max_len_b=8"]


@pytest.fixture(scope="module")
def drawn(run, tmp_path_factory) -> Path:
    """The attention figures of the paper's sentence, layer 2, at 640 x 480 pixels (in-process)."""
    output = tmp_path_factory.mktemp("figures") / "attention.png"
    cfg = load_config("plot", run + [f"plot.layer={LAYERS}", f"plot.output={output}", "plot.width=640", "plot.height=480"])
    written = plot.plot(cfg)
    assert [p.name for p in written] == ["attention.png", "attention.heads.png", "attention.cross.png", "attention.npz",
                                         "attention.json"]
    return output


def reference_attention(attn, query: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
    """torch's own multi-head attention on the layer's weights: (H, T, S) weights. Its output
    is checked against the layer's, so that the weights are those the layer applies."""
    D = query.size(-1)
    if attn.self_attention:
        projections = dict(in_proj_weight=attn.qkv_proj.weight, in_proj_bias=attn.qkv_proj.bias)
    else:
        k, v = attn.kv_proj.weight.split(D)
        projections = dict(in_proj_weight=None, use_separate_proj_weight=True, q_proj_weight=attn.q_proj.weight,
                           k_proj_weight=k, v_proj_weight=v, in_proj_bias=torch.cat([attn.q_proj.bias, attn.kv_proj.bias]))
    out, weights = F.multi_head_attention_forward(
        query.transpose(0, 1), memory.transpose(0, 1), memory.transpose(0, 1), D, attn.heads, bias_k=None, bias_v=None,
        add_zero_attn=False, dropout_p=0.0, out_proj_weight=attn.out_proj.weight, out_proj_bias=attn.out_proj.bias,
        training=False, need_weights=True, average_attn_weights=False, **projections)
    ours = attn(query) if attn.self_attention else attn(query, memory=memory)
    torch.testing.assert_close(out.transpose(0, 1), ours, atol=1e-5, rtol=1e-5)
    return weights[0]


@torch.no_grad()
def test_the_weights_drawn_are_the_models_own_attention(run, drawn):
    """Each row sums to 1, and equals torch's multi_head_attention_forward on the layer's inputs
    (the first layer's output) and weights: encoder self-attention, and encoder-decoder attention
    over the translation decode gives."""
    weights = np.load(drawn.with_suffix(".npz"))
    described = json.loads(drawn.with_suffix(".json").read_text())
    encoder, cross = weights["encoder_self_attention"], weights["encoder_decoder_attention"]
    assert described["layer"] == LAYERS and described["heads"] == 2 and described["checkpoint"].endswith(".pt")
    np.testing.assert_allclose(encoder.sum(-1), 1, atol=1e-5)
    np.testing.assert_allclose(cross.sum(-1), 1, atol=1e-5)

    cfg = load_config("decode", run)
    translator = Translator.from_checkpoint(Path(described["checkpoint"]))
    model, vocabulary = translator.model, translator.vocabulary
    specials, pieces = vocabulary.specials, vocabulary.piece_names()
    source = vocabulary.to_ids([plot.PAPER_SENTENCE])[0] + [specials.eos]
    output = translator.search([plot.PAPER_SENTENCE], cfg.decode)[0][0].tokens
    assert described["source"] == [pieces[i] for i in source]
    assert described["target"] == [pieces[i] for i in output + [specials.eos]]
    assert encoder.shape == (2, len(source), len(source)) and cross.shape == (2, len(output) + 1, len(source))

    src, mask = torch.tensor([source]), torch.ones(1, 1, 1, len(source), dtype=torch.bool)
    x = model.encoder_layers[0](model.embed(src), mask)  # post-norm: the second layer's attention reads it as it is
    np.testing.assert_allclose(encoder, reference_attention(model.encoder_layers[1].self_attn, x, x), atol=1e-5)
    memory = model.encode(src)[0]
    y = model.decoder_layers[0](model.embed(torch.tensor([[specials.bos] + output])), memory, mask)
    second = model.decoder_layers[1]
    y = second.sublayer[0](y, lambda z: second.self_attn(z, causal=True))
    np.testing.assert_allclose(cross, reference_attention(second.src_attn, y, memory), atol=1e-5)


def test_the_attention_pass_leaves_no_hooks(run, drawn):
    """attention_maps() takes its hooks away: training and decoding run as before."""
    described = json.loads(drawn.with_suffix(".json").read_text())
    model = Translator.from_checkpoint(Path(described["checkpoint"])).model
    attention_maps(model, torch.tensor([[5, 6, 3]]), torch.tensor([[2, 7]]))
    assert not any(module._forward_hooks for module in model.modules())


def distinct_colours(path: Path) -> int:
    import matplotlib.image

    pixels = matplotlib.image.imread(path)
    return len(np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0))


@pytest.mark.parametrize("name", ["attention.png", "attention.heads.png", "attention.cross.png"])
def test_a_figure_is_the_size_asked_with_many_colours(drawn, name):
    import matplotlib.image

    path = drawn.with_name(name)
    assert matplotlib.image.imread(path).shape[:2] == (480, 640)
    assert distinct_colours(path) > 20


def test_curves_draws_a_png_of_the_size_asked(tmp_path):
    """curves() as a benchmark calls it: named lines against one x axis."""
    series = [figures.Series("ours", [1, 2, 4], [10.0, 20.0, 25.0]), figures.Series("fairseq", [1, 3], [8.0, 22.0])]
    path = figures.curves(series, tmp_path / "bleu.png", "minutes", "dev BLEU", "BLEU against minutes", figures.Size(333, 251, 72))
    import matplotlib.image

    assert matplotlib.image.imread(path).shape[:2] == (251, 333)
    assert distinct_colours(path) > 20


def test_spreads_draws_a_png_of_the_size_asked(tmp_path):
    """spreads() as the miniature Table 3 calls it: means with error bars, a panel per measure."""
    rows = [figures.Spread("default", 30.0, 1.5), figures.Spread("A h=1", 33.0, 0.5), figures.Spread("one seed", 31.0)]
    path = figures.spreads([("dev perplexity", rows), ("dev BLEU", rows)], tmp_path / "t3.png", "Table 3", figures.Size(500, 300, 72))
    import matplotlib.image

    assert matplotlib.image.imread(path).shape[:2] == (300, 500)
    assert distinct_colours(path) > 20


def test_spreads_panel_titles_do_not_run_into_each_other(tmp_path, monkeypatch):
    """The sweep's panels side by side (scripts/sweep_multi30k.py's labels and size): no panel's
    title overlaps its neighbour's."""
    drawn = []
    save = figures.save
    monkeypatch.setattr(figures, "save", lambda figure, path: drawn.append(figure) or save(figure, path))
    rows = [figures.Spread("literature", 5.28, 0.21), figures.Spread("literature-fairseq-init", 13.15, 0.51)]
    scripts = Path(__file__).parents[1] / "scripts"
    monkeypatch.syspath_prepend(str(scripts))  # as when it runs: its neighbours import
    sweep = script_module("sweep_multi30k")
    labels = list(sweep.SPREAD_MEASURES.values())
    assert len(labels) == 4
    figures.spreads([(label, rows) for label in labels], tmp_path / "sweep.png", "a sweep", sweep.SPREADS_SIZE)
    (figure,) = drawn
    renderer = figure.canvas.get_renderer()
    spans = [axes.title.get_window_extent(renderer) for axes in figure.axes]
    for left, right in zip(spans, spans[1:]):
        assert left.x1 < right.x0, (left, right)


def logged(run_dir: Path, pattern: str) -> dict:
    """{update: values} of train's log lines that match pattern (3 decimals)."""
    text = (run_dir / "hydra" / "train" / "train.log").read_text()
    return {int(m.group(1)): [float(v) for v in m.groups()[1:]] for m in re.finditer(pattern, text)}


def test_the_curves_are_what_the_run_recorded(run, tmp_path):
    """Through the command line: every point is in train's log lines, the last dev point is the
    run record's, and the minutes grow."""
    run_dir = Path(next(o for o in run if o.startswith("run_dir=")).split("=", 1)[1])
    output = tmp_path / "curves.png"
    run_cli("plot", "plot.kind=curves", f"plot.runs=[{run_dir}]", f"plot.output={output}", "plot.width=900",
            "plot.height=500", check=True)
    import matplotlib.image

    assert matplotlib.image.imread(output).shape[:2] == (500, 900)
    points = json.loads(output.with_suffix(".json").read_text())["runs"][str(run_dir)]
    train = logged(run_dir, r"update (\d+): loss ([\d.]+) ")
    dev = logged(run_dir, r"update (\d+): dev loss [\d.]+ nll ([\d.]+) bleu ([\d.]+)")
    assert points["train_loss"]["updates"] == sorted(train) == [2, 4]
    assert points["dev_ppl"]["updates"] == points["dev_bleu"]["updates"] == sorted(dev) == [2, 4]
    for update, index in ((2, 0), (4, 1)):
        assert points["train_loss"]["values"][index] == pytest.approx(train[update][0], abs=5e-4)
        assert math.log(points["dev_ppl"]["values"][index]) == pytest.approx(dev[update][0], abs=5e-4)
        assert points["dev_bleu"]["values"][index] == pytest.approx(dev[update][1], abs=5e-4)
    valid = json.loads((run_dir / "run_record.json").read_text())["valid"]
    assert points["dev_ppl"]["values"][-1] == pytest.approx(math.exp(valid["nll"]), rel=1e-6)  # TensorBoard keeps float32
    assert points["dev_bleu"]["values"][-1] == pytest.approx(valid["bleu"], rel=1e-6, abs=1e-6)
    minutes = points["train_loss"]["minutes"]
    assert 0 <= minutes[0] < minutes[1] < 5


def test_a_resumed_run_continues_its_curves(tmp_path):
    """Two trainings of one run_dir (two event files): the second's minutes start where the
    first's ended, and its points replace the first's from its first update on."""
    from torch.utils.tensorboard import SummaryWriter

    for steps, losses, span in (((10, 20, 30), (5.0, 4.0, 3.0), 60.0), ((20, 40), (3.9, 2.0), 30.0)):
        writer = SummaryWriter(str(tmp_path / "tensorboard"))
        start = time.time()
        for index, (step, loss) in enumerate(zip(steps, losses)):
            writer.add_scalar("train/loss", loss, step, walltime=start + span * (index + 1) / len(steps))
        writer.close()
        time.sleep(1.1)  # event files are named by the second they were opened
    points = plot.recorded(tmp_path)["train_loss"]
    assert points.updates == [10, 20, 40] and points.values == pytest.approx([5.0, 3.9, 2.0])
    assert points.minutes == pytest.approx([20 / 60, 1 + 15 / 60, 1.5], abs=1e-3)


def test_without_matplotlib_one_line_names_the_extra(tmp_path, monkeypatch, capsys):
    """Before any work (there is no checkpoint here): exit 1 and the pip line of the extra."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    cfg = load_config("plot", [f"run_dir={tmp_path}"])
    assert run_verb("plot", cfg) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["translate plot: error: drawing needs matplotlib, which the plot extra installs: pip install -e '.[plot]'"]
