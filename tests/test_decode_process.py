"""`translate decode` as a whole process: what it imports, and its start-up's one composition."""

import sys
from pathlib import Path
from typing import List, Optional

from tests.conftest import hook_env, run, run_dir_of

# What translating a text file has no use for, each a second or a few hundred MiB of a process
# that a user may start for every file: the compiler stack, the data sets' loader and its Arrow
# tables (a split's input needs them, a file's does not), the other formats' libraries, the
# figures' and training's, the scorer's, and the cluster launcher's.
UNUSED_BY_DECODE = ("torch._dynamo", "torch._inductor", "datasets", "pyarrow", "transformers", "tensorboard",
                    "torch.utils.tensorboard", "matplotlib", "sacrebleu", "ctranslate2", "submitit")


def imported(stderr: str) -> List[str]:
    """The modules `python -X importtime` reported importing ("import time: self | cumulative |
    name" lines, the header aside)."""
    lines = [line.split("|") for line in stderr.splitlines() if line.startswith("import time:")]
    return [fields[2].strip() for fields in lines[1:] if len(fields) == 3]


def unused_imports(trained_run: List[str], folder: Path, env: Optional[dict] = None) -> List[str]:
    """The modules of UNUSED_BY_DECODE (or inside them) that a decode of a two-line text file imported."""
    source = folder / "input.en"
    source.write_text("A dog runs.\nTwo men are talking.\n", encoding="utf-8")
    result = run([sys.executable, "-X", "importtime", "-m", "translate", "decode", *trained_run, f"decode.input={source}",
                  f"decode.output={folder / 'output.de'}", "decode.max_len_b=5"], env=env, check=True, timeout=300)
    assert len((folder / "output.de").read_text(encoding="utf-8").splitlines()) == 2
    return sorted({name for name in imported(result.stderr)
                   if any(name == unused or name.startswith(unused + ".") for unused in UNUSED_BY_DECODE)})


def test_decoding_a_text_file_imports_nothing_it_does_not_use(trained_run, tmp_path):
    assert unused_imports(trained_run, tmp_path) == []


def test_the_import_check_finds_a_module_that_comes_back(trained_run, tmp_path):
    """The check above can fail: a process that imports datasets (here at start-up) is caught."""
    found = unused_imports(trained_run, tmp_path, env=hook_env(tmp_path, "import datasets\n"))
    assert "datasets" in found and "pyarrow" in found


def test_a_plain_run_composes_the_configuration_once(trained_run, tmp_path):
    """check_overrides, then hydra.main (the mode, then the run) composed it three times."""
    source = tmp_path / "input.en"
    source.write_text("A dog runs.\n", encoding="utf-8")
    counting = (
        "import hydra._internal.config_loader_impl as impl, atexit, sys\n"
        "calls = []\n"
        "original = impl.ConfigLoaderImpl.load_configuration\n"
        "def counted(self, *args, **kwargs):\n"
        "    calls.append(1)\n"
        "    return original(self, *args, **kwargs)\n"
        "impl.ConfigLoaderImpl.load_configuration = counted\n"
        "atexit.register(lambda: sys.stderr.write(f'compositions: {len(calls)}\\n'))\n"
    )
    result = run([sys.executable, "-m", "translate", "decode", *trained_run, f"decode.input={source}",
                  f"decode.output={tmp_path / 'output.de'}", "decode.max_len_b=5"], env=hook_env(tmp_path, counting),
                 check=True, timeout=300)
    assert "compositions: 1\n" in result.stderr, result.stderr[-2000:]
    assert (run_dir_of(trained_run) / "hydra" / "decode" / ".hydra" / "hydra.yaml").is_file()  # Hydra's files, as before


def test_another_hydra_runs_through_hydra_main(monkeypatch):
    """run_single calls Hydra 1.3's internal run path; with another Hydra a plain run goes through
    hydra.main (three compositions, the same job) rather than break."""
    import hydra

    from translate.hydra_cli import single_run

    assert single_run(["config=tiny"]) and not single_run(["-m", "config=tiny"])
    monkeypatch.setattr(hydra, "__version__", "1.4.0")
    assert not single_run(["config=tiny"])
