"""Every script in scripts/ documents itself with --help and has a line in scripts/README.md;
torchrun launches the train verb; the benchmarks that need only a small run run on one."""

import argparse
import json
import os
import subprocess
import sys
import statistics
import time

import pytest

from tests.conftest import MULTI30K, ROOT, cli, need, run, script_module, small_run, torchrun

SCRIPTS = sorted((ROOT / "scripts").glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_script_help(script):
    result = run([sys.executable, str(script), "--help"], timeout=120)
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout


def test_scripts_readme_has_a_line_for_each_script():
    """scripts/README.md's table names every script in scripts/, and only those."""
    import re

    text = (ROOT / "scripts" / "README.md").read_text(encoding="utf-8")
    listed = re.findall(r"^\| `([\w.]+)` \|", text, flags=re.MULTILINE)
    present = sorted(p.name for p in (ROOT / "scripts").iterdir() if p.suffix in (".py", ".sh"))
    assert sorted(listed) == present, "scripts/README.md's table differs from the scripts in scripts/"
    assert len(listed) == len(set(listed)), "a script has two lines in scripts/README.md"


@pytest.mark.slow  # make test-slow, to keep the default suite under 10 minutes: torchrun's runs of two processes (test_distributed, test_watchdog)
def test_torchrun_single_process_trains(tmp_path):
    need(MULTI30K)
    result = run(torchrun("train", *small_run(tmp_path, "train.max_steps=2"), processes=1), timeout=300)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "run" / "checkpoint_last.pt").is_file()


def script_records(name: str, *args: str) -> list:
    """Run scripts/NAME with ARGS to its end (exit 0): its JSON lines."""
    result = run([sys.executable, str(ROOT / "scripts" / name), *args], timeout=300)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.mark.slow  # make test-slow, to keep the default suite under 10 minutes: a benchmark's own run
def test_bench_transformers_on_a_small_run(trained_run):
    """The export timings, then ours and transformers' greedy search, one JSON line each."""
    pytest.importorskip("transformers", reason="the transformers extra is not installed")
    records = script_records("bench_transformers.py", "--limit", "20", "--rounds", "2", "--threads", "1", "--split",
                             "validation", "--override", *trained_run)
    assert [r["measurement"] for r in records] == ["import_transformers", "export_in_process", "export_cli_process"] + \
        ["greedy_ours", "greedy_transformers"] * 2 + ["greedy_summary"]
    assert all(r["seconds"] > 0 for r in records[:-1]) and {r["round"] for r in records[3:-1]} == {1, 2}
    summary = records[-1]
    assert summary["sentences"] == 20 and summary["transformers_over_ours"] > 0
    # The export translates as ours does (tests/formats/test_transformers.py: 99% of greedy
    # outputs that end before the cap): all but a near tie or two of 20, and where all are the
    # same, so is each round's BLEU of the two.
    assert summary["identical"] >= 0.9, summary
    greedy = [r for r in records if r["measurement"].startswith("greedy_") and "round" in r]
    assert all(isinstance(r["bleu"], float) for r in greedy), greedy  # the dev split is scored; a test split is not
    if summary["identical"] == 1:
        assert all(a["bleu"] == b["bleu"] for a, b in zip(greedy[::2], greedy[1::2])), greedy


@pytest.mark.slow  # make test-slow, to keep the default suite under 10 minutes on an AVX2 Zen 1: a benchmark's own test
def test_bench_decode_process_on_a_small_run(trained_run):
    """A warm-up pair and one measured pair of whole processes, ours and CTranslate2's, each a
    JSON line with its own peak memory; then a summary per side and the ratio line."""
    pytest.importorskip("ctranslate2", reason="the ctranslate2 extra is not installed")
    records = script_records("bench_decode_process.py", "--limit", "5", "--pairs", "1", "--threads", "1", "--override",
                             *trained_run)
    assert [r["measurement"] for r in records] == ["decode_process_ctranslate2", "decode_process_ours"] + \
        ["decode_process_ours", "decode_process_ctranslate2", "decode_process_ours_summary",
         "decode_process_ctranslate2_summary", "decode_process_ours_over_ctranslate2"]
    runs = records[:4]
    assert [r["warm_up"] for r in runs] == [True, True, False, False] and all(r["sentences"] == 5 for r in runs)
    assert all(r["wall_s"] > 0 and r["cpu_s"] > 0 and r["target_tokens_per_s"] > 0 for r in runs)
    # Each side's own peak (not the benchmark's, which imported torch): CTranslate2's is the smaller.
    assert runs[3]["peak_mib"] < runs[2]["peak_mib"]
    assert records[4]["wall_s"]["median"] == runs[2]["wall_s"]
    assert records[-1]["length_penalty"]["same_formula"] is False and records[-1]["speed"] > 0


def test_bench_decode_reads_the_anchors_decode_line():
    """run.sh decode's line is JSON, or carries its seconds unevaluated as round(END-START, 1)."""
    bench = script_module("bench_decode")
    plain = '{"measurement": "fairseq_generate", "sentences": 1000, "seconds_whole_process": 20.1, "sacrebleu": 27.47}'
    slipped = plain.replace("20.1", "round(1796050481.362273892-1796050461.311694219, 1)")
    assert bench.anchor_record(plain) == bench.anchor_record(slipped) == json.loads(plain)


def test_bench_decode_scores_the_dev_split_only():
    """A speed benchmark decodes test sentences but does not score them (issue 52): without
    references (main drops a held-out split's) a line's bleu is null; with the dev split's, a score."""
    bench = script_module("bench_decode")
    hypotheses = ["ein hund läuft auf dem gras .", "zwei männer reden ."]
    assert bench.report("x", hypotheses, [], 1.0, emitted=False)["bleu"] is None
    assert bench.report("x", hypotheses, hypotheses, 1.0, emitted=False)["bleu"] == 100.0
    assert bench.by_split(argparse.Namespace(splits=["test"], split_sizes=[2]), hypotheses, []) == {}


def test_profile_train_preset_trains_the_preset_itself(tmp_path, monkeypatch, capsys):
    """--preset profiles `translate train config=PRESET` as users train it (no run.sh model or
    dropout overrides), without epoch checkpoints or validation, and runs no fairseq side."""
    import subprocess
    from pathlib import Path

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import profile_train

    commands = []

    def fake_run(command, **kwargs):  # the hooked trainer's output: one op over 20 updates
        if command[0] == "git":  # the profiled tree's commit
            return subprocess.CompletedProcess(command, 0, "abc1234\n", "")
        commands.append(command)
        Path(kwargs["env"]["PROFILE_TRAIN_OUT"]).write_text(json.dumps(
            {"seconds": 2.0, "updates": 20, "target_tokens": 4000, "ops": [{"op": "aten::mm", "self_us": 1e6, "calls": 40}]}))
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(profile_train.subprocess, "run", fake_run)
    monkeypatch.setattr(profile_train, "fairseq", lambda *a: pytest.fail("a preset's profile ran fairseq"))
    monkeypatch.setattr(sys, "argv", ["profile_train.py", "--preset", "multi30k_lowercase"])
    profile_train.main()
    command, = commands
    overrides = command[command.index("train") + 1:]
    assert overrides[0] == "config=multi30k_lowercase" and "checkpoint.every_epochs=0" in overrides
    assert not [o for o in overrides if o.startswith(("config=tiny", "model=", "model.dropout", "optim."))]
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(line["measurement"], line.get("trainer"), line["model"]) for line in lines] == \
        [("profile_summary", "ours", "config=multi30k_lowercase"), ("profile_op", None, "config=multi30k_lowercase")]
    assert lines[0]["ms_per_update"] == 100.0 and lines[1]["ours_ms_per_update"] == 50.0
    assert lines[0]["first_update"] == 11 and lines[0]["commit"] == "abc1234"


