"""The rows of the paper's Table 3 (its model variations), the big model and pre-norm, each as
command-line overrides of a preset: `translate train config=base` + a row's overrides trains it
(docs/table3.md shows them; scripts/table3_mini.py runs some at the tiny size)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional


@dataclass(frozen=True)
class Variant:
    """One row of the paper's Table 3 as command-line overrides of a preset."""

    row: str  # the paper's row: "A" .. "E", "base", "big", or "" where the paper has none
    overrides: List[str]  # e.g. ["model.heads=1"]; per-head widths follow d_model / heads unless set
    paper_params: Optional[int] = None  # the paper's "params x10^6", where it gives one


# Every row of the model-variation study (Table 3), the big model and pre-norm, by name:
# `translate train config=base` + the overrides (scripts/table3_mini.py runs some at the tiny
# size; docs/table3.md shows them, checked against this).
TABLE_3: Dict[str, Variant] = {
    "base": Variant("base", [], 65),
    **{f"A h={h}": Variant("A", [f"model.heads={h}"], 65) for h in (1, 4, 16, 32)},
    **{f"B d_k={k}": Variant("B", [f"model.d_k={k}"], params) for k, params in ((16, 58), (32, 60))},
    **{f"C N={n}": Variant("C", [f"model.layers={n}"], params) for n, params in ((2, 36), (4, 50), (8, 80))},
    **{f"C d_model={d}": Variant("C", [f"model.d_model={d}"], params) for d, params in ((256, 28), (1024, 168))},
    **{f"C d_ff={f}": Variant("C", [f"model.d_ff={f}"], params) for f, params in ((1024, 53), (4096, 90))},
    **{f"D P_drop={p}": Variant("D", [f"model.dropout={p}"]) for p in ("0.0", "0.2")},
    **{f"D eps_ls={e}": Variant("D", [f"train.label_smoothing={e}"]) for e in ("0.0", "0.2")},
    "E learned positions": Variant("E", ["model.positions=learned"]),
    "big": Variant("big", ["model.d_model=1024", "model.d_ff=4096", "model.heads=16", "model.dropout=0.3"], 213),
    "pre-norm": Variant("", ["model.norm=pre"]),  # not in the paper: LayerNorm before each sub-layer
}
