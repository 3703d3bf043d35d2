"""`translate export` (translate.verbs.export): a target written aside, then swapped in whole in
place of our own export, never of a foreign folder; where it goes; bad requests in one line."""

from tests.conftest import hook_env, one_line_error, run_cli, run_dir_of


def test_exporting_again_replaces_our_own_export_in_place(trained_run, tmp_path):
    """Exporting again replaces our own export in place and leaves no temporary folders."""
    folder = tmp_path / "ct2"
    run_cli("export", *trained_run, f"export.output={folder}", check=True)
    before = (folder / "model.bin").read_bytes()
    run_cli("export", *trained_run, f"export.output={folder}", check=True)
    assert (folder / "model.bin").read_bytes() == before
    assert sorted(p.name for p in folder.parent.iterdir()) == ["ct2"]


def test_bad_format_foreign_folder_and_missing_checkpoint_are_one_line_errors(tmp_path):
    run_dir = f"run_dir={tmp_path / 'run'}"
    one_line_error(run_cli("export", run_dir, "export.format=onnx"), "onnx")
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me\n", encoding="utf-8")
    one_line_error(run_cli("export", run_dir, f"export.output={foreign}"), str(foreign), "not a translate export")
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]
    one_line_error(run_cli("export", run_dir, f"export.output={tmp_path / 'out'}"), "no checkpoint at")
    assert not (tmp_path / "out").exists() and not any(p.name.startswith(".out") for p in tmp_path.iterdir())


def test_default_folder_is_under_run_dir(compose, tmp_path):
    from translate.core.paths import export_dir

    assert export_dir(compose("export")) == tmp_path / "run" / "export" / "ctranslate2"
    assert export_dir(compose("export", f"export.output={tmp_path}/x")) == tmp_path / "x"


def test_transformers_export_without_the_extra_names_it(trained_run, tmp_path):
    """Without transformers installed (here: made unimportable) the export says which extra to install."""
    result = run_cli("export", *trained_run, "export.format=transformers",
                     f"export.checkpoint={run_dir_of(trained_run) / 'checkpoint_last.pt'}", f"export.output={tmp_path / 'hf'}",
                     env=hook_env(tmp_path, blocked=["transformers"]))
    one_line_error(result, "transformers extra", "pip install")
    assert not (tmp_path / "hf").exists()


def test_a_model_of_lowercased_text_exports_with_a_warning_and_its_marker_says_so(trained_run, tmp_path):
    """An export does not lowercase its input as decode does for a model of lowercased text
    (data.lowercase): the export warns, and its marker records it for whoever loads it."""
    import json

    from translate import checkpoint
    from translate.core.paths import EXPORT_MARKER

    lowercased = tmp_path / "lowercased.pt"
    payload = checkpoint.load(run_dir_of(trained_run) / "checkpoint_last.pt")
    checkpoint.save(lowercased, {**payload, "lowercase": True})
    folder = tmp_path / "ct2"
    result = run_cli("export", *trained_run, f"export.checkpoint={lowercased}", f"export.output={folder}", check=True)
    assert "trained on lowercased text" in result.stderr and "lowercase it first" in result.stderr
    assert json.loads((folder / EXPORT_MARKER).read_text(encoding="utf-8"))["lowercase"] is True