def test_profile_train_window_and_shapes(tmp_path, monkeypatch, capsys):
    """--first N profiles updates N .. N + 19 of a run of N + 20 updates; --by-shape asks the hooked
    trainer for calls by input shape and lists the largest."""
    import subprocess
    from pathlib import Path

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import profile_train

    envs, commands = [], []

    def fake_run(command, **kwargs):
        if command[0] == "git":
            return subprocess.CompletedProcess(command, 0, "abc1234\n", "")
        envs.append(kwargs["env"])
        commands.append(command)
        Path(kwargs["env"]["PROFILE_TRAIN_OUT"]).write_text(json.dumps(
            {"seconds": 2.0, "updates": 20, "target_tokens": 4000, "ops": [{"op": "aten::mm", "self_us": 1e6, "calls": 40}],
             "shapes": [{"op": "aten::mm", "shapes": "[[4, 8]]", "self_us": 4e5, "calls": 20},
                        {"op": "aten::mm", "shapes": "[[2, 8]]", "self_us": 6e5, "calls": 20}]}))
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(profile_train.subprocess, "run", fake_run)
    monkeypatch.setattr(sys, "argv", ["profile_train.py", "--preset", "multi30k_lowercase", "--first", "81", "--by-shape"])
    profile_train.main()
    env, = envs
    assert (env["PROFILE_FIRST"], env["PROFILE_LAST"], env["PROFILE_SHAPES"]) == ("81", "100", "1")
    assert "train.max_steps=101" in commands[0]
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[0]["first_update"] == 81
    shapes = [(line["shapes"], line["ms_per_update"]) for line in lines if line["measurement"] == "profile_shape"]
    assert shapes == [("[[2, 8]]", 30.0), ("[[4, 8]]", 20.0)]


def test_profile_window_holds_the_updates_it_names(tmp_path, monkeypatch):
    """profile_train.wrap profiles from the start of update `first` to the start of update
    last + 1: exactly those updates' operators and target tokens."""
    import torch

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import profile_train

    class Loop:
        def update(self, n: int) -> None:
            torch.ones(n).sum()

    out = tmp_path / "profile.json"
    profile_train.wrap(Loop, "update", 2, 3, str(out), lambda loop, n: n)
    for n in range(1, 6):
        Loop().update(n)
    profile = json.loads(out.read_text())
    assert profile["updates"] == 2 and profile["target_tokens"] == 2 + 3 and profile["seconds"] > 0
    calls = {op["op"]: op["calls"] for op in profile["ops"]}
    assert calls["aten::sum"] == 2


def test_bench_quality_summary_by_hand(monkeypatch):
    """Time to a BLEU, interpolated between checkpoints; BLEU at equal updates and minutes."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from bench_quality import Curve, summary

    theirs = Curve("fairseq", [{"updates": 100, "seconds": 120.0, "bleu": 5.0}, {"updates": 200, "seconds": 240.0, "bleu": 10.0}])
    ours = Curve("ours", [{"updates": 100, "seconds": 60.0, "bleu": 6.0}, {"updates": 200, "seconds": 120.0, "bleu": 14.0},
                          {"updates": 300, "seconds": 180.0, "bleu": 16.0}])
    # 10 BLEU: between 6 (60 s) and 14 (120 s), half-way: 90 s; fairseq took 240 s.
    assert ours.seconds_to(10.0) == 90.0 and theirs.seconds_to(20.0) is None
    row = summary([theirs, ours])["rows"][0]
    assert row["ours_minutes_to_it"] == 1.5 and row["time_to_quality_ratio"] == round(240 / 90, 3)
    assert row["bleu_at_equal_updates"] == [{"updates": 100, "fairseq": 5.0, "ours": 6.0},
                                            {"updates": 200, "fairseq": 10.0, "ours": 14.0}]
    assert row["bleu_at_equal_minutes"] == [{"minutes": 1, "fairseq": None, "ours": 6.0},
                                            {"minutes": 2, "fairseq": 5.0, "ours": 14.0},
                                            {"minutes": 3, "fairseq": 5.0, "ours": 16.0}]


def test_sweep_evaluates_one_run_alone(monkeypatch, tmp_path):
    """--evaluate RUN_DIR: the sweep's dev choice for a run trained apart, nothing probed or trained."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import sweep_multi30k

    evaluated = []
    monkeypatch.setattr(sweep_multi30k, "evaluate", lambda run, threads: evaluated.append((run, threads)))
    monkeypatch.setattr(sweep_multi30k, "probe", lambda *args: pytest.fail("probed"))
    monkeypatch.setattr(sys, "argv", ["sweep_multi30k.py", "--evaluate", str(tmp_path / "run"), "--folder", str(tmp_path / "f")])
    sweep_multi30k.main()
    assert evaluated == [(tmp_path / "run", 2)] and not (tmp_path / "f").exists()


