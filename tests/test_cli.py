"""The three verbs chained through the command line, and bad input as one clear line."""

import sacrebleu
import torch

from tests.conftest import SMALL, TEXT, need, one_line_error, run_cli, run_dir_of


def test_train_decode_bleu_chain(trained_run):
    run_dir = run_dir_of(trained_run)
    payload = torch.load(run_dir / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert payload["step"] == 30 and "model" in payload and "vocabulary" in payload
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in payload["model"])
    assert (run_dir / "tensorboard").is_dir() and (run_dir / "hydra" / "train").is_dir()

    decoded = run_cli("decode", *trained_run, "decode.beam_size=2")
    assert decoded.returncode == 0, decoded.stderr
    hyp = run_dir / "decode" / "test.de"
    ref = run_dir / "decode" / "test.de.ref"
    assert len(hyp.read_text(encoding="utf-8").splitlines()) == 1000  # Multi30k test_2016_flickr
    assert len(ref.read_text(encoding="utf-8").splitlines()) == 1000

    scored = run_cli("bleu", *trained_run)
    assert scored.returncode == 0, scored.stderr
    hyps = hyp.read_text(encoding="utf-8").splitlines()
    refs = ref.read_text(encoding="utf-8").splitlines()
    assert f"sacreBLEU {sacrebleu.corpus_bleu(hyps, [refs]).score:.2f}" in scored.stdout
    assert "signature: nrefs:1|case:mixed" in scored.stdout


def test_decode_a_text_file_in_input_order(trained_run, tmp_path):
    sentences = ["A dog runs.", "Two men are sitting on a bench in the park near a large tree.", "A girl."]
    (tmp_path / "in.en").write_text("\n".join(sentences) + "\n", encoding="utf-8")
    out = tmp_path / "out.de"
    result = run_cli("decode", *trained_run, f"decode.input={tmp_path}/in.en", f"decode.output={out}")
    assert result.returncode == 0, result.stderr
    together = out.read_text(encoding="utf-8").splitlines()
    assert len(together) == 3
    # One by one gives the same lines: output order and content do not depend on batching.
    (tmp_path / "one.en").write_text(sentences[1] + "\n", encoding="utf-8")
    result = run_cli("decode", *trained_run, f"decode.input={tmp_path}/one.en", f"decode.output={tmp_path}/one.de")
    assert (tmp_path / "one.de").read_text(encoding="utf-8").splitlines() == [together[1]]


def test_second_train_resumes_and_a_changed_model_is_refused(trained_run):
    result = run_cli("train", *trained_run)
    assert result.returncode == 0 and "nothing to do" in result.stderr + result.stdout
    one_line_error(run_cli("train", *trained_run, "model.d_model=64"), "different model", "d_model 32 != 64", logs=True)


def test_a_resume_with_changed_optimizer_or_schedule_settings_is_refused(trained_run):
    """The saved schedule would jump: each changed setting is named, and init_from offered."""
    result = run_cli("train", *trained_run, "optim.warmup_steps=21", "optim.lr_scale=2", "train.max_steps=40")
    one_line_error(result, "optim.warmup_steps=21 (saved: 20)", "optim.lr_scale=2.0 (saved: 1.0)", "train.init_from=",
                   logs=True)
    assert "resuming" not in result.stderr


def test_decode_without_checkpoint(tmp_path):
    one_line_error(run_cli("decode", *SMALL, f"run_dir={tmp_path}/empty"), "no checkpoint at", "checkpoint_last.pt")


def test_decode_with_a_foreign_checkpoint(tmp_path):
    torch.save({"weights": 1}, tmp_path / "other.pt")
    one_line_error(run_cli("decode", *SMALL, f"decode.checkpoint={tmp_path}/other.pt"), "not a translate checkpoint")


def test_train_with_missing_data_path(tmp_path):
    one_line_error(run_cli("train", f"data.path={tmp_path}/missing", f"run_dir={tmp_path}/run"), "missing data path")


def test_train_with_misaligned_text_keeps_nothing(tmp_path):
    (tmp_path / "c.en").write_text("a\nb\n")
    (tmp_path / "c.de").write_text("x\n")
    one_line_error(
        run_cli("train", "config=tiny", "data=text", f"data.train={tmp_path}/c", f"run_dir={tmp_path}/run"),
        "misaligned corpus",
    )
    assert not (tmp_path / "run" / "checkpoint_last.pt").exists()


def test_bleu_without_translations(tmp_path):
    one_line_error(run_cli("bleu", f"run_dir={tmp_path}"), "no translations at")


def test_decode_refuses_to_overwrite_its_input(trained_run, tmp_path):
    need(TEXT)
    source = tmp_path / "in.en"
    source.write_text("A dog.\n")
    one_line_error(run_cli("decode", *trained_run, f"decode.input={source}", f"decode.output={source}"), "overwrite")
    assert source.read_text() == "A dog.\n"
