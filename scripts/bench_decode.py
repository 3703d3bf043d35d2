#!/usr/bin/env python
"""Beam-4 decoding speed on the CPU, side by side in one run: one JSON line per measurement.

On the same checkpoint and the same real test sentences (default: the Multi30k test split):
  - ours: batched beam search on the cached incremental step (in-process),
  - plain: the same search, but every step recomputes the decoder over the whole prefix,
  - ctranslate2: the exported model in CTranslate2, same threads: through our framing
    (translate.formats.ctranslate2, in this process) and at its fastest (one translate_batch
    call, timed without start-up, in a Python process of its own: where torch's products have
    run, CTranslate2 ran 1.36x slower), in float32 and with its weights quantized to int8 on load,
  - ours in bf16 (decode.precision=bf16) where the CPU computes bf16 natively (AMX,
    AVX512-BF16): speed and BLEU beside float32's, on each split,
  - cli: a whole `translate decode` process, start-up included, against a whole Python process
    that loads the CTranslate2 export and translates the same file (float32),
  - fairseq: a whole fairseq-generate process (../shared/anchors/fairseq/run.sh decode, beam 4,
    length penalty 0.6) on its own model trained by `run.sh train 17`; skipped, with a line
    saying so, where the anchor or its checkpoint is missing. Its model is not ours, so
    outputs differ in length: compare target tokens/s (output pieces + EOS per sentence).
Each line carries sentences/s, target tokens/s and, on the dev split only, sacreBLEU, so speed
is compared at equal quality: a held-out test split may be decoded for speed but is never scored
here (its scores belong to `translate bleu` and the run record; bleu is null, and the same
outputs say equal quality); others_cpu_s: the CPU seconds other processes took meanwhile (near 0 when the
machine was quiet), and steal_s: the CPU seconds the hypervisor gave to other machines while
this one wanted them (a neighbour's slowdown, which no process here shows). Rounds interleave
ours, CTranslate2, the whole process and fairseq-generate.
To compare CPU kinds on one machine, force both sides down, e.g. to AVX2:
ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 CT2_FORCE_CPU_ISA=AVX2.

    make demo    # trains runs/tiny-multi30k_en_de/checkpoint_last.pt first
    .venv/bin/python scripts/bench_decode.py --rounds 2
    .venv/bin/python scripts/bench_decode.py --splits test test_2017_flickr test_2018_flickr test_2017_mscoco
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import List, Tuple

import torch
import torch.nn.functional as F

from translate.core.choices import Precision
from translate.core.precision import native_bf16
from translate.data.loading import load_corpus
from translate.hydra_cli import load_config
from translate.metrics import corpus_bleu
from translate.translator import Translator

ROOT = Path(__file__).resolve().parents[1]
ANCHOR = ROOT.parent / "shared" / "anchors" / "fairseq"
# The anchor's trained tiny model (`run.sh train 17`), which `run.sh decode` translates with.
ANCHOR_CHECKPOINT = Path(os.environ.get("FAIRSEQ_ANCHOR", "/tmp/fairseq-anchor")) / "runs" / "long" / "checkpoint_last.pt"



def emit(**record) -> None:
    print(json.dumps(record), flush=True)


@dataclass
class PrefixState:
    """State of the plain decoder: the encoder output and the whole prefix so far."""

    memory: torch.Tensor  # (B, S, D)
    src_mask: torch.Tensor  # (B, 1, 1, S)
    prefix: torch.Tensor  # (B, t)

    def reorder(self, index: torch.Tensor, group=None) -> "PrefixState":
        return PrefixState(self.memory.index_select(0, index), self.src_mask.index_select(0, index), self.prefix.index_select(0, index))


class PlainModel:
    """The model without incremental decoding: each step runs the decoder on the whole prefix."""

    def __init__(self, model):
        self.model = model

    def __getattr__(self, name):  # all but the two methods below are the model's (cfg, parameters, ...)
        return getattr(self.model, name)

    def start_state(self, src):
        memory, src_mask = self.model.encode(src)
        return PrefixState(memory, src_mask, torch.zeros(src.size(0), 0, dtype=torch.long))

    def step(self, tokens, state: PrefixState):
        state.prefix = torch.cat([state.prefix, tokens[:, None]], dim=1)
        hidden = self.model.decoder_states(state.prefix, state.memory, state.src_mask)  # (B, t, D)
        return F.log_softmax(self.model.logits(hidden[:, -1]).float(), dim=-1)


class Stopwatch:
    """Wall seconds of a measurement, and the CPU seconds the rest of the machine used meanwhile
    (all cores busy, from /proc/stat, less this process and the children it waited for): near
    0 on a quiet machine; on a shared one, a measurement another process slowed shows it."""

    def __enter__(self) -> "Stopwatch":
        self.started, self.own = time.perf_counter(), _own_cpu_seconds()
        self.busy, self.steal = _busy_cpu_seconds()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self.started
        busy, steal = _busy_cpu_seconds()
        busy -= self.busy
        self.others = round(max(0.0, busy - (_own_cpu_seconds() - self.own)), 1) if busy >= 0 else None
        self.stolen = round(steal - self.steal, 1) if steal >= 0 else None

    def load(self) -> dict:
        """What else took the CPU meanwhile, as each measurement's line reports it."""
        return {"others_cpu_s": self.others, "steal_s": self.stolen}


