"""The scoring report: sacreBLEU, chrF and tokenized BLEU equal sacrebleu's own; compound
splitting is perl's; the newstest2014 variant is named; the paired bootstrap test is
sacrebleu's; mismatched or missing files fail clearly."""

import json
import shutil

import pytest
import sacrebleu
from sacrebleu.metrics import BLEU, CHRF

from tests.conftest import TEXT, need, one_line_error, run, run_cli
from translate.core.errors import TranslateError
from translate.metrics import corpus_bleu, corpus_chrf, split_compounds, tokenized_bleu
from translate.verbs.bleu import variant

PERL_SPLIT = r"s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g"
AT = " ##AT##-##AT## "


def drop_words(lines, every):
    """A real, imperfect "system": drop every `every`-th word."""
    return [" ".join(w for i, w in enumerate(line.split()) if i % every != every - 1) for line in lines]


def write(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_bleu_equals_sacrebleu_on_real_text():
    need(TEXT)
    refs = (TEXT / "newstest2013.de").read_text(encoding="utf-8").splitlines()[:300]
    hyps = drop_words(refs, 5)
    score, signature = corpus_bleu(hyps, refs)
    expected = sacrebleu.corpus_bleu(hyps, [refs])
    assert score.score == pytest.approx(expected.score, abs=1e-9)
    assert 20 < score.score < 90
    assert "tok:13a" in str(signature)


def test_chrf_equals_sacrebleu_chrf():
    need(TEXT)
    refs = (TEXT / "newstest2013.de").read_text(encoding="utf-8").splitlines()[:300]
    hyps = drop_words(refs, 4)
    score, signature = corpus_chrf(hyps, refs)
    assert score.score == pytest.approx(CHRF().corpus_score(hyps, [refs]).score, abs=1e-9)
    assert 20 < score.score < 95
    assert "nc:6" in str(signature) and "nw:0" in str(signature)


@pytest.mark.parametrize(
    "line, perl_output",
    [
        # "t-W" matches; the search resumes after "W" and still finds "t-B" in "West-B".
        ("Ost-West-Beziehungen", f"Ost{AT}West{AT}Beziehungen"),
        ("a - b", "a - b"),
        ("E-Mail", f"E{AT}Mail"),
        ("2-3", f"2{AT}3"),
        # Overlap: "a-b" consumes "b", so "-c" has no \S before its hyphen left to match.
        ("a-b-c", f"a{AT}b-c"),
        ("x--y", f"x{AT}-y"),
        ("-a-", "-a-"),
        # perl reads bytes: the match ends in the first byte of "ä" and the next starts in its
        # second, so non-ASCII single letters split twice where "a-b-c" splits once.
        ("ü-ä-ö", f"ü{AT}ä{AT}ö"),
        # a non-breaking space is \S for perl's bytes (0xC2 0xA0), unlike Python's str \S.
        ("ab-\u00a0-c", f"ab{AT}\u00a0{AT}c"),
    ],
)
def test_split_compounds_like_perl(line, perl_output):
    assert split_compounds(line) == perl_output


def test_split_compounds_equals_perl_on_real_text(tmp_path):
    need(TEXT)
    if shutil.which("perl") is None:
        pytest.skip("perl not installed")
    data = (TEXT / "newstest2014-full.en-de.de").read_bytes()
    perl = run(["perl", "-ple", PERL_SPLIT], input=data, check=True).stdout
    lines = data.decode("utf-8").split("\n")
    ours = "\n".join(split_compounds(line) for line in lines).encode("utf-8")
    assert perl.count(b"##AT##") > 1000
    assert ours == perl


def test_tokenized_bleu_equals_multibleu_on_hand_tokenized_text():
    refs = ["the cat sat on the mat .", "a dog is in the garden , he said .", "we will see them tomorrow ."]
    hyps = ["the cat sat on a mat .", "a dog is in the garden , she said .", "we will see them today ."]
    multibleu = BLEU(tokenize="none", smooth_method="none", force=True)
    score, signature = tokenized_bleu(hyps, refs, "en")
    assert score.score == pytest.approx(multibleu.corpus_score(hyps, [refs]).score, abs=1e-9)
    assert 0 < score.score < 100 and "tok:none" in str(signature)
    # German: compounds split on both sides before counting n-grams.
    refs = ["die Ost-West-Beziehungen sind gut .", "er schrieb eine E-Mail an sie .", "das kostet 2-3 Euro ."]
    hyps = ["die Ost-Beziehungen sind gut .", "er schrieb eine E-Mail an ihn .", "das kostet 2-4 Euro ."]
    split_refs = [f"die Ost{AT}West{AT}Beziehungen sind gut .", f"er schrieb eine E{AT}Mail an sie .",
                  f"das kostet 2{AT}3 Euro ."]
    split_hyps = [f"die Ost{AT}Beziehungen sind gut .", f"er schrieb eine E{AT}Mail an ihn .",
                  f"das kostet 2{AT}4 Euro ."]
    expected = multibleu.corpus_score(split_hyps, [split_refs]).score
    assert tokenized_bleu(hyps, refs, "de")[0].score == pytest.approx(expected, abs=1e-9)
    assert expected != pytest.approx(multibleu.corpus_score(hyps, [refs]).score, abs=1e-3)


def test_tokenized_bleu_differs_from_sacrebleu_on_real_german():
    need(TEXT)
    refs = (TEXT / "newstest2013.de").read_text(encoding="utf-8").splitlines()[:300]
    hyps = drop_words(refs, 5)
    tokenized = tokenized_bleu(hyps, refs, "de")[0]
    sacre = corpus_bleu(hyps, refs)[0]
    assert 20 < tokenized.score < 90
    assert abs(tokenized.score - sacre.score) > 0.05
    assert tokenized.ref_len > sacre.ref_len  # "##AT##-##AT##" adds tokens that 13a does not


def test_variant_labels():
    need(TEXT)
    full = (TEXT / "newstest2014-full.en-de.de").read_text(encoding="utf-8").splitlines()
    filtered = (TEXT / "newstest2014-filtered.en-de.de").read_text(encoding="utf-8").splitlines()
    assert variant(len(full)) == "newstest2014 full (3,003 lines, sacreBLEU wmt14/full)"
    assert variant(len(filtered)) == "newstest2014 filtered (2,737 lines, sacreBLEU wmt14)"
    assert variant(3000) == "3,000 lines"


def test_labels_compare_only_on_newstest2014():
    from translate.verbs.bleu import labels

    assert "comparable to the paper's 27.3/28.4" in labels("en", "de", 3003)["tokenized_bleu"]
    assert "comparable to the paper's 27.3/28.4" in labels("en", "de", 2737)["tokenized_bleu"]
    multi30k = labels("en", "de", 1000)
    assert "not comparable" in multi30k["tokenized_bleu"] and "not comparable" in multi30k["sacrebleu"]


def test_bleu_verb_on_files(tmp_path):
    need(TEXT)
    refs = (TEXT / "newstest2013.en").read_text(encoding="utf-8").splitlines()[:100]
    hyps = [r.lower() for r in refs]
    write(tmp_path / "hyp", hyps)
    write(tmp_path / "ref", refs)
    result = run_cli("bleu", f"bleu.hyp={tmp_path}/hyp", f"bleu.ref={tmp_path}/ref", f"run_dir={tmp_path}",
                     "data.src_lang=de", "data.tgt_lang=en")
    assert result.returncode == 0, result.stderr
    expected = sacrebleu.corpus_bleu(hyps, [refs])
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"sacreBLEU {expected.score:.2f} ({tmp_path}/hyp, 100 lines)  {expected}  signature: ")
    assert any(line.startswith("chrF ") for line in lines)
    assert any(line.startswith("tokenized BLEU ") for line in lines)
    assert "no compound splitting" in result.stdout and "test set: 100 lines" in result.stdout


