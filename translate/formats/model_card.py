"""The README.md model card of a transformers export, written from the run record."""

from __future__ import annotations

from typing import List, Optional

from translate.core.config import DecodeConfig
from translate.core.run_record import RunRecord


def _data_lines(record: RunRecord, vocabulary_size: int) -> List[str]:
    data = record.data
    if not data:
        return [f"- Vocabulary: {vocabulary_size:,} ids (sentencepiece). No run record: data unknown."]
    vocabulary, tokens = data.vocabulary, data.train_tokens
    origin = f"the given sentencepiece model `{vocabulary.given}`" if vocabulary.given else "trained on the data"
    return [f"- Data: `{data.source}`" + (f" ({data.name})" if data.name else "")
            + f": {data.train_pairs_kept:,} training pairs after cleaning (of {data.train_pairs:,}), "
            f"{tokens.source:,} source and {tokens.target:,} target tokens",
            f"- Vocabulary: {vocabulary.size:,} ids, joint sentencepiece model ({origin}); special ids "
            + ", ".join(f"{k} {v}" for k, v in vocabulary.specials.items())]


def _training_lines(record: RunRecord) -> List[str]:
    training, model = record.training, record.model
    lines = []
    if model:
        shape = model.model_config()
        lines.append(f"- Model: Transformer (post-norm), {model.parameters:,} parameters: {shape.layers}+"
                     f"{shape.layers} layers, d_model {shape.d_model}, d_ff {shape.d_ff}, {shape.heads} heads")
    if training:
        lines.append(f"- Training: {training.updates:,} updates, {training.seconds / 3600:.2f} h on "
                     f"{training.processes} x {training.device} ({training.precision}), "
                     f"{training.model_flops:.3g} model FLOPs (summed over resumes)")
    valid = record.valid
    if valid:
        lines.append(f"- Last validation (update {valid.update:,}): "
                     + ", ".join(f"{k} {v:.3f}" for k, v in valid.metrics.items()))
    return lines


def model_card(record: RunRecord, languages: Optional[List[str]], vocabulary_size: int, parameters: int,
               decode: DecodeConfig, *, longest_source: int, lowercase: bool = False,
               length_penalty_origin: str = "the configuration's") -> str:
    """Markdown: languages, data, vocabulary, model, training, scores, the commands that
    reproduce the run, how to load the folder, and the decode settings generate() defaults to
    (where the length penalty came from: `length_penalty_origin`)."""
    source, target = (languages or ["?", "?"])[:2]
    lines = ["---", f"language: [{source}, {target}]", "library_name: transformers", "pipeline_tag: translation",
             "tags: [translation, marian, attention-is-all-you-need]", "---", "",
             f"# Transformer {source}-{target}", "",
             f'A Transformer of "Attention Is All You Need" trained with `translate`, {parameters:,} parameters, '
             f"exported as a MarianMTModel.", ""]
    lines += _data_lines(record, vocabulary_size) + _training_lines(record)
    if record.scores:
        lines += ["", "## Scores (`translate bleu`)", ""]
        for score in record.scores:
            lines += [f"`{score.hyp}` ({score.lines:,} lines):", "", "```", score.text, "```", ""]
    commands = record.commands or []
    if commands:
        overrides = commands[-1].split(" ", 2)[2] if commands[-1].count(" ") >= 2 else ""  # after `translate train`
        lines += ["", "## Reproduce", "", "```bash", *commands, f"translate decode {overrides}".strip(),
                  f"translate bleu {overrides}".strip(), "```"]
    lines += ["", "## Use", "", "```python", "from transformers import AutoModelForSeq2SeqLM, AutoTokenizer", "",
              'tokenizer = AutoTokenizer.from_pretrained("PATH")', 'model = AutoModelForSeq2SeqLM.from_pretrained("PATH")',
              f'batch = tokenizer(["A sentence to translate."{".lower()" if lowercase else ""}], return_tensors="pt", padding=True)',
              "print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))", "```", "",
              f"generate() defaults to our decode settings: beam {decode.beam_size}, length penalty "
              f"{decode.length_penalty} ({length_penalty_origin}), at most {decode.output_cap(longest_source)} output tokens (for the longest input, "
              f"{longest_source} tokens; decode's output cap). transformers' "
              "beam search divides a hypothesis's log-probability by length ** length_penalty, ours by GNMT's "
              "((5 + length) / 6) ** alpha, so beam outputs may differ; greedy outputs (num_beams=1) agree.", ""]
    if lowercase:
        lines += ["It was trained on lowercased text (`data.lowercase`) and writes lowercased text: lowercase its "
                  "input first, as `translate decode` does.", ""]
    return "\n".join(lines)