def _busy_cpu_seconds() -> Tuple[float, float]:
    """CPU seconds all cores spent busy since boot, and those the hypervisor gave to other
    machines while this one wanted to run (steal: a neighbour slowing a measurement, which no
    process here shows). Linux; -1 elsewhere."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return -1.0, -1.0
    user, nice, system, _, _, irq, softirq, steal = (int(x) for x in fields[:8])
    tick = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / tick, steal / tick


def _own_cpu_seconds() -> float:
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def measure(name: str, translate, sources: List[str], references: List[str], **extra) -> dict:
    with Stopwatch() as watch:
        hypotheses = translate(sources)
    return report(name, hypotheses, references, watch.seconds, **watch.load(), **extra)


def report(name, hypotheses, references, seconds, tokenizer=None, emitted=True, **extra) -> dict:
    """One measurement's line; sacreBLEU only where references are given (the dev split: see main)."""
    bleu = round(corpus_bleu(hypotheses, references)[0].score, 2) if references else None
    tokens = sum(len(ids) + 1 for ids in tokenizer(hypotheses)) if tokenizer else None
    record = dict(measurement=f"decode_{name}", sentences=len(hypotheses), seconds=round(seconds, 2),
                  sentences_per_s=round(len(hypotheses) / seconds, 1),
                  target_tokens_per_s=round(tokens / seconds, 1) if tokens else None,
                  bleu=bleu, threads=torch.get_num_threads(), **extra)
    if emitted:
        emit(**record)
    return {**record, "hypotheses": hypotheses}


def by_split(args, hypotheses: List[str], references: List[str]) -> dict:
    """sacreBLEU of each split's share of the sentences (they are translated as one list); none
    without references (a held-out split)."""
    scores, start = {}, 0
    if not references:
        return scores
    for split, size in zip(args.splits, args.split_sizes):
        scores[split] = round(corpus_bleu(hypotheses[start:start + size], references[start:start + size])[0].score, 2)
        start += size
    return scores