def test_bench_quality_recipes_name_their_trainers(monkeypatch):
    """--recipe 'LABEL: overrides' trains those overrides as ours-LABEL-PRECISION; without one,
    ours is config=tiny named by its precision alone; a recipe without a label or overrides exits."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from bench_quality import DEFAULT_RECIPE, Recipe

    recipe = Recipe.parse("tiny-fairseq-init:  config=tiny train.init=fairseq ")
    assert recipe == Recipe("tiny-fairseq-init", ["config=tiny", "train.init=fairseq"])
    assert recipe.trainer("fp32") == "ours-tiny-fairseq-init-fp32"
    assert DEFAULT_RECIPE.trainer("bf16") == "ours-bf16" and DEFAULT_RECIPE.overrides == ["config=tiny"]
    for bad in ("config=tiny", "tiny:", ": config=tiny"):
        with pytest.raises(SystemExit, match="LABEL: override"):
            Recipe.parse(bad)


def test_table3_verdict_by_hand(monkeypatch):
    """A row differs from the default where |mean difference| > 2 x sqrt(s_row^2/n + s_default^2/n)."""
    import statistics

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from table3_mini import verdict

    def row(ppl, bleu):
        return {"n": len(ppl), "dev_ppl": statistics.mean(ppl), "dev_ppl_std": statistics.stdev(ppl),
                "dev_bleu": statistics.mean(bleu), "dev_bleu_std": statistics.stdev(bleu)}

    default = row([10.0, 11.0, 12.0], [20.0, 21.0, 22.0])  # stdev 1 each
    found = verdict("A h=1", row([14.0, 15.0, 16.0], [20.5, 21.5, 22.5]), default)
    sigma = (1 / 3 + 1 / 3) ** 0.5
    assert found["dev_ppl"]["minus_default"] == 4.0 and found["dev_ppl"]["std_of_difference"] == pytest.approx(sigma, abs=1e-3)
    # perplexity 4 > 2 x 0.816 higher, as the paper's 5.29 against 4.92; BLEU +0.5 is within 2 x 0.816
    assert found["dev_ppl"]["beyond_2_std"] and found["dev_ppl"]["direction"] == "higher"
    assert found["dev_ppl"]["paper_direction"] == "higher" and found["dev_ppl"]["as_in_paper"]
    assert not found["dev_bleu"]["beyond_2_std"] and found["dev_bleu"]["direction"] == "same"
    assert found["dev_bleu"]["paper_direction"] == "lower" and not found["dev_bleu"]["as_in_paper"]
    single = verdict("pre-norm", {"dev_ppl": 9.0, "dev_bleu": 30.0}, default)  # one seed: no spread, no verdict
    assert single["dev_ppl"]["std_of_difference"] is None and not single["dev_ppl"]["beyond_2_std"]
    assert "paper_direction" not in single["dev_ppl"]


def test_fairseq_checkpoint_average_by_hand(tmp_path, monkeypatch):
    """The stand-in for fairseq's average_checkpoints.py: the newest N epoch checkpoints (by
    epoch number, not name order), each parameter their mean in its own dtype, the newest one's
    other state kept; too few is one line. And bench_multi30k finishes a run that stopped before
    its average from fairseq's log: its updates, seconds and epochs averaged."""
    import torch

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from bench_multi30k import finish_fairseq
    from fairseq_average_checkpoints import average, newest_epochs

    saved = tmp_path / "literature"
    saved.mkdir()
    for epoch in (2, 9, 10, 11):  # "checkpoint10" sorts before "checkpoint9" by name
        torch.save({"model": {"w": torch.full((2,), float(epoch)), "n": torch.tensor([epoch], dtype=torch.int64)},
                    "epoch": epoch}, saved / f"checkpoint{epoch}.pt")
    torch.save({"model": {}}, saved / "checkpoint_last.pt")
    paths = newest_epochs(saved, 3)
    assert [p.name for p in paths] == ["checkpoint11.pt", "checkpoint10.pt", "checkpoint9.pt"]
    state = average(paths)
    assert state["epoch"] == 11 and torch.equal(state["model"]["w"], torch.full((2,), 10.0))
    assert state["model"]["n"].dtype == torch.int64 and state["model"]["n"].item() == 10
    with pytest.raises(SystemExit, match="5 epoch checkpoints asked for, 4 found"):
        newest_epochs(saved, 5)

    (tmp_path / "literature.log").write_text(
        "| INFO | train | epoch 011 | loss 4.7 | num_updates 1090 | lr 0.0027\n"
        "| INFO | train | epoch 011 | loss 4.7 | num_updates 1094 | lr 0.0027\n"
        "| INFO | fairseq_cli.train | done training in 3599.6 seconds\n", encoding="utf-8")
    (saved / "average.pt").write_bytes(b"made")  # already averaged: nothing to run in fairseq's venv
    summary = finish_fairseq(tmp_path / "no-anchor", tmp_path)
    assert (summary["updates"], summary["training_seconds"], summary["epochs_averaged"]) == (1094, 3599.6, 4)
    assert (saved / "average.pt").read_bytes() == b"made"


@pytest.mark.slow  # make test-slow, to keep the default suite under 10 minutes on an AVX2 Zen 1: the tables from kept records: test_the_test_figures_marked_in_readme_and_docs_are_what_the_kept_run_records_give
def test_results_tables_from_the_records_of_small_runs(tmp_path):
    """Two seeds of one small preset trained, decoded and scored by the CLI, one of them scored
    twice: the table's mean ± sd is that of the first scorings' literature scores as the records
    hold them, the second scoring said beside it; its JSON lines name each run's weights and
    search; an existing file in --output is not written over without --replace."""
    import statistics

    from tests.conftest import run_cli
    from translate.core.run_record import RunRecord

    need(MULTI30K)
    runs = []
    for seed in (1, 2):
        overrides = small_run(tmp_path, "train.max_steps=2", f"train.seed={seed}", "checkpoint.average_last=0",
                              folder=f"seed{seed}")
        run_cli("train", *overrides, check=True)
        run_cli("decode", *overrides, "decode.max_len_b=3", "decode.beam_size=2", check=True)
        run_cli("bleu", *overrides, check=True)
        if seed == 1:  # decoded again, other outputs, and scored again: the test split seen twice
            run_cli("decode", *overrides, "decode.max_len_b=8", "decode.beam_size=1", check=True)
            run_cli("bleu", *overrides, check=True)
        runs.append(tmp_path / f"seed{seed}")
    scorings = RunRecord.load(runs[0]).test_scorings()
    assert len(scorings) == 2 and scorings[0].scores != scorings[1].scores  # the first is the figure, not the last
    firsts = [RunRecord.load(run).test_scorings()[0].scores["lowercased_tokenized_bleu"]["value"] for run in runs]
    out = tmp_path / "figures"
    script = [sys.executable, str(ROOT / "scripts" / "results_tables.py"), *map(str, runs), "--output", str(out),
              "--name", "small"]
    result = run(script, timeout=120, check=True)
    mean, sd = statistics.mean(firsts), statistics.stdev(firsts)
    row_line = next(line for line in result.stdout.splitlines() if "| tiny | test |" in line)
    assert f"| {mean:.2f} ± {sd:.2f} (test split scored 2x, 1x) |" in row_line, row_line
    assert "| lowercased_tokenized_bleu | 2 |" in row_line
    assert (out / "small.md").read_text(encoding="utf-8") == result.stdout
    row, = [json.loads(line) for line in (out / "small.jsonl").read_text(encoding="utf-8").splitlines()]
    assert (row["preset"], row["split"], row["n"], row["mean"], row["sd"]) == ("tiny", "test", 2, mean, sd)
    assert [(e["seed"], e["scorings"], e["beam"], e["update"], e["averaged"]) for e in row["runs"]] == \
        [(1, 2, 2, 2, []), (2, 1, 2, 2, [])]
    assert all(e["commit"] and e["cpu"] and e["alpha_origin"] for e in row["runs"])
    assert [e["updates"] for e in row["runs"]] == [2, 2] and row["updates_range"] == "2"  # both trained 2 updates
    assert row["alpha_range"] == str(row["runs"][0]["alpha"])  # both decoded with the same alpha
    again = run(script, timeout=120)
    assert again.returncode != 0 and "small.md exists" in again.stderr
    assert run(script + ["--replace"], timeout=120).returncode == 0
    # --fill writes the figure where a page marks its place, and only there.
    page = tmp_path / "page.md"
    page.write_text("| x | <!-- figure tiny test -->typed 99.9<!-- /figure --> |\n"
                    "<!-- figure tiny test_2017_flickr -->kept<!-- /figure -->\n", encoding="utf-8")
    run(script + ["--replace", "--fill", str(page)], timeout=120, check=True)
    assert page.read_text(encoding="utf-8") == (f"| x | <!-- figure tiny test -->{mean:.2f} ± {sd:.2f} (test split scored "
                                                f"2x, 1x), 2 seeds (1, 2)<!-- /figure --> |\n"
                                                "<!-- figure tiny test_2017_flickr -->kept<!-- /figure -->\n")


