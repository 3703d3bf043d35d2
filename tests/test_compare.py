"""`translate table` (translate.compare): runs side by side from their run records, as the
paper's Table 3."""

from __future__ import annotations

import json

from tests.conftest import MULTI30K, SMALL, need, one_line_error, run_cli


def test_a_sweeps_runs_side_by_side(tmp_path):
    """Two real tiny runs (a multirun's folder stands for its jobs): the setting that differs,
    parameters, updates, compute, dev metrics, and test BLEU for the one whose decode was scored."""
    need(MULTI30K)
    run_dir = tmp_path / "sweep"
    common = SMALL[:-2] + ["train.max_steps=4", "valid.every_steps=2", "valid.bleu_sentences=10",
                           f"data.cache_dir={tmp_path}/cache"]
    run_cli("train", "-m", *common, f"run_dir={run_dir}", "model.dropout=0.0,0.2", check=True)
    scored = run_dir / "model.dropout:0.2"
    run_cli("decode", *common, f"run_dir={scored}", "checkpoint.average_last=0", "decode.max_len_b=3", check=True)
    run_cli("bleu", *common, f"run_dir={scored}", check=True)
    result = run_cli("table", f"table.runs=[{run_dir}]", "table.format=json", check=True)
    rows = json.loads(result.stdout)
    assert [row["model.dropout"] for row in rows] == [0.0, 0.2]
    assert set(rows[0]) == {"run", "model.dropout", "params", "updates", "train_flops", "dev_loss", "dev_ppl",
                            "dev_bleu", "test_bleu"}
    for row in rows:
        assert row["updates"] == 4 and row["params"] > 0 and row["train_flops"] > 0
        assert row["dev_loss"] > 0 and row["dev_ppl"] > 1 and row["dev_bleu"] is not None
    assert rows[0]["test_bleu"] is None and rows[1]["test_bleu"] is not None
    markdown = run_cli("table", f"table.runs=[{run_dir}/model.dropout:0.0,{scored}]", check=True).stdout.splitlines()
    assert markdown[0].startswith("| run | model.dropout | params |") and len(markdown) == 4


def test_a_folder_that_is_not_a_run_is_one_line(tmp_path):
    one_line_error(run_cli("table", f"table.runs=[{tmp_path}]"), f"{tmp_path} is not a run")