# CTranslate2 in a Python process of its own, as its users run it: in a process where torch's
# products have run, its translate_batch took 1.36x as long (51.7 s against 36.3-38.1 s here).
CT2_PROCESS = """
import sys, time, ctranslate2, sentencepiece as spm
folder, source, output, beam, alpha, threads, compute_type = sys.argv[1:8]
processor = spm.SentencePieceProcessor(model_file=folder + "/sentencepiece.model")
translator = ctranslate2.Translator(folder, device="cpu", intra_threads=int(threads), compute_type=compute_type)
lines = open(source, encoding="utf-8").read().splitlines()
pieces = [[processor.id_to_piece(i) for i in ids] for ids in processor.encode(lines)]
started = time.perf_counter()
results = translator.translate_batch(pieces, beam_size=int(beam), length_penalty=float(alpha), max_batch_size=256,
                                     max_input_length=0, max_decoding_length=max(map(len, pieces)) + 50, disable_unk=True,
                                     suppress_sequences=[["<pad>"], ["<s>"]])
print(time.perf_counter() - started)
open(output, "w", encoding="utf-8").write("".join(processor.decode_pieces(r.hypotheses[0]) + "\\n" for r in results))
"""


def ctranslate2_process(folder: str, sources: List[str], references: List[str], d, threads: int, encode,
                        compute_type: str = "default", **extra) -> Tuple[dict, dict]:
    """CTranslate2 at its fastest: all sentences in one translate_batch call (it sorts and
    batches them itself), the float32 export's weights as they are or quantized on load
    (compute_type="int8"), in a Python process of its own that loads the export first.
    Returns two records: the call alone (to set beside ours in-process) and the whole process,
    start-up included (beside cli_process's)."""
    name = "ctranslate2_one_call" if compute_type == "default" else f"ctranslate2_{compute_type}"
    with tempfile.TemporaryDirectory() as work:
        src, out = Path(work) / "input.txt", Path(work) / "out.txt"
        src.write_text("\n".join(sources) + "\n", encoding="utf-8")
        with Stopwatch() as watch:
            child = subprocess.run([sys.executable, "-c", CT2_PROCESS, folder, str(src), str(out), str(d.beam_size),
                                    str(d.length_penalty), str(threads), compute_type], check=True, capture_output=True,
                                   text=True)
        hypotheses = out.read_text(encoding="utf-8").splitlines()
    call = report(name, hypotheses, references, float(child.stdout.split()[-1]), tokenizer=encode,
                  **watch.load(), beam_size=d.beam_size, **extra)
    process = report(name.replace("one_call", "process"), hypotheses, references, watch.seconds, tokenizer=encode,
                     **watch.load(), emitted=False, **extra)
    return call, process


def anchor_record(line: str) -> dict:
    """run.sh decode's JSON line. Its seconds may come unevaluated, as
    `round(END-START, 1)` (a quoting slip in run.sh): then they are worked out here."""
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        end, start = (float(x) for x in re.search(r"round\(([\d.]+)-([\d.]+), 1\)", line).groups())
        fixed = re.sub(r"round\([\d.]+-[\d.]+, 1\)", str(round(end - start, 1)), line)
        return json.loads(fixed)