def test_results_tables_span_states_the_runs_range_as_a_page_writes_it():
    """The conditions a page states beside a mean (updates, alpha), worked by hand."""
    span = script_module("results_tables").span
    assert span([4898, 5807, 5650], "{:,}") == "4,898-5,807"
    assert span([1.5, 1.8, 1.5], "{}") == "1.5-1.8"
    assert span([0.8, 0.8], "{}") == "0.8"
    assert span([6112, None], "{:,}") == "?"  # a record without the value: no range is made up


@pytest.mark.parametrize("beam4, chosen_beam", [(31.8, 4), (31.5, 5)], ids=["beam-4-better", "beam-4-ties"])
def test_sweep_dev_choice_by_hand(monkeypatch, tmp_path, beam4, chosen_beam):
    """The sweep's dev choice on a small table, worked by hand: the averages at beam 5, alpha 0.6
    score 30.0 (last 1), 31.5 (3), 31.5 (5), 30.9 (10): the last 3 (the tie goes to fewer). Beam 4
    for it scores `beam4`: above 31.5 it is the beam tune chooses alpha at and the literature's
    score is decoded at; a tie keeps beam 5. tune's scores: alpha 1.2 best (33.0)."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import sweep_multi30k

    table = {(1, 5, 0.6): 30.0, (3, 5, 0.6): 31.5, (5, 5, 0.6): 31.5, (10, 5, 0.6): 30.9, (3, 4, 0.6): beam4,
             (3, chosen_beam, 1.2): 33.0}
    decodes, commands = [], []

    def dev_bleu(run, average, beam, alpha, threads):
        decodes.append((average, beam, alpha))
        return {"average": average, "beam": beam, "alpha": alpha, "sacrebleu": table[(average, beam, alpha)],
                "literature": table[(average, beam, alpha)] + 1}

    tune = {"alpha": 1.2, "scores": [{"alpha": 0.6, "sacrebleu": 32.0, "bp": 0.9}, {"alpha": 1.2, "sacrebleu": 33.0, "bp": 1.0}]}
    monkeypatch.setattr(sweep_multi30k, "dev_bleu", dev_bleu)
    monkeypatch.setattr(sweep_multi30k, "translate", lambda *args, threads=None: commands.append(args))
    monkeypatch.setattr(sweep_multi30k, "record_of", lambda run: {"length_penalty": tune, "settings": {}})
    run = tmp_path / "run"
    (run / "sweep").mkdir(parents=True)
    result = sweep_multi30k.evaluate(run, threads=1)
    assert (result["best_average"], result["best_beam"], result["tuned_alpha"]) == (3, chosen_beam, 1.2)
    assert (result["dev_bleu_beam5_alpha0.6"], result["dev_bleu_beam4_alpha0.6"], result["dev_bleu_tuned"]) == (31.5, beam4, 33.0)
    assert decodes == [(1, 5, 0.6), (3, 5, 0.6), (5, 5, 0.6), (10, 5, 0.6), (3, 4, 0.6), (3, chosen_beam, 1.2)]
    tuned, = commands
    assert tuned[0] == "tune" and f"decode.beam_size={chosen_beam}" in tuned
    assert f"decode.checkpoint={run / 'sweep' / 'avg3.pt'}" in tuned
    assert result["dev_literature_bleu_tuned"] == 34.0


@pytest.mark.slow  # make test-slow, to keep the default suite under 10 minutes on an AVX2 Zen 1: bleu's record of a scoring: test_run_record
def test_score_multi30k_tests_records_each_scoring(tmp_path):
    """score_multi30k_tests.py scores through `translate bleu`: each of the three test sets'
    scoring is in the run's record with the checkpoint, beam and alpha decoded; run again, each
    test set counts two scorings, and `translate table` says so."""
    from tests.conftest import run_cli
    from translate.core.run_record import RunRecord

    need(MULTI30K)
    overrides = small_run(tmp_path, "train.max_steps=2")
    run_cli("train", *overrides, check=True)
    run_dir, checkpoint = tmp_path / "run", tmp_path / "run" / "checkpoint_last.pt"
    script = [sys.executable, str(ROOT / "scripts" / "score_multi30k_tests.py"), str(run_dir), str(checkpoint),
              "--beam", "2", "--alpha", "0.8", "--set", "decode.max_len_b=2"]
    for _ in range(2):
        lines = [json.loads(line) for line in run(script, timeout=300, check=True).stdout.splitlines()]
        assert [line["split"] for line in lines] == ["test_2016_flickr", "test_2017_flickr", "test_2017_mscoco"]
    record = RunRecord.load(run_dir)
    by_split = {}
    for score in record.scores:
        by_split.setdefault(score.split, []).append(score)
    assert sorted(by_split) == ["test", "test_2017_flickr", "test_2017_mscoco"]
    for split, scorings in by_split.items():
        assert len(scorings) == 2 and all(s.held_out for s in scorings), split
        decoded = scorings[-1].decoded
        assert (decoded.checkpoint, decoded.beam_size, decoded.length_penalty, decoded.weights.update) == \
            (str(checkpoint), 2, 0.8, 2)
    assert round(scorings[-1].scores["lowercased_tokenized_bleu"]["value"], 2) == lines[-1]["lowercased_tokenized_bleu"]
    assert len(record.test_scorings()) == 2  # decode.split=test: test_2016_flickr
    row = json.loads(run_cli("table", f"table.runs=[{run_dir}]", "table.format=json", check=True).stdout)[0]
    assert row["test_scorings"] == 2


def test_the_figures_marked_in_readme_and_docs_are_their_records_values():
    """Every `<!-- value FILE MEASUREMENT KEY -->` in README, docs/results.md and docs/reliability.md holds what its
    record file says (scripts/fill_figures.py writes them): a figure typed over, or a record
    changed without writing the page again, fails here."""
    result = run([sys.executable, str(ROOT / "scripts" / "fill_figures.py"), "--check", str(ROOT / "README.md"),
                  str(ROOT / "docs" / "results.md"), str(ROOT / "docs" / "reliability.md")], timeout=60)
    assert result.returncode == 0, result.stderr


def test_the_test_figures_marked_in_readme_and_docs_are_what_the_kept_run_records_give():
    """Every `<!-- figure PRESET SPLIT -->` in README and docs/results.md holds what
    scripts/results_tables.py computes from the run records kept in docs/records/: a test score
    typed over, or a record added without --fill, fails here."""
    from translate.core import run_record

    results_tables = script_module("results_tables")
    kept = sorted(str(path) for path in (ROOT / "docs" / "records").iterdir() if path.is_dir())
    found = results_tables.rows(run_record.run_dirs(kept), "literature", "first")
    assert {row["preset"] for row in found} >= {"multi30k_lowercase"}
    for page in (ROOT / "README.md", ROOT / "docs" / "results.md"):
        text = page.read_text(encoding="utf-8")
        filled, written = results_tables.fill(text, found)
        assert written > 0, f"{page.name} marks none of the kept records' figures"
        assert filled == text, f"{page.name}: a test figure differs from its records (results_tables.py --fill)"


def test_preset_chain_refuses_train_args_that_change_the_recipe_and_an_existing_folder(tmp_path):
    """TRAIN_ARGS may set train.threads, how fast a seed runs, and nothing of what it trains: anything else
    is refused in one line, before the run's folder is made, so no seed of a preset runs off its recipe."""
    script = ROOT / "scripts" / "preset_chain.sh"
    run_dir = tmp_path / "run"
    env = {**os.environ, "TRAIN_ARGS": "train.threads=1 optim.lr_scale=3"}
    result = run(["bash", str(script), "multi30k_lowercase", "1", str(run_dir)], env=env, timeout=60)
    assert result.returncode == 2
    assert "TRAIN_ARGS takes train.threads only, not optim.lr_scale=3" in result.stderr
    assert not run_dir.exists()
    # A seed's folder that exists is refused in one line and left as it was: its test splits were scored.
    run_dir.mkdir()
    (run_dir / "kept").write_text("kept\n")
    result = run(["bash", str(script), "multi30k_lowercase", "1", str(run_dir)], timeout=60)
    assert result.returncode == 1 and result.stderr.strip() == (
        f"preset_chain: {run_dir} exists; a seed's test splits are scored once: give a new RUN_DIR")
    assert [path.name for path in run_dir.iterdir()] == ["kept"]


