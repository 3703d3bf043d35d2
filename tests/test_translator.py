"""The Translator's engine choices (translate/translator.py): which products decoding runs on,
by what the CPU supports, and a start-up that checks a checkpoint's weights without torch's
compiler; a model trained on lowercased text lowercases its sources."""

import platform
import subprocess
import sys

import pytest
import torch

from tests.conftest import run_cli, run_dir_of
from translate import averaging, checkpoint, translator
from translate.data.loading import load_corpus
from translate.hydra_cli import load_config
from translate.translator import Translator


@pytest.mark.parametrize("machine, capability, expected", [
    ("x86_64", "AVX512", (True, True)),
    ("x86_64", "AVX2", (True, False)),
    ("x86_64", "DEFAULT", (False, False)),
    ("aarch64", "DEFAULT", (False, False)),
])
def test_decoding_products_follow_the_instructions_torch_dispatches_to(monkeypatch, machine, capability, expected):
    """oneDNN's prepacked products: the output projection on x86 CPUs with AVX2 or AVX-512, the
    layers' with AVX-512 (where they measured faster); never chosen by vendor, and none where
    torch lacks oneDNN."""
    monkeypatch.setattr(platform, "machine", lambda: machine)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    translator.decoding_products.cache_clear()
    try:
        assert translator.decoding_products() == expected
        monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
        translator.decoding_products.cache_clear()
        assert translator.decoding_products() == (False, False)
    finally:
        translator.decoding_products.cache_clear()


def test_a_checkpoint_loads_and_translates_without_torchs_compiler(trained_run):
    """Translator.from_checkpoint checks the weights by loading them (strictly), and nothing on
    the way imports torch._dynamo (about a second of every decode's start-up): neither loading
    nor Checkpoint.check_weights, which names a bad weight (tests/test_faults.py: each damage
    named, through decode and export) and checks every resume and average."""
    path = run_dir_of(trained_run) / "checkpoint_last.pt"
    code = (
        "import sys; from pathlib import Path; from translate.translator import Translator\n"
        f"t = Translator.from_checkpoint(Path({str(path)!r}))\n"
        "from translate.checkpoint import Checkpoint\n"
        "Checkpoint(t.model.state_dict(), {}, b'', 0, path=Path('x')).check_weights(t.model.cfg)\n"
        "print(t.translate(['A man is walking.'])[0]); print('torch._dynamo' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    text, compiler = result.stdout.strip().splitlines()[-2:]
    assert text and compiler == "False"


def test_a_model_trained_on_lowercased_text_lowercases_what_it_translates(trained_run, tmp_path):
    """A checkpoint records data.lowercase (Checkpoint.lowercase); its Translator then lowercases
    every source before encoding it, and decode and tune score it against lowercased references,
    so they need no setting to match the training text. Averaging keeps the record."""
    path = run_dir_of(trained_run) / "checkpoint_last.pt"
    payload = checkpoint.load(path)
    assert payload.get("lowercase") is False
    cased = Translator.from_checkpoint(path)
    lowered = tmp_path / "lowercased.pt"
    checkpoint.save(lowered, {**payload, "lowercase": True})
    lowering = Translator.from_checkpoint(lowered)
    sentence = "A MAN Is Walking."
    assert lowering.encode_sources([sentence], 100) == cased.encode_sources([sentence.lower()], 100)
    assert cased.encode_sources([sentence], 100) != cased.encode_sources([sentence.lower()], 100)
    assert averaging.average([lowered, lowered]).lowercase is True
    assert lowering.references(["Ein Hund LÄUFT"]) == ["ein hund läuft"] and cased.references(["Ein Hund"]) == ["Ein Hund"]
    # decode scores such a model against lowercased references, though data.lowercase is unset here
    output = tmp_path / "out.de"
    run_cli("decode", *trained_run, f"decode.checkpoint={lowered}", f"decode.output={output}", "decode.beam_size=1",
            "decode.max_len_b=3", check=True)
    references = (tmp_path / "out.de.ref").read_text(encoding="utf-8").splitlines()
    assert len(references) == 1000 and references == [line.lower() for line in references]
    assert any(line != line.lower() for line in load_corpus(load_config("decode", trained_run).data, "test").pairs()[1])