def fairseq_generate(threads: int) -> dict:
    """run.sh decode: fairseq-generate's whole process on the anchor's trained tiny model, with
    its target tokens (output pieces + EOS) counted from its per-token score lines."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    result = subprocess.run(["bash", str(ANCHOR / "run.sh"), "decode"], capture_output=True, text=True, env=env, check=True)
    record = anchor_record(result.stdout.strip().splitlines()[-1])
    # P- lines: one score per output token, EOS included (H- lines are text after --remove-bpe).
    tokens = sum(len(line.split("\t")[1].split()) for line in (ANCHOR_CHECKPOINT.parents[1] / "gen.out").read_text(encoding="utf-8").splitlines()
                 if line.startswith("P-"))
    seconds = record["seconds_whole_process"]
    record = dict(measurement="decode_fairseq_generate_process", sentences=record["sentences"], seconds=seconds,
                  sentences_per_s=round(record["sentences"] / seconds, 1), target_tokens_per_s=round(tokens / seconds, 1),
                  bleu=None, threads=threads)  # run.sh scores the test split: a speed benchmark does not report it
    emit(**record)
    return record


def cli_process(args, sources: List[str], references: List[str], encode, length_penalty: float) -> dict:
    """A whole `translate decode` process on the sentences, start-up included."""
    with tempfile.TemporaryDirectory() as folder:
        src = Path(folder) / "input.txt"
        src.write_text("\n".join(sources) + "\n", encoding="utf-8")
        with Stopwatch() as watch:
            subprocess.run([sys.executable, "-m", "translate", "decode", f"config={args.config}",
                            f"decode.checkpoint={args.checkpoint}", f"decode.input={src}", f"decode.output={folder}/out.txt",
                            f"decode.length_penalty={length_penalty}",
                            f"run_dir={folder}/run"], check=True, cwd=ROOT, capture_output=True,
                           env=dict(os.environ, OMP_NUM_THREADS=str(args.threads)))
        hypotheses = (Path(folder) / "out.txt").read_text(encoding="utf-8").splitlines()
        return report("cli_process", hypotheses, references, watch.seconds, tokenizer=encode, **watch.load())


def ratio(ours: dict, theirs: dict, key: str) -> float:
    return round(ours[key] / theirs[key], 2)


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default=str(ROOT / "runs/tiny-multi30k_en_de/checkpoint_last.pt"))
    parser.add_argument("--config", default="tiny", help="preset whose data and decode settings are used")
    parser.add_argument("--splits", nargs="+", default=["test"], help="dataset splits, translated as one list")
    parser.add_argument("--override", nargs="*", default=[], help="more config overrides, e.g. a test set: "
                        "data=wmt14_en_de data.path=../shared/data/wmt14-mini")
    parser.add_argument("--limit", type=int, default=0, help="first N sentences only (0: all)")
    parser.add_argument("--plain-limit", type=int, default=200, help="sentences for the slow plain decoder")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--skip", nargs="*", default=[], choices=["plain", "ctranslate2", "ct2_framing", "bf16", "cli", "fairseq"])
    return parser.parse_args()


def against_plain(translator, settings, sources, references, limit: int) -> None:
    """Our cached decoder against the same search on the plain (uncached) model."""
    n = min(limit, len(sources))
    encode = translator.vocabulary.to_ids
    plain = Translator(PlainModel(translator.model), translator.vocabulary)  # same search, no cache
    subset_ours = measure("ours_subset", lambda s: translator.translate(s, settings), sources[:n], references[:n], tokenizer=encode)
    subset_plain = measure("plain_subset", lambda s: plain.translate(s, settings), sources[:n], references[:n], tokenizer=encode)
    emit(measurement="decode_speedup_over_plain", sentences=n,
         ratio=round(subset_ours["sentences_per_s"] / subset_plain["sentences_per_s"], 2),
         same_outputs=subset_ours["hypotheses"] == subset_plain["hypotheses"],
         output_tokens_per_sentence=round(subset_ours["target_tokens_per_s"] / subset_ours["sentences_per_s"], 1))


def fairseq_comparable(args) -> bool:
    """Whether fairseq-generate (run.sh decode) is compared: its checkpoint exists, and this run
    translates what it translates; says why not otherwise."""
    if "fairseq" in args.skip:
        return False
    if not ANCHOR_CHECKPOINT.exists():
        emit(measurement="decode_fairseq_generate_process", skipped="no anchor checkpoint: bash ../shared/anchors/fairseq/setup.sh; "
             "bash ../shared/anchors/fairseq/run.sh train 17")
        return False
    if args.limit or args.splits != ["test"] or args.override or args.config != "tiny":
        emit(measurement="decode_fairseq_generate_process", skipped="run.sh decode translates the whole Multi30k test "
             "split: compared only for --config tiny without --limit, --splits or --override")
        return False
    return True


def one_round(round_: int, args, translator, settings, sources, references, ct2_folder) -> None:
    """Ours in-process, CTranslate2 (two ways), our whole process and fairseq-generate's."""
    encode, d = translator.vocabulary.to_ids, settings
    ours = measure("ours", lambda s: translator.translate(s, d), sources, references,
                   tokenizer=encode, beam_size=d.beam_size, round=round_)
    if ct2_folder is not None:
        from translate.formats.ctranslate2 import ctranslate2_translate

        one_call, ct2_whole = ctranslate2_process(ct2_folder, sources, references, d, args.threads, encode, round=round_)
        best = one_call
        if "ct2_framing" not in args.skip:
            ct2 = measure("ctranslate2", lambda s: ctranslate2_translate(ct2_folder, s, d, threads=args.threads),
                          sources, references, tokenizer=encode, beam_size=d.beam_size, round=round_)
            best = max((ct2, one_call), key=lambda r: r["sentences_per_s"])
        emit(measurement="decode_ours_over_ctranslate2", round=round_, ratio=ratio(ours, best, "sentences_per_s"),
             target_tokens_ratio=ratio(ours, best, "target_tokens_per_s"))
        # What a user who wants speed picks: int8 weights (no goal for ours against it yet).
        int8, _ = ctranslate2_process(ct2_folder, sources, references, d, args.threads, encode, "int8", round=round_)
        emit(measurement="decode_ours_over_ctranslate2_int8", round=round_, ratio=ratio(ours, int8, "sentences_per_s"),
             target_tokens_ratio=ratio(ours, int8, "target_tokens_per_s"))
    if native_bf16() and "bf16" not in args.skip:
        bf16 = measure("ours_bf16", lambda s: translator.translate(s, replace(d, precision=Precision.bf16)), sources,
                       references, tokenizer=encode, beam_size=d.beam_size, round=round_)
        emit(measurement="decode_bf16_over_fp32", round=round_, ratio=ratio(bf16, ours, "sentences_per_s"),
             bleu_fp32=by_split(args, ours["hypotheses"], references), bleu_bf16=by_split(args, bf16["hypotheses"], references),
             same_outputs=round(sum(a == b for a, b in zip(ours["hypotheses"], bf16["hypotheses"])) / len(sources), 3))
    if "cli" not in args.skip:
        process = cli_process(args, sources, references, encode, d.length_penalty)
        if ct2_folder is not None:
            emit(**{k: v for k, v in ct2_whole.items() if k != "hypotheses"})
            emit(measurement="decode_process_over_ctranslate2_process", round=round_,
                 ratio=ratio(process, ct2_whole, "sentences_per_s"),
                 target_tokens_ratio=ratio(process, ct2_whole, "target_tokens_per_s"))
        if "fairseq" not in args.skip:
            theirs = fairseq_generate(args.threads)
            emit(measurement="decode_process_over_fairseq_generate", round=round_,
                 target_tokens_ratio=ratio(process, theirs, "target_tokens_per_s"),
                 sentences_ratio=ratio(process, theirs, "sentences_per_s"))