def test_dev_candidate_refuses_a_seed_or_folder_given_twice_and_an_existing_folder(tmp_path):
    """The seed and the run folder are the script's arguments: an override that sets them again is
    refused in one line, before anything is made; an existing run folder is refused and left as it was."""
    script = ROOT / "scripts" / "dev_candidate.sh"
    run_dir = tmp_path / "run"
    result = run(["bash", str(script), "multi30k_lowercase", "1", str(run_dir), "model.layers=6", "train.seed=2"], timeout=60)
    assert result.returncode == 2 and result.stderr.strip() == "dev_candidate: train.seed=2 is set by the script's arguments"
    assert not run_dir.exists()
    run_dir.mkdir()
    (run_dir / "kept").write_text("kept\n")
    result = run(["bash", str(script), "multi30k_lowercase", "1", str(run_dir)], timeout=60)
    assert result.returncode == 1 and "exists; give a new RUN_DIR" in result.stderr
    assert [path.name for path in run_dir.iterdir()] == ["kept"]


def fake_python(folder, block_first_call=False):
    """A PYTHON for the chain scripts that writes each call's arguments to folder/calls; with
    block_first_call, the first call waits for folder/go (a training the test can edit beside)."""
    script = folder / "python"
    wait = (f'if [ "$(wc -l < {folder}/calls)" = 1 ]; then while [ ! -e {folder}/go ]; do sleep 0.05; done; fi\n'
            if block_first_call else "")
    script.write_text(f'#!/bin/sh\necho "$@" >> {folder}/calls\n{wait}')
    script.chmod(0o755)
    return script


def test_dev_candidate_gives_tune_overrides_to_tune_and_the_rest_to_train(tmp_path):
    """train would take tune.extend_to and leave it unused in its config; tune is the verb that reads it."""
    python = fake_python(tmp_path)
    run_dir = tmp_path / "run"
    result = run(["bash", str(ROOT / "scripts" / "dev_candidate.sh"), "multi30k_lowercase", "3", str(run_dir),
                  "data.vocab_size=4000", "tune.extend_to=5"], env={**os.environ, "PYTHON": str(python)}, timeout=60)
    assert result.returncode == 0, result.stderr
    common = f"config=multi30k_lowercase run_dir={run_dir}"
    assert (tmp_path / "calls").read_text().splitlines() == [
        f"-m translate train {common} data.vocab_size=4000 train.seed=3", f"-m translate tune {common} tune.extend_to=5"]
    assert "ended: " in (run_dir / "machine.txt").read_text()


@pytest.mark.parametrize("name, calls", [("dev_candidate.sh", ["train", "tune"]),
                                         ("preset_chain.sh", ["train", "tune", "decode", "bleu"])])
