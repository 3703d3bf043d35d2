"""Decoding options on a trained checkpoint: batching independence, n-best, sampling, stdin."""

import numpy as np
import pytest
import torch

from tests.conftest import MULTI30K, greedy_reference, need, one_line_error, run_cli, run_dir_of
from translate.core.config import DecodeConfig
from translate.search import Symbols
from translate.translator import Translator
from translate.verbs.decode import format_output


@pytest.fixture(scope="module")
def translator(trained_run):
    return Translator.from_checkpoint(run_dir_of(trained_run) / "checkpoint_last.pt")


@pytest.fixture(scope="module")
def sentences():
    need(MULTI30K)
    import datasets

    rows = datasets.load_dataset(str(MULTI30K), "de-en", split="test")["translation"][:40]
    return [row["en"] for row in rows]


def test_results_do_not_depend_on_batching(translator, sentences):
    together = translator.translate(sentences, DecodeConfig(beam_size=4, tokens_per_batch=100000, max_len_b=10))
    small = translator.translate(sentences, DecodeConfig(beam_size=4, tokens_per_batch=50, max_len_b=10))
    alone = [translator.translate([s], DecodeConfig(beam_size=4, max_len_b=10))[0] for s in sentences[:5]]
    assert together == small
    assert together[:5] == alone


def test_beam_one_is_greedy(translator, sentences):
    ids, specials = translator.vocabulary.to_ids(sentences[:8]), translator.vocabulary.specials
    width = max(map(len, ids)) + 1
    src = torch.tensor([i + [specials.eos] + [specials.pad] * (width - len(i) - 1) for i in ids])  # (B, S)
    state = translator.model.start_state(src)
    symbols = Symbols(specials.bos, specials.eos, tuple(translator.vocabulary.never_generated))
    greedy = greedy_reference(translator.model.step, state, [len(i) + 11 for i in ids], symbols)
    beam_one = translator.search(sentences[:8], DecodeConfig(beam_size=1, max_len_b=10))
    assert [h[0].tokens for h in beam_one] == greedy


def test_nbest_lists_are_sorted_and_formatted(translator, sentences):
    results = translator.search(sentences[:3], DecodeConfig(beam_size=4, max_len_b=8))
    lines = format_output(translator, results, nbest=3)
    assert len(lines) == 9
    for index in range(3):
        rows = [line.split("\t") for line in lines[3 * index : 3 * index + 3]]
        assert all(row[0] == str(index) for row in rows)
        scores = [float(row[1]) for row in rows]
        assert scores == sorted(scores, reverse=True)
    assert format_output(translator, results, nbest=1) == translator.translate(sentences[:3], DecodeConfig(beam_size=4, max_len_b=8))


def test_sampling_is_seeded_and_top_k_one_is_greedy(translator, sentences):
    first = translator.search(sentences[:6], DecodeConfig(sampling=True, seed=3, max_len_b=8))
    again = translator.search(sentences[:6], DecodeConfig(sampling=True, seed=3, max_len_b=8))
    other = translator.search(sentences[:6], DecodeConfig(sampling=True, seed=4, temperature=2.0, max_len_b=8))
    assert [h[0].tokens for h in first] == [h[0].tokens for h in again]
    assert [h[0].tokens for h in first] != [h[0].tokens for h in other]
    top1 = translator.search(sentences[:6], DecodeConfig(sampling=True, top_k=1, max_len_b=8))
    greedy = translator.search(sentences[:6], DecodeConfig(beam_size=1, max_len_b=8))
    assert [h[0].tokens for h in top1] == [h[0].tokens for h in greedy]
    nucleus = translator.search(sentences[:6], DecodeConfig(sampling=True, top_p=1e-6, max_len_b=8))  # only the top token
    assert [h[0].tokens for h in nucleus] == [h[0].tokens for h in greedy]


def test_stdin_streams_to_stdout(trained_run):
    result = run_cli("decode", *trained_run, "decode.input=-", "decode.max_len_b=5", input="A dog.\nTwo men are talking.\n",
                     timeout=300)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 2  # translations only: logs go to stderr


def test_bad_decode_options_are_one_line(trained_run):
    one_line_error(run_cli("decode", *trained_run, "decode.nbest=9"), "decode.nbest (9)")