def test_json_report_with_bootstrap(tmp_path):
    need(TEXT)
    ref = TEXT / "newstest2014-full.en-de.de"
    refs = ref.read_text(encoding="utf-8").splitlines()
    hyp = write(tmp_path / "hyp", [r.lower() for r in refs])
    worse = write(tmp_path / "worse", drop_words(refs, 3))
    result = run_cli("bleu", f"bleu.hyp={hyp}", f"bleu.ref={ref}", f"bleu.baseline={worse}",
                     "bleu.bootstrap_samples=200", "bleu.format=json", f"run_dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)  # exactly one JSON object, nothing else on stdout
    assert report["lines"] == 3003 and report["variant"].startswith("newstest2014 full (3,003 lines")
    assert report["paths"] == {"hyp": str(hyp), "ref": str(ref), "baseline": str(worse)}
    for key in ("sacrebleu", "chrf", "tokenized_bleu"):
        assert set(report["scores"][key]) >= {"value", "signature", "label"}
    assert report["scores"]["sacrebleu"]["value"] == pytest.approx(
        sacrebleu.corpus_bleu([r.lower() for r in refs], [refs]).score, abs=1e-9)
    assert "compound-split" in report["scores"]["tokenized_bleu"]["label"]
    assert "27.3/28.4" in report["scores"]["tokenized_bleu"]["label"]
    assert "28.6" in report["scores"]["sacrebleu"]["label"]
    test = report["significance"]
    assert test["hyp"]["bleu"] > test["baseline"]["bleu"] + 5
    assert test["p_value"] == pytest.approx(1 / 201) and test["significant"] is True
    assert test["samples"] == 200 and "bs:200" in test["signature"]
    assert test["hyp"]["ci95"] > 0 and test["baseline"]["ci95"] > 0


def test_bootstrap_of_close_and_identical_systems():
    need(TEXT)
    from translate.metrics import paired_bootstrap

    refs = (TEXT / "newstest2013.de").read_text(encoding="utf-8").splitlines()[:500]
    five, four = drop_words(refs, 5), drop_words(refs, 4)
    a = [x if i % 2 else y for i, (x, y) in enumerate(zip(five, four))]
    b = [y if i % 2 else x for i, (x, y) in enumerate(zip(five, four))]
    close = paired_bootstrap(a, b, refs, 200)
    assert close["p_value"] > 0.05 and close["significant"] is False
    same = paired_bootstrap(a, a, refs, 200)  # sacreBLEU's p is 1/201 here: still no difference
    assert same["significant"] is False


def test_mismatched_line_counts(tmp_path):
    (tmp_path / "hyp").write_text("a\nb\n")
    (tmp_path / "ref").write_text("a\n")
    result = run_cli("bleu", f"bleu.hyp={tmp_path}/hyp", f"bleu.ref={tmp_path}/ref", f"run_dir={tmp_path}")
    one_line_error(result, "2 lines but", f"{tmp_path}/hyp", f"{tmp_path}/ref has 1")
    with pytest.raises(TranslateError):
        corpus_bleu(["a", "b"], ["a"])


def test_mismatched_baseline_and_bad_format(tmp_path):
    (tmp_path / "hyp").write_text("a b\n")
    (tmp_path / "ref").write_text("a b\n")
    (tmp_path / "base").write_text("a\nb\nc\n")
    common = [f"bleu.hyp={tmp_path}/hyp", f"bleu.ref={tmp_path}/ref", f"run_dir={tmp_path}"]
    result = run_cli("bleu", *common, f"bleu.baseline={tmp_path}/base")
    one_line_error(result, f"{tmp_path}/base has 3 lines but")
    assert result.stdout == ""
    one_line_error(run_cli("bleu", *common, f"bleu.baseline={tmp_path}/missing"), "missing")
    one_line_error(run_cli("bleu", *common, "bleu.format=xml"), "bleu.format")


@pytest.mark.parametrize("line, moses", [
    # The lines of newstest2014 where sacremoses kept a final period that tokenizer.perl splits.
    ("Bitte kommen Sie zu Gate 24.", "Bitte kommen Sie zu Gate 24 ."),
    ("Thomson Reuters I/B/E/S.", "Thomson Reuters I / B / E / S ."),
    ("Jocelyn Johnson, told FoxNews.com.", "Jocelyn Johnson , told FoxNews.com ."),
    ("Games will start at 1:30 p.m.", "Games will start at 1 : 30 p.m ."),
    ("Apples, pears, etc.", "Apples , pears , etc ."),
    # Unchanged: a prefix inside the line, a plain final period, dots alone.
    ("He said etc. and left.", "He said etc. and left ."),
    ("A dog runs.", "A dog runs ."),
    ("Wait...", "Wait ..."),
])
def test_the_last_word_is_split_as_tokenizer_perl_does(line, moses):
    from translate.metrics import moses_tokenize

    assert moses_tokenize([line], "en") == [moses]


def test_only_final_periods_differ_from_sacremoses_on_newstest2014():
    """The rule changes exactly the lines where sacremoses and tokenizer.perl disagreed on the
    whole of newstest2014 (8 German, 15 English, 6 French), each by its final period alone."""
    from sacremoses import MosesTokenizer

    from translate.metrics import moses_tokenize

    for name, lang, expected in (("en-de.de", "de", 8), ("en-de.en", "en", 15), ("en-fr.fr", "fr", 6)):
        lines = (need(TEXT / f"newstest2014-full.{name}")).read_text(encoding="utf-8").splitlines()
        plain = [MosesTokenizer(lang=lang).tokenize(line, escape=True, return_str=True) for line in lines]
        ours = moses_tokenize(lines, lang)
        changed = [(a, b) for a, b in zip(plain, ours) if a != b]
        assert len(changed) == expected, name
        assert all(b == a[:-1] + " ." for a, b in changed)


def test_the_report_names_the_tokenized_bleu_of_the_data_sets_literature(tmp_path):
    """Multi30k's papers report lowercased tokenized BLEU, WMT14's the compound-split one: the
    report carries both, and says which this data set's literature uses."""
    from translate.core.choices import LiteratureBleu
    from translate.metrics import lowercased_tokenized_bleu
    from translate.verbs.bleu import labels

    multi30k = labels("en", "de", 1000, LiteratureBleu.lowercased)
    assert "the Multi30k literature's" in multi30k["lowercased_tokenized_bleu"]
    assert "not this data's" in multi30k["tokenized_bleu"]
    assert "not this data's" in labels("en", "de", 3003)["lowercased_tokenized_bleu"]
    refs = ["Ein Hund läuft über die Wiese.", "Zwei Kinder spielen im Sand."]
    write(tmp_path / "hyp", ["ein hund läuft über die wiese .", "Zwei Kinder spielen am Strand."])
    write(tmp_path / "ref", refs)
    out = run_cli("bleu", "data=multi30k_en_de", f"bleu.hyp={tmp_path / 'hyp'}", f"bleu.ref={tmp_path / 'ref'}",
                  f"run_dir={tmp_path}", "bleu.format=json", check=True)
    report = json.loads(out.stdout)
    assert report["literature"] == "lowercased_tokenized_bleu"
    expected = lowercased_tokenized_bleu(["ein hund läuft über die wiese .", "Zwei Kinder spielen am Strand."], refs, "de")
    assert report["scores"]["lowercased_tokenized_bleu"]["value"] == pytest.approx(expected[0].score)
    text = run_cli("bleu", "data=multi30k_en_de", f"bleu.hyp={tmp_path / 'hyp'}", f"bleu.ref={tmp_path / 'ref'}",
                   f"run_dir={tmp_path}", check=True).stdout
    assert "lowercased tokenized BLEU" in text and text.splitlines()[0].startswith("sacreBLEU")
    assert "references are lowercased" not in text
    write(tmp_path / "ref", [r.lower() for r in refs])  # as decode writes them for a model of lowercased text
    text = run_cli("bleu", "data=multi30k_en_de", f"bleu.hyp={tmp_path / 'hyp'}", f"bleu.ref={tmp_path / 'ref'}",
                   f"run_dir={tmp_path}", check=True).stdout
    assert "sacreBLEU (13a, mixed case, but these references are lowercased" in text.splitlines()[1]
