#!/usr/bin/env python
"""Decoding as users run it, paired: a whole `translate decode` process against a whole Python
process that loads the CTranslate2 export and translates the same file, start-up included.

One warm-up pair, then --pairs pairs, the two sides alternating which goes first. Each process
is measured from outside: wall seconds, CPU seconds and peak resident memory (getrusage of the
child, through os.wait4 in a small launcher), then sentences/s and target tokens/s (output pieces + EOS a
sentence, counted with the export's sentencepiece model). One JSON line per measurement, then
one per side with medians and ranges (min-max), then ours over CTranslate2.

Both sides translate with beam --beam, length penalty --alpha and an output cap of --cap tokens
(EOS aside), on --threads threads. The length penalties are not the same formula: ours is
GNMT's ((5 + length) / 6) ** alpha, CTranslate2's length ** alpha; they are equal only at
--alpha 0 (no penalty), which the summary line says (length_penalty).
To compare CPU kinds on one machine, force both sides down, e.g. to AVX2:
ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 CT2_FORCE_CPU_ISA=AVX2.

    make demo    # trains runs/tiny-multi30k_en_de first
    .venv/bin/python scripts/bench_decode_process.py --override config=tiny \\
        --splits validation test test_2017_flickr test_2017_mscoco test_2018_flickr    # E1's 4,546 sentences
    .venv/bin/python scripts/bench_decode_process.py --override config=tiny --limit 1    # start-up
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Sequence

ROOT = Path(__file__).resolve().parents[1]

GNMT, POWER = "((5 + length) / 6) ** alpha", "length ** alpha"  # ours (search.length_penalty), CTranslate2's

# CTranslate2 as its users run it: a Python process of its own, its export loaded, the file
# read, encoded with the export's sentencepiece model, translated and written.
CT2_CHILD = """
import json, sys, ctranslate2, sentencepiece as spm
folder, source, output, beam, alpha, cap, threads, batch, banned = sys.argv[1:10]
processor = spm.SentencePieceProcessor(model_file=folder + "/sentencepiece.model")
translator = ctranslate2.Translator(folder, device="cpu", intra_threads=int(threads))
lines = open(source, encoding="utf-8").read().split("\\n")[:-1]
pieces = [[processor.id_to_piece(i) for i in ids] for ids in processor.encode(lines)]
kept = [i for i, p in enumerate(pieces) if p]  # an empty source gives an empty line, as ours does
results = translator.translate_batch([pieces[i] for i in kept], beam_size=int(beam), length_penalty=float(alpha),
                                     max_batch_size=int(batch), max_input_length=0, max_decoding_length=int(cap),
                                     min_decoding_length=0, disable_unk=True, suppress_sequences=json.loads(banned))
texts = [""] * len(lines)
for i, result in zip(kept, results):
    texts[i] = processor.decode_pieces(result.hypotheses[0])
open(output, "w", encoding="utf-8").write("".join(t + "\\n" for t in texts))
"""


def emit(**record) -> None:
    print(json.dumps(record), flush=True)


# Each measured process is started by this small one, not by the benchmark: on Linux a process's
# peak memory counts from its parent's size at the fork (exec keeps it), and the benchmark has
# imported torch. Prints the child's wall seconds, CPU seconds and peak KiB, as JSON.
LAUNCHER = """
import json, os, sys, time
started = time.perf_counter()
pid = os.fork()
if pid == 0:
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    os.dup2(os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
    os.execv(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
print(json.dumps(dict(code=os.waitstatus_to_exitcode(status), wall_s=time.perf_counter() - started,
                      cpu_s=usage.ru_utime + usage.ru_stime, peak_kib=usage.ru_maxrss)))
"""


def measured(command: Sequence[str], env: Dict[str, str], log: Path) -> dict:
    """Run a process to its end: its wall seconds, CPU seconds and peak resident MiB."""
    launched = subprocess.run([sys.executable, "-c", LAUNCHER, str(log), *command], cwd=ROOT, env=env,
                              capture_output=True, text=True, check=True)
    found = json.loads(launched.stdout)
    if found["code"] != 0:
        raise SystemExit(f"{' '.join(command[:4])} ... failed ({found['code']}):\n{log.read_text(errors='replace')[-3000:]}")
    return dict(wall_s=round(found["wall_s"], 3), cpu_s=round(found["cpu_s"], 3),
                peak_mib=round(found["peak_kib"] / 1024, 1))  # Linux: KiB


def sources_of(args) -> List[str]:
    """The sentences: --input's lines, else the --splits of the configured data."""
    if args.input:
        lines = Path(args.input).read_text(encoding="utf-8").split("\n")[:-1]
    else:
        from translate.data.loading import load_corpus
        from translate.hydra_cli import load_config

        data = load_config("decode", args.override).data
        lines = [line for split in args.splits for line in load_corpus(data, split).pairs()[0]]
    return lines[: args.limit] if args.limit else lines


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--override", nargs="*", default=["config=tiny"],
                        help="the run's overrides, as given to translate decode (run_dir=..., config=...)")
    parser.add_argument("--splits", nargs="+", default=["test"], help="dataset splits, translated as one file")
    parser.add_argument("--input", help="a text file to translate instead of --splits")
    parser.add_argument("--limit", type=int, default=0, help="first N sentences only (0: all; 1: start-up)")
    parser.add_argument("--pairs", type=int, default=3, help="measured pairs, after one warm-up pair")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=0.6, help="length penalty, both sides (0: the same formula)")
    parser.add_argument("--cap", type=int, default=80, help="output tokens allowed a sentence, EOS aside, both sides")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--ct2-batch", type=int, default=256, help="CTranslate2's max_batch_size")
    return parser.parse_args()