# Lines a user's file may hold: empty, whitespace only, CR LF ends, and one far longer than
# anything in training.
AWKWARD = ["A dog runs.", "", "   ", "\t", "Two men are talking.", " ".join(["dog"] * 3000), "A cat."]


def test_every_input_line_gets_one_output_line(trained_run, tmp_path):
    """In order, exit 0; an empty (or whitespace-only) line gives an empty line; a line over
    decode.max_source_length tokens is cut to it with one warning naming it."""
    source = tmp_path / "awkward.en"
    source.write_bytes("\r\n".join(AWKWARD).encode("utf-8") + b"\r\n")
    output = tmp_path / "awkward.de"
    result = run_cli("decode", *trained_run, f"decode.input={source}", f"decode.output={output}", "decode.max_len_b=5",
                     "decode.max_source_length=100")
    assert result.returncode == 0, result.stderr
    lines = output.read_bytes().decode("utf-8").split("\n")
    assert lines[-1] == "" and len(lines) - 1 == len(AWKWARD)  # one line each, each ending in \n
    assert lines[1:4] == ["", "", ""] and all(lines[i] for i in (0, 4, 5, 6))
    warnings = [line for line in result.stderr.splitlines() if "max_source_length" in line]
    assert len(warnings) == 1 and "line 6:" in warnings[0] and "cut to it" in warnings[0]
    # Alone, each line gives what it gives in the file: cutting and batching change nothing else.
    alone = run_cli("decode", *trained_run, f"decode.input={source}", f"decode.output={tmp_path / 'again.de'}",
                    "decode.max_len_b=5", "decode.max_source_length=100", "decode.tokens_per_batch=1")
    assert alone.returncode == 0 and (tmp_path / "again.de").read_bytes() == output.read_bytes()


def test_stdin_gets_a_line_for_every_line(trained_run):
    text = "\r\n".join(AWKWARD[:5]) + "\r\nA lone \r inside a line.\n"
    result = run_cli("decode", *trained_run, "decode.input=-", "decode.max_len_b=5", input=text.encode("utf-8"),
                     timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.decode("utf-8").split("\n")
    assert len(lines) - 1 == 6 and lines[1:4] == ["", "", ""]


def test_the_source_cap_is_the_translators_own(translator):
    """Cut to the cap, a long sentence translates as its first max_source_length tokens do."""
    long_sentence = " ".join(["A dog runs across the grass."] * 200)
    encoded = translator.vocabulary.to_ids([long_sentence])[0]
    assert len(encoded) > 300
    cut = translator.vocabulary.to_text([encoded[:300]])[0]
    ours = translator.search([long_sentence], DecodeConfig(beam_size=2, max_len_b=5, max_source_length=300))
    assert ours[0][0].tokens == translator.search([cut], DecodeConfig(beam_size=2, max_len_b=5))[0][0].tokens


def test_bf16_decoding_runs_the_products_in_bf16_and_stays_near_fp32(translator, sentences):
    """decode.precision=bf16: the model's products run in bf16 (seen by a hook) and each step's
    log-probabilities stay within 0.1 of fp32's. (Whole outputs are not compared: this barely
    trained model's flat distributions flip greedy choices at bf16's rounding.)"""
    from translate.core.choices import Precision

    dtypes = []
    hook = translator.model.decoder_layers[0].feed_forward.w_1.register_forward_hook(lambda m, a, out: dtypes.append(out.dtype))
    try:
        bf16 = translator.translate(sentences, DecodeConfig(beam_size=1, precision=Precision.bf16))
    finally:
        hook.remove()
    fp32 = translator.translate(sentences, DecodeConfig(beam_size=1))
    assert dtypes and set(dtypes) == {torch.bfloat16}
    assert len(bf16) == len(fp32) and all(isinstance(text, str) for text in bf16)
    src = translator._sources(translator.encode_sources(sentences[:8], 1024), np.arange(8))
    with torch.inference_mode():
        reference = translator.model.step(torch.full((8,), 1), translator.model.start_state(src))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = translator.model.step(torch.full((8,), 1), translator.model.start_state(src))
    assert got.dtype == torch.float32 and (got - reference).abs().max() < 0.1


def test_fp16_decoding_is_refused():
    from translate.core.choices import Precision

    with pytest.raises(ValueError, match="decode.precision=fp16"):
        DecodeConfig(precision=Precision.fp16)