def test_chain_scripts_run_to_their_end_when_edited_during_the_training(tmp_path, name, calls):
    """Bash reads a script as it runs it: a copy of the script edited in place while its training
    runs (lines added at its top) must not change what the rest of the run does."""
    checkout = tmp_path / "scripts"
    checkout.mkdir()
    for script in (name, "machine_txt.sh"):
        (checkout / script).write_bytes((ROOT / "scripts" / script).read_bytes())
    subprocess.run(["git", "init", "-q", str(checkout)], check=True)
    python = fake_python(tmp_path, block_first_call=True)
    arguments = ["test"] if name == "preset_chain.sh" else []
    process = subprocess.Popen(["bash", str(checkout / name), "multi30k_lowercase", "3", str(tmp_path / "run"), *arguments],
                               env={**os.environ, "PYTHON": str(python)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            if (tmp_path / "calls").exists():
                break
            time.sleep(0.05)
        edited = checkout / name
        text = edited.read_text()
        with open(edited, "r+") as same_file:  # the same inode, as an editor that writes in place would
            same_file.write("#!/usr/bin/env bash\n# an edit\n" * 3 + text.split("\n", 1)[1])
        (tmp_path / "go").touch()
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, stderr
    assert [line.split()[2] for line in (tmp_path / "calls").read_text().splitlines()] == calls


def test_machine_txt_names_the_cpu_the_commit_and_an_isa_forced_down():
    """The head of machine.txt that preset_chain.sh and dev_candidate.sh both write: lscpu, the
    checkout's commit, and an ISA the environment forces down (an AVX2 hour's), and nothing else of the env."""
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "UNRELATED_SETTING": "1"}
    result = run(["bash", "-c", f"source {ROOT / 'scripts' / 'machine_txt.sh'} && machine_txt {ROOT / 'scripts'}"], env=env, timeout=60)
    lines = result.stdout.splitlines()
    assert result.returncode == 0 and lines[0].startswith("Architecture:")
    assert lines[-2:] == [f"commit {head}", "ATEN_CPU_CAPABILITY=avx2"]


def test_fill_figures_writes_a_records_value_where_a_page_marks_it(tmp_path):
    fill_figures = script_module("fill_figures")
    (tmp_path / "r.jsonl").write_text('{"measurement": "a", "speed": 0.5}\n{"measurement": "a", "speed": 0.9042, '
                                      '"wall": {"median": 2.081}}\n', encoding="utf-8")
    page = ("at <!-- value r.jsonl a speed .2fx -->1.20x<!-- /value --> and "
            "<!-- value r.jsonl a wall.median .1f -->2.1<!-- /value --> s")
    text, changed = fill_figures.fill(page, tmp_path)
    assert text == ("at <!-- value r.jsonl a speed .2fx -->0.90x<!-- /value --> and "
                    "<!-- value r.jsonl a wall.median .1f -->2.1<!-- /value --> s")
    assert [(was, now) for _, was, now in changed] == [("1.20x", "0.90x")]  # the last line of the measurement
    with pytest.raises(fill_figures.MissingValue, match="no measurement 'b'"):
        fill_figures.fill("<!-- value r.jsonl b speed -->?<!-- /value -->", tmp_path)
    with pytest.raises(fill_figures.MissingValue, match="has no cpu"):
        fill_figures.fill("<!-- value r.jsonl a cpu -->?<!-- /value -->", tmp_path)


def test_fill_figures_takes_the_line_a_field_selects(tmp_path):
    """MEASUREMENT[FIELD=VALUE]: one split of a file with a line per split (fairseq_best.py's),
    not the file's last line of that measurement."""
    fill_figures = script_module("fill_figures")
    (tmp_path / "r.jsonl").write_text('{"measurement": "t", "split": "test", "bleu": 40.1}\n'
                                      '{"measurement": "t", "split": "test_2017_flickr", "bleu": 33.2}\n', encoding="utf-8")
    text, _ = fill_figures.fill("<!-- value r.jsonl t[split=test] bleu .2f -->?<!-- /value --> and "
                                "<!-- value r.jsonl t bleu -->?<!-- /value -->", tmp_path)
    assert text == ("<!-- value r.jsonl t[split=test] bleu .2f -->40.10<!-- /value --> and "
                    "<!-- value r.jsonl t bleu -->33.2<!-- /value -->")
    with pytest.raises(fill_figures.MissingValue, match=r"no measurement 't\[split=dev\]'"):
        fill_figures.fill("<!-- value r.jsonl t[split=dev] bleu -->?<!-- /value -->", tmp_path)
    # Several fields, each of which must match: the line of one run and one window.
    (tmp_path / "w.jsonl").write_text("".join(json.dumps({"measurement": "w", "label": label, "n": n, "bleu": bleu}) + "\n"
                                              for label, n, bleu in (("a", 10, 1.0), ("a", 20, 2.0), ("b", 10, 3.0))))
    text, _ = fill_figures.fill("<!-- value w.jsonl w[label=a,n=10] bleu -->?<!-- /value -->", tmp_path)
    assert text == "<!-- value w.jsonl w[label=a,n=10] bleu -->1.0<!-- /value -->"
    with pytest.raises(fill_figures.MissingValue, match="no measurement"):
        fill_figures.fill("<!-- value w.jsonl w[label=b,n=20] bleu -->?<!-- /value -->", tmp_path)


@pytest.mark.slow  # make test-slow, to keep the default suite under 10 minutes on an AVX2 Zen 1: a benchmark's own test
def test_chaos_save_stall_measures_both_ways_of_writing():
    """scripts/chaos.py --save-stall at a small size: the foreground and background figures of
    docs/reliability.md, each a positive number of seconds, and the files it wrote gone."""
    result = run([sys.executable, str(ROOT / "scripts" / "chaos.py"), "--save-stall", "tiny"], timeout=300)
    assert result.returncode == 0, result.stderr
    line = json.loads(result.stdout.splitlines()[-1])
    assert line["measurement"] == "save_stall_tiny" and line["preset"] == "tiny"
    for key in ("checkpoint_last_s", "numbered_s", "foreground_stop_s", "background_stop_s", "background_write_s"):
        assert line[key] >= 0, key
    assert line["checkpoint_last_gb"] > line["numbered_gb"] > 0  # the last holds Adam's moments too


def test_fairseq_best_chooses_the_length_penalty_as_tune_chooses_alpha():
    sys.path.insert(0, str(ROOT / "scripts"))
    import fairseq_best

    dev = {0.0: 30.0, 0.5: 31.0, 1.0: 32.0, 1.5: 32.5, 2.0: 32.4, 2.5: 33.9}  # a hand-set table of dev scores
    tried = []
    scores = fairseq_best.search_lenpens([0.0, 0.5, 1.0], 3.0, lambda lenpen: tried.append(lenpen) or dev[lenpen])
    assert tried == [0.0, 0.5, 1.0, 1.5, 2.0]  # extended while the largest was best, then stopped
    assert fairseq_best.choose(scores) == 1.5
    assert fairseq_best.choose({0.6: 30.0, 1.2: 30.0, 0.9: 29.0}) == 1.2  # a tie: the nearest fairseq's default, 1.0


def test_fairseq_best_says_so_without_the_anchor(tmp_path):
    result = run([sys.executable, str(ROOT / "scripts" / "fairseq_best.py"), "--minutes", "1"],
                 env=dict(os.environ, FAIRSEQ_ANCHOR=str(tmp_path / "none")), timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["skipped"].startswith("fairseq anchor not built")


def test_compare_trees_preset_alternates_the_trees_and_reads_each_run(tmp_path, monkeypatch, capsys):
    """--preset's rounds run base, this, then this, base; each run's updates and whole-run rate come
    from its run record, its MFU from the log's windows, and the round's ratio is this over base.
    --set's overrides reach this tree's runs alone, after the preset."""
    import subprocess
    from pathlib import Path

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import compare_trees

    order, updates = [], {"base": [100, 110], "this": [150, 160]}

    def fake_translate(tree, *args):
        name = "this" if tree == compare_trees.ROOT else "base"
        order.append(name)
        assert list(args[:3]) == (["train", "config=multi30k_lowercase", "data.vocab_size=4000"] if name == "this"
                                  else ["train", "config=multi30k_lowercase", "train.max_minutes=5.0"])
        run_dir = Path(next(a for a in args if a.startswith("run_dir="))[len("run_dir="):])
        run_dir.mkdir(parents=True)
        n = updates[name][len([o for o in order if o == name]) - 1]
        (run_dir / "run_record.json").write_text(json.dumps(
            {"training": {"updates": n, "seconds": 300.0, "target_tokens": n * 3000}}))
        log = "".join(f"[x][translate.training.monitor][INFO] - update {k}: loss 5.0 mfu {m}% of 1.05 TFLOP/s bf16 peak\n"
                      for k, m in ((20, 30), (40, 34)))
        return subprocess.CompletedProcess(args, 0, "", log)

    monkeypatch.setattr(compare_trees, "translate", fake_translate)
    compare_trees.preset_throughput(tmp_path / "base", "multi30k_lowercase", 5.0, 2, 2, tmp_path, ["data.vocab_size=4000"])
    assert order == ["base", "this", "this", "base"]
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    runs = [line for line in lines if line["measurement"] == "preset_run"]
    assert [(r["tree"], r["updates"], r["target_tokens_per_s"], r["mfu_percent"]) for r in runs] == \
        [("base", 100, 1000.0, 32.0), ("this", 150, 1500.0, 32.0), ("this", 160, 1600.0, 32.0), ("base", 110, 1100.0, 32.0)]
    assert runs[0]["peak"] == "1.05 TFLOP/s bf16" and runs[1]["overrides"] == ["data.vocab_size=4000"]
    assert [line["ratio"] for line in lines if line["measurement"] == "preset_round"] == [1.5, 1.455]


def test_paired_seeds_subtracts_each_seeds_baseline_score_from_the_candidates(tmp_path, monkeypatch):
    """Two presets' kept runs paired by seed: each split's differences are the candidate's score
    minus the baseline's of the same seed, as the records hold them (tune's dev sacreBLEU at its
    alpha; a test split's first lowercased tokenized BLEU); runs whose seeds or splits differ are refused."""
    paired_seeds = script_module("paired_seeds")
    kept = ROOT / "docs" / "records-zen3"
    candidate = sorted(kept.glob("multi30k_lowercase_fitted_warmup-zen3-1t-seed*"))
    baseline = sorted(kept.glob("multi30k_lowercase-zen3-1t-seed*"))
    assert len(candidate) == len(baseline) >= 2

    def by_hand(run, split):
        record = json.loads((run / "run_record.json").read_text(encoding="utf-8"))
        if split == "tuned_dev":
            tune = record["length_penalty"]
            return next(s["sacrebleu"] for s in tune["scores"] if s["alpha"] == tune["alpha"])
        first = next(s for s in record["scores"] if s["hyp"] == f"decode/{split}.de")
        return first["scores"]["lowercased_tokenized_bleu"]["value"]

    from translate.core.run_record import RunRecord
    loads = []
    original_load = RunRecord.load.__func__
    monkeypatch.setattr(RunRecord, "load", classmethod(lambda cls, run: loads.append(run) or original_load(cls, run)))
    lines = {line["split"]: line for line in paired_seeds.lines(candidate, baseline)}
    assert sorted(loads) == sorted(candidate + baseline)  # each record read once
    monkeypatch.undo()
    assert set(lines) == {"tuned_dev", "test", "test_2017_flickr", "test_2017_mscoco", "test_2018_flickr"}
    for split, line in lines.items():
        expected = [by_hand(ours, split) - by_hand(theirs, split) for ours, theirs in zip(candidate, baseline)]
        assert line["differences"] == pytest.approx(expected, abs=1e-9), split
        assert line["candidate_ahead"] == sum(d > 0 for d in expected)
        assert (line["candidate"], line["baseline"]) == ("multi30k_lowercase_fitted_warmup", "multi30k_lowercase")
    script = [sys.executable, str(ROOT / "scripts" / "paired_seeds.py"), *map(str, candidate), "--against", str(baseline[0])]
    result = run(script, timeout=120)
    assert result.returncode != 0 and "are not the baseline's" in result.stderr
    from translate.core.errors import TranslateError
    with pytest.raises(TranslateError, match="one side's runs name 2 presets"):  # a side mixes presets
        paired_seeds.lines([candidate[0], baseline[1]], baseline[:2])
    with pytest.raises(TranslateError, match="2 runs but 1 seeds scored"):  # one seed given twice
        paired_seeds.lines([candidate[0], candidate[0]], baseline[:2])
    # A split that only the baseline scored is refused too, not left out of the comparison.
    unscored = []
    for kept_run in candidate:
        record = json.loads((kept_run / "run_record.json").read_text(encoding="utf-8"))
        record["scores"] = [s for s in record["scores"] if s["hyp"] != "decode/test_2018_flickr.de"]
        (tmp_path / kept_run.name).mkdir()
        (tmp_path / kept_run.name / "run_record.json").write_text(json.dumps(record), encoding="utf-8")
        unscored.append(tmp_path / kept_run.name)
    with pytest.raises(TranslateError, match="test_2018_flickr: scored by the baseline's runs but not the candidate's"):
        paired_seeds.lines(unscored, baseline)


def test_dev_candidates_names_the_setting_and_averages_its_seeds(tmp_path):
    """Runs of a baseline and a candidate: a line per run naming its differing setting, then one per
    setting with the mean and sd over its seeds, all from the records (tune's choice included, and
    the epochs: the target tokens trained over the corpus's, and the model's parameters)."""
    import statistics

    dev_candidates = script_module("dev_candidates")
    from translate.core.run_record import (DataFacts, ModelFacts, RunRecord, TrainingTotals, TrainTokens, Validation,
                                           VocabularyFacts)

    def recorded(name, seed, rdrop, tuned):
        training = TrainingTotals(updates=100 * seed, seconds=60.0, model_flops=1e12, target_tokens=10**6,
                                  skipped_updates=0, device="cpu", processes=1, precision="bf16")
        data = DataFacts(source="m30k", name=None, languages=["en", "de"], train_pairs=10, train_pairs_kept=10,
                         train_tokens=TrainTokens(source=240_000, target=250_000),
                         vocabulary=VocabularyFacts(size=8000, given=None, specials={"pad": 0}))
        record = RunRecord(settings={"train": {"seed": seed, "rdrop": rdrop}}, training=training, data=data,
                           model=ModelFacts(parameters=1000 + seed), valid=Validation(update=100, metrics={"loss": 2.7, "nll": 1.6, "bleu": 40.0}))
        record.others["length_penalty"] = {"alpha": 1.0, "scores": [{"alpha": 0.6, "sacrebleu": 0.0},
                                                                    {"alpha": 1.0, "sacrebleu": tuned}]}
        record.save(tmp_path / name)
        return tmp_path / name

    runs = [recorded("base", 8, 0.0, 41.9), recorded("rd-11", 11, 5.0, 42.8), recorded("rd-12", 12, 5.0, 43.2)]
    lines = dev_candidates.lines(runs)
    assert [(line["measurement"], line["setting"]) for line in lines] == [
        ("dev_run", "baseline"), ("dev_run", "train.rdrop=5.0"), ("dev_run", "train.rdrop=5.0"),
        ("dev_candidate", "baseline"), ("dev_candidate", "train.rdrop=5.0")]
    assert lines[1]["label"] == "rd-11" and lines[1]["tuned_dev_bleu"] == 42.8 and lines[1]["updates"] == 1100
    assert lines[1]["epochs"] == 4.0 and lines[1]["dev_update"] == 100  # 10^6 target tokens trained, 250,000 a pass
    assert [line["parameters"] for line in lines[:3]] == [1008, 1011, 1012]
    candidate = lines[-1]
    assert candidate["n"] == 2 and candidate["seeds"] == [11, 12]
    assert candidate["tuned_dev_bleu"] == statistics.mean([42.8, 43.2])
    assert candidate["tuned_dev_bleu_sd"] == statistics.stdev([42.8, 43.2]) and lines[-2]["tuned_dev_bleu_sd"] is None
    # A paired comparison, one seed for both: translate table leaves out a setting that does not
    # differ, but each line still names the seed, from the record.
    paired = dev_candidates.lines([recorded("base-13", 13, 0.0, 33.5), recorded("rd-13", 13, 5.0, 32.5)])
    assert [line["seed"] for line in paired[:2]] == [13, 13] and [line["seeds"] for line in paired[2:]] == [[13], [13]]
    assert paired[1]["tuned_dev_bleu_vs_baseline"] == pytest.approx(32.5 - 33.5) and paired[0]["tuned_dev_bleu_vs_baseline"] is None
    assert all(line["tuned_dev_bleu_vs_baseline"] is None for line in lines[:3])  # no baseline run of seeds 11 and 12
    assert candidate["paired_seeds"] == 0 and candidate["tuned_dev_bleu_vs_baseline"] is None
    # Two seeds each side: the setting's line has the mean and sd of its two paired differences.
    two = dev_candidates.lines([recorded("b-13", 13, 0.0, 33.5), recorded("b-14", 14, 0.0, 34.0),
                                recorded("c-13", 13, 5.0, 34.5), recorded("c-14", 14, 5.0, 34.2)])
    assert two[-1]["paired_seeds"] == 2 and two[-1]["tuned_dev_bleu_vs_baseline"] == pytest.approx((1.0 + 0.2) / 2)
    assert two[-1]["tuned_dev_bleu_vs_baseline_sd"] == pytest.approx(statistics.stdev([1.0, 0.2]))
    # Under BPE-dropout an epoch holds the sampled segmentations' tokens: the epochs count those.
    sampled = recorded("bpe-15", 15, 0.0, 33.0)
    record = RunRecord.load(sampled)
    record.data.epoch_tokens = TrainTokens(source=300_000, target=312_500)
    record.save(sampled)
    assert dev_candidates.lines([sampled])[0]["epochs"] == 3.2  # 10^6 target tokens trained, 312,500 a pass


def refuses_to_write_over_an_output(script: str, tmp_path) -> None:
    """SCRIPT RUN --output FILE, FILE existing: a non-zero exit naming --replace, FILE as it was."""
    output = tmp_path / "lines.jsonl"
    output.write_text("kept\n")
    result = run([sys.executable, script, str(tmp_path), "--output", str(output)], timeout=120)
    assert result.returncode != 0 and "exists (--replace writes over it)" in result.stderr
    assert output.read_text() == "kept\n"


def test_dev_candidates_refuses_a_folder_that_is_not_a_run_and_an_existing_output(tmp_path):
    """One line naming the problem and a non-zero exit; an existing --output stays as it was."""
    script = str(ROOT / "scripts" / "dev_candidates.py")
    result = run([sys.executable, script, str(tmp_path / "missing")], timeout=120)
    assert result.returncode != 0 and result.stderr.strip().splitlines() == [
        f"dev_candidates.py: error: {tmp_path / 'missing'} is not a run: it has no run_record.json "
        "(translate train writes one), nor has any folder below it"]
    refuses_to_write_over_an_output(script, tmp_path)


def test_bench_make_test_reads_pytests_summary_line():
    """bench_make_test.py's counts and seconds are pytest's last summary line's; no line, None."""
    bench = script_module("bench_make_test")
    output = "....\n= 3 failed, 475 passed, 2 skipped in 552.09s (0:09:12) =\n"
    assert bench.summary("collecting\n475 passed in 1.5s\n" + output) == \
        {"failed": 3, "passed": 475, "skipped": 2, "seconds": 552.09}
    assert bench.summary("475 passed in 552.09s (0:09:12)") == {"passed": 475, "seconds": 552.09}
    assert bench.summary("make: *** [test] Error 2") is None


def test_bench_make_test_names_a_failed_install_in_one_line(tmp_path):
    """A tree whose `make install` fails: one line naming it and its last words, a non-zero exit, no JSON line."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "Makefile").write_text("install:\n\t@echo no wheel for you >&2; false\n", encoding="utf-8")
    for command in (["init", "-q"], ["add", "Makefile"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "m"]):
        subprocess.run(["git", "-C", str(tree), *command], check=True)
    result = run([sys.executable, str(ROOT / "scripts" / "bench_make_test.py"), "--tree", str(tree)], timeout=120)
    assert result.returncode != 0 and result.stdout == ""
    assert result.stderr.strip().splitlines() == ["bench_make_test: make install failed (2): no wheel for you"], result.stderr


def test_average_windows_scores_each_average_as_tune_would_and_leaves_the_run_as_it_was(tmp_path):
    """The last N checkpoints averaged by hand and decoded apart, scored by sacrebleu: the script's
    scores for N=1 and N=3; the run's files (its record, its average) unchanged."""
    import datasets
    import sacrebleu
    import torch

    from translate.checkpoint import Checkpoint
    from translate.core import paths
    from translate.core.config import DecodeConfig
    from translate.translator import Translator

    overrides = small_run(tmp_path, "train.max_steps=3", "train.log_every=1", "checkpoint.every_steps=1",
                          "checkpoint.every_minutes=null", "valid.every_steps=0")
    run(cli("train", *overrides), check=True, timeout=300)
    run_dir = tmp_path / "run"
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    numbered = paths.numbered_checkpoints(run_dir)
    assert len(numbered) == 3
    settings = [o for o in overrides if not o.startswith(("config=", "run_dir="))]
    result = run([sys.executable, str(ROOT / "scripts" / "average_windows.py"), str(run_dir), "--windows", "1", "3",
                  "--config", "tiny", "--set", *settings, "tune.alphas=[0.0,1.0]", "tune.extend_to=0",
                  "tune.sentences=40"], check=True, timeout=300)
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(line["measurement"], line["average_last"]) for line in lines] == [
        ("average_window", 1), ("average_window", 3), ("average_window_summary", 1), ("average_window_summary", 3)]
    assert (lines[0]["first"], lines[0]["last"], lines[1]["first"], lines[1]["last"]) == (3, 3, 1, 3)
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before

    rows = datasets.load_dataset(str(MULTI30K), "de-en", split="validation")["translation"][:40]
    loaded = [Checkpoint.load(p) for p in numbered]
    by_hand = Checkpoint.load(numbered[-1])
    by_hand.model = {name: torch.stack([c.model[name].double() for c in loaded]).mean(0).to(t.dtype)
                     for name, t in by_hand.model.items()}
    by_hand.save(tmp_path / "by_hand.pt")
    for line, path in ((lines[0], numbered[-1]), (lines[1], tmp_path / "by_hand.pt")):
        translator = Translator.from_checkpoint(path)
        for score in line["scores"]:
            hypotheses = translator.translate([r["en"] for r in rows], DecodeConfig(length_penalty=score["alpha"]))
            bleu = sacrebleu.corpus_bleu(hypotheses, [[r["de"] for r in rows]])
            assert (score["sacrebleu"], score["bp"]) == (round(bleu.score, 2), round(bleu.bp, 4))
    # The two averages translate differently (else the comparison above could not tell them apart).
    assert [s["ratio"] for s in lines[0]["scores"]] != [s["ratio"] for s in lines[1]["scores"]]
    assert lines[1]["vs_first_window"] == round(lines[1]["tuned_dev_bleu"] - lines[0]["tuned_dev_bleu"], 2)


def test_average_windows_refuses_a_folder_without_checkpoints_and_an_existing_output(tmp_path):
    script = str(ROOT / "scripts" / "average_windows.py")
    result = run([sys.executable, script, str(tmp_path)], timeout=120)
    assert result.returncode != 0 and result.stderr.strip().splitlines()[-1] == (
        f"average_windows.py: error: {tmp_path} holds no numbered checkpoints (checkpoint_<update>.pt) to average")
    (tmp_path / "checkpoint_5.pt").write_bytes(b"")
    refuses_to_write_over_an_output(script, tmp_path)
    result = run([sys.executable, script, str(tmp_path), "--windows", "1", "--set", f"data.path={MULTI30K}"], timeout=120)
    assert result.returncode == 1 and result.stdout == "" and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"average_windows.py: error: {tmp_path / 'checkpoint_5.pt'}")


def test_average_windows_summary_pairs_each_window_with_its_runs_own_first():
    """Per window, the mean and sd of each run's difference from its own first window; a run that
    lacked the first window (None) is left out of the summary, not compared with another window."""
    average_windows = script_module("average_windows")
    lines = [{"average_last": 10, "vs_first_window": 0.0}, {"average_last": 20, "vs_first_window": -0.2},
             {"average_last": 10, "vs_first_window": 0.0}, {"average_last": 20, "vs_first_window": 0.4},
             {"average_last": 20, "vs_first_window": None}]
    summary = {line["average_last"]: line for line in average_windows.summaries(lines)}
    assert summary[20]["runs"] == 2 and summary[20]["vs_first_window"] == 0.1 and summary[20]["ahead"] == 1
    assert summary[20]["vs_first_window_sd"] == round(statistics.stdev([-0.2, 0.4]), 2)
    assert summary[10]["vs_first_window"] == 0.0 and summary[10]["ahead"] == 0
