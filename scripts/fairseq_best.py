#!/usr/bin/env python
"""fairseq 0.12.2 at its best beside us, on the same terms (issue 52): Wu et al.'s text-only
Transformer-Tiny recipe (../shared/anchors/fairseq/run.sh literature) on Multi30k, trained for
--minutes, with what ours has and run.sh's does not, each an option its JSON lines record:

  --lowercase       the same text as config=multi30k_lowercase (str.lower() of both sides, as
                    data.lowercase does), its own joint 8k sentencepiece BPE, as run.sh's data;
  --lenpens         the length penalty chosen on the dev split, as `translate tune` chooses
                    alpha: each value decodes all of it (beam --beam), the best sacreBLEU wins
                    (ties: the nearest fairseq's default, 1.0), and while the best is the largest
                    tried, one more step of the grid's last spacing, up to 3.0;
  --decay-to N      fairseq's polynomial_decay to N updates (the updates the hour reaches,
                    e.g. from an earlier hour's line) instead of inverse_sqrt, after --warmup.

Then each test split (test_2016_flickr, test_2017_flickr, test_2017_mscoco, test_2018_flickr)
is decoded once with the chosen penalty and scored once, by translate.metrics, the scorer of
`translate bleu`: sacreBLEU against the raw references and the Multi30k papers' lowercased
tokenized BLEU. fairseq trains in fp32 (its CPU path has no bf16). One JSON line per test
split, one for the choice on dev. Needs the anchor (bash ../shared/anchors/fairseq/setup.sh,
into $FAIRSEQ_ANCHOR, /tmp/fairseq-anchor by default); without it, one line saying so.

    .venv/bin/python scripts/fairseq_best.py --minutes 60 --lowercase                  # the hour
    .venv/bin/python scripts/fairseq_best.py --minutes 60 --lowercase --decay-to 1800 --warmup 400
    .venv/bin/python scripts/fairseq_best.py --minutes 2 --work /tmp/fb                # a try
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from bench_fairseq import commit, machine  # noqa: E402  the machine and commit a figure names, as bench_fairseq's
RAW = ROOT.parent / "shared" / "data" / "raw" / "multi30k-task1-raw"
TESTS = ["test_2016_flickr", "test_2017_flickr", "test_2017_mscoco", "test_2018_flickr"]
FAIRSEQ_DEFAULT_LENPEN = 1.0
PUBLISHED = {"de": {"test_2016_flickr": 41.02}}  # Wu et al. 2021, text-only Transformer-Tiny (README)


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def anchor() -> Path:
    return Path(os.environ.get("FAIRSEQ_ANCHOR", "/tmp/fairseq-anchor"))


def tool(name: str) -> str:
    return str(anchor() / "venv" / "bin" / name)


def fairseq_env() -> Dict[str, str]:
    return dict(os.environ, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1", PYTHONWARNINGS="ignore")


def read_raw(split: str, lang: str, lowercase: bool) -> List[str]:
    with gzip.open(RAW / f"{split}.{lang}.gz", "rt", encoding="utf-8") as file:
        lines = [line.rstrip("\n") for line in file]
    return [line.lower() for line in lines] if lowercase else lines


def prepare(work: Path, tgt: str, lowercase: bool) -> Path:
    """Raw text (lowercased or not), a joint sentencepiece BPE of 8,000 trained on the training
    sides, and fairseq-preprocess --joined-dictionary: valid is the dev split, test, test1, ... the
    test splits in TESTS' order. Returns the data-bin folder."""
    import sentencepiece as spm

    text, pieces, binary = work / "raw", work / "spm", work / "data-bin"
    for folder in (text, pieces):
        folder.mkdir(parents=True, exist_ok=True)
    splits = ["train", "val", *TESTS]
    for split in splits:
        for lang in ("en", tgt):
            (text / f"{split}.{lang}").write_text("\n".join(read_raw(split, lang, lowercase)) + "\n", encoding="utf-8")
    joint = text / "train.joint"
    joint.write_text((text / "train.en").read_text(encoding="utf-8") + (text / f"train.{tgt}").read_text(encoding="utf-8"),
                     encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(joint), model_prefix=str(pieces / "spm_bpe8000"), vocab_size=8000,
                                   model_type="bpe", character_coverage=1.0, num_threads=2, bos_id=-1, eos_id=-1,
                                   pad_id=-1, unk_id=0, minloglevel=2)
    model = spm.SentencePieceProcessor(model_file=str(pieces / "spm_bpe8000.model"))
    for split in splits:
        for lang in ("en", tgt):
            lines = (text / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()
            (pieces / f"{split}.{lang}").write_text("\n".join(" ".join(model.encode(line, out_type=str)) for line in lines) + "\n",
                                                    encoding="utf-8")
    subprocess.run([tool("fairseq-preprocess"), "--source-lang", "en", "--target-lang", tgt, "--trainpref", str(pieces / "train"),
                    "--validpref", str(pieces / "val"), "--testpref", ",".join(str(pieces / s) for s in TESTS),
                    "--destdir", str(binary), "--joined-dictionary", "--workers", "2"],
                   check=True, capture_output=True, env=fairseq_env())
    return binary


def train_command(binary: Path, save: Path, args: argparse.Namespace) -> List[str]:
    """run.sh literature's flags (Wu et al.'s recipe), with the schedule of --decay-to."""
    command = [tool("fairseq-train"), str(binary), "--cpu", "--task", "translation", "--source-lang", "en",
               "--target-lang", args.tgt, "--arch", "transformer", "--encoder-layers", "4", "--decoder-layers", "4",
               "--encoder-embed-dim", "128", "--decoder-embed-dim", "128", "--encoder-ffn-embed-dim", "256",
               "--decoder-ffn-embed-dim", "256", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
               "--share-all-embeddings", "--dropout", "0.3", "--optimizer", "adam", "--adam-betas", "(0.9,0.98)",
               "--lr", str(args.lr), "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
               "--max-tokens", "4096", "--update-freq", "2", "--clip-norm", "25", "--max-update", "8000",
               "--warmup-updates", str(args.warmup), "--stop-time-hours", str(args.minutes / 60), "--save-dir", str(save),
               "--keep-last-epochs", "10", "--disable-validation", "--log-interval", "50", "--log-format", "simple",
               "--seed", str(args.seed), "--num-workers", "1"]
    if args.decay_to:
        command += ["--lr-scheduler", "polynomial_decay", "--total-num-update", str(args.decay_to), "--end-learning-rate", "0"]
    else:
        command += ["--lr-scheduler", "inverse_sqrt"]
    return command


def generate(binary: Path, checkpoint: Path, subset: str, tgt: str, beam: int, lenpen: float) -> List[str]:
    """fairseq-generate's detokenized outputs, in the input's order."""
    result = subprocess.run([tool("fairseq-generate"), str(binary), "--cpu", "--path", str(checkpoint), "--gen-subset", subset,
                             "--source-lang", "en", "--target-lang", tgt, "--beam", str(beam), "--lenpen", str(lenpen),
                             "--batch-size", "64", "--remove-bpe", "sentencepiece"],
                            check=True, capture_output=True, text=True, env=fairseq_env())
    found = {}
    for line in result.stdout.splitlines():
        if line.startswith("D-"):
            index, _, text = line[2:].split("\t", 2)
            found[int(index)] = text
    return [found[i] for i in range(len(found))]


def search_lenpens(lenpens: Sequence[float], extend_to: float, score: Callable[[float], float]) -> Dict[float, float]:
    """Each penalty's dev score; while the best is the largest tried, one more step of the last
    spacing, up to extend_to (translate tune's search)."""
    scores = {lenpen: score(lenpen) for lenpen in lenpens}
    while True:
        best, largest = choose(scores), max(scores)
        step = largest - sorted(scores)[-2] if len(scores) > 1 else 0.5
        following = round(largest + step, 6)
        if best != largest or following > extend_to + 1e-9:
            return scores
        scores[following] = score(following)


def choose(scores: Dict[float, float]) -> float:
    return max(scores, key=lambda lenpen: (scores[lenpen], -abs(lenpen - FAIRSEQ_DEFAULT_LENPEN)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=60.0, help="training wall time (fairseq's --stop-time-hours)")
    parser.add_argument("--tgt", default="de", choices=["de", "fr"], help="target language (Multi30k EN-DE or EN-FR)")
    parser.add_argument("--lowercase", action="store_true", help="lowercase both sides, as config=multi30k_lowercase")
    parser.add_argument("--lenpens", type=float, nargs="+", default=[0.0, 0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.5],
                        help="length penalties tried on the dev split (translate tune's grid)")
    parser.add_argument("--extend-to", type=float, default=3.0)
    parser.add_argument("--beam", type=int, default=5, help="beam size (the published recipe's 5)")
    parser.add_argument("--decay-to", type=int, default=0,
                        help="polynomial_decay to this many updates instead of inverse_sqrt (0: the published inverse_sqrt)")
    parser.add_argument("--warmup", type=int, default=2000, help="warmup updates (the published 2,000)")
    parser.add_argument("--lr", type=float, default=0.005, help="peak learning rate (the published 0.005)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--work", type=Path, default=None, help="working folder (default: $FAIRSEQ_ANCHOR/best-...)")
    args = parser.parse_args()
    if not (anchor() / "venv" / "bin" / "fairseq-train").exists():
        emit(measurement="fairseq_best", skipped="fairseq anchor not built: bash ../shared/anchors/fairseq/setup.sh")
        return
    from translate.metrics import corpus_bleu, lowercased_tokenized_bleu

    work = args.work or anchor() / f"best-{args.tgt}{'-lc' if args.lowercase else ''}-seed{args.seed}"
    work.mkdir(parents=True, exist_ok=True)
    binary = prepare(work, args.tgt, args.lowercase)
    save = work / "checkpoints"
    started = time.monotonic()
    with open(work / "train.log", "w", encoding="utf-8") as log:
        subprocess.run(train_command(binary, save, args), check=True, stdout=log, stderr=subprocess.STDOUT, env=fairseq_env())
    training_seconds = round(time.monotonic() - started)
    updates = max(map(int, re.findall(r"num_updates[ =](\d+)", (work / "train.log").read_text(encoding="utf-8"))), default=0)
    epochs = sorted(save.glob("checkpoint[0-9]*.pt"), key=lambda p: int(p.stem[len("checkpoint"):]))
    average = save / "average.pt"
    if epochs:
        # the sdist setup.sh builds has no scripts/average_checkpoints.py: our stand-in, in fairseq's venv
        subprocess.run([tool("python"), str(ROOT / "scripts" / "fairseq_average_checkpoints.py"), "--inputs", str(save),
                        "--num-epoch-checkpoints", str(min(len(epochs), 10)), "--output", str(average)],
                       check=True, capture_output=True, env=fairseq_env())
    else:
        average = save / "checkpoint_last.pt"
    conditions = dict(tgt=args.tgt, lowercase=args.lowercase, precision="fp32", minutes=args.minutes, updates=updates,
                      training_seconds=training_seconds, epochs_averaged=min(len(epochs), 10), beam=args.beam,
                      schedule=f"polynomial_decay to {args.decay_to}" if args.decay_to else "inverse_sqrt",
                      warmup=args.warmup, lr=args.lr, seed=args.seed, machine=machine(), commit=commit(),
                      fairseq="0.12.2 (../shared/anchors/fairseq)")
    dev_references = read_raw("val", args.tgt, args.lowercase)
    scores = search_lenpens(args.lenpens, args.extend_to, lambda lenpen: round(corpus_bleu(
        generate(binary, average, "valid", args.tgt, args.beam, lenpen), dev_references)[0].score, 2))
    lenpen = choose(scores)
    emit(measurement="fairseq_best_dev_choice", split="val", lenpen=lenpen, sacrebleu_by_lenpen=scores, **conditions)
    for index, split in enumerate(TESTS):  # each decoded and scored once, with the penalty chosen on dev
        subset = "test" if index == 0 else f"test{index}"
        hypotheses = generate(binary, average, subset, args.tgt, args.beam, lenpen)
        references = read_raw(split, args.tgt, False)  # as `translate bleu` scores: raw references
        (work / f"{split}.hyp").write_text("\n".join(hypotheses) + "\n", encoding="utf-8")
        emit(measurement="fairseq_best_test", split=split, lenpen=lenpen,
             sacrebleu=round(corpus_bleu(hypotheses, references, lowercase=args.lowercase)[0].score, 2),
             lowercased_tokenized_bleu=round(lowercased_tokenized_bleu(hypotheses, references, args.tgt)[0].score, 2),
             published=PUBLISHED.get(args.tgt, {}).get(split), **conditions)


if __name__ == "__main__":
    main()