def summary(side: str, records: List[dict]) -> dict:
    line = dict(measurement=f"decode_process_{side}_summary", pairs=len(records))
    for key in ("wall_s", "cpu_s", "peak_mib", "sentences_per_s", "target_tokens_per_s"):
        values = [r[key] for r in records]
        line[key] = dict(median=round(statistics.median(values), 3), min=min(values), max=max(values))
    return line


def main() -> None:
    args = arguments()
    from translate.formats.ctranslate2 import exported_vocabulary

    sources = sources_of(args)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    with tempfile.TemporaryDirectory() as work:
        folder, source = Path(work), Path(work) / "input.txt"
        source.write_text("".join(line + "\n" for line in sources), encoding="utf-8")
        subprocess.run([sys.executable, "-m", "translate", "export", *args.override, f"export.output={folder / 'ct2'}"],
                       cwd=ROOT, check=True, capture_output=True)
        vocabulary = exported_vocabulary(folder / "ct2")
        names = vocabulary.piece_names()
        banned = [[names[i]] for i in vocabulary.never_generated if i != vocabulary.specials.unk]  # unk: disable_unk
        commands = {
            "ours": [sys.executable, "-m", "translate", "decode", *args.override, f"decode.input={source}",
                     f"decode.output={folder / 'ours.txt'}", f"decode.beam_size={args.beam}",
                     f"decode.length_penalty={args.alpha}", "decode.max_len_a=0", f"decode.max_len_b={args.cap}",
                     f"run_dir={folder / 'run'}" if not any(o.startswith("run_dir=") for o in args.override) else "decode.nbest=1"],
            "ctranslate2": [sys.executable, "-c", CT2_CHILD, str(folder / "ct2"), str(source), str(folder / "ctranslate2.txt"),
                            str(args.beam), str(args.alpha), str(args.cap), str(args.threads), str(args.ct2_batch),
                            json.dumps(banned)],
        }
        measured_pairs: Dict[str, List[dict]] = {"ours": [], "ctranslate2": []}
        for pair in range(args.pairs + 1):  # pair 0: the warm-up, not counted
            for side in (["ours", "ctranslate2"] if pair % 2 else ["ctranslate2", "ours"]):
                record = measured(commands[side], env, folder / f"{side}.log")
                lines = (folder / f"{side}.txt").read_text(encoding="utf-8").split("\n")[:-1]
                tokens = sum(len(ids) + 1 for ids in vocabulary.to_ids(lines))
                record = dict(measurement=f"decode_process_{side}", pair=pair, warm_up=pair == 0, sentences=len(lines),
                              **record, sentences_per_s=round(len(lines) / record["wall_s"], 2),
                              target_tokens_per_s=round(tokens / record["wall_s"], 1), threads=args.threads)
                emit(**record)
                if pair:
                    measured_pairs[side].append(record)
    lines = {side: summary(side, records) for side, records in measured_pairs.items()}
    for line in lines.values():
        emit(**line)
    ours, theirs = lines["ours"], lines["ctranslate2"]
    emit(measurement="decode_process_ours_over_ctranslate2", sentences=len(sources), beam=args.beam, cap=args.cap,
         speed=round(theirs["wall_s"]["median"] / ours["wall_s"]["median"], 3),
         pair_speeds=[round(t["wall_s"] / o["wall_s"], 3) for o, t in zip(measured_pairs["ours"], measured_pairs["ctranslate2"])],
         memory=round(ours["peak_mib"]["median"] / theirs["peak_mib"]["median"], 2),
         length_penalty=dict(alpha=args.alpha, ours=GNMT, ctranslate2=POWER, same_formula=args.alpha == 0))


if __name__ == "__main__":
    main()