def main() -> None:
    args = arguments()
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    cfg = load_config("decode", [f"config={args.config}", f"decode.checkpoint={args.checkpoint}", *args.override])
    sources, references, args.split_sizes = [], [], []
    for split in args.splits:
        found = load_corpus(cfg.data, split).pairs()
        found = tuple(side[: args.limit] for side in found) if args.limit else found
        sources, references = sources + found[0], references + found[1]
        args.split_sizes.append(len(found[0]))
    if any(split != cfg.data.valid_split for split in args.splits):
        references = []  # a held-out split: decoded for speed, never scored here (issue 52)
    translator = Translator.from_checkpoint(Path(args.checkpoint))
    if "plain" not in args.skip:
        against_plain(translator, cfg.decode, sources, references, args.plain_limit)
    if not fairseq_comparable(args):
        args.skip.append("fairseq")
    with tempfile.TemporaryDirectory() as folder:
        ct2_folder = None
        if "ctranslate2" not in args.skip:
            from translate.verbs.export import export

            ct2_folder = f"{folder}/ct2"
            export(load_config("export", [f"config={args.config}", f"export.checkpoint={args.checkpoint}", f"export.output={ct2_folder}"]))
        for round_ in range(1, args.rounds + 1):
            one_round(round_, args, translator, cfg.decode, sources, references, ct2_folder)


if __name__ == "__main__":
    main()
