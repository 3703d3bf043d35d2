"""The README.md model card of a transformers export, written from the run record."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from translate.core.config import DecodeConfig


def _data_lines(record: Dict[str, Any], vocabulary_size: int) -> List[str]:
    data = record.get("data")
    if not data:
        return [f"- Vocabulary: {vocabulary_size:,} ids (sentencepiece). No run record: data unknown."]
    vocabulary = data["vocabulary"]
    origin = f"the given sentencepiece model `{vocabulary['given']}`" if vocabulary.get("given") else "trained on the data"
    return [f"- Data: `{data['source']}`" + (f" ({data['name']})" if data.get("name") else "")
            + f": {data['train_pairs_kept']:,} training pairs after cleaning (of {data['train_pairs']:,}), "
            f"{data['train_tokens']['source']:,} source and {data['train_tokens']['target']:,} target tokens",
            f"- Vocabulary: {vocabulary['size']:,} ids, joint sentencepiece model ({origin}); special ids "
            + ", ".join(f"{k} {v}" for k, v in vocabulary["specials"].items())]


def _training_lines(record: Dict[str, Any]) -> List[str]:
    training, model = record.get("training"), record.get("model")
    lines = []
    if model:
        lines.append(f"- Model: Transformer (post-norm), {model['parameters']:,} parameters: {model['layers']}+"
                     f"{model['layers']} layers, d_model {model['d_model']}, d_ff {model['d_ff']}, {model['heads']} heads")
    if training:
        lines.append(f"- Training: {training['updates']:,} updates, {training['seconds'] / 3600:.2f} h on "
                     f"{training['processes']} x {training['device']} ({training['precision']}), "
                     f"{training['model_flops']:.3g} model FLOPs (summed over resumes)")
    valid = record.get("valid")
    if valid:
        lines.append(f"- Last validation (update {valid['update']:,}): "
                     + ", ".join(f"{k} {v:.3f}" for k, v in valid.items() if k != "update"))
    return lines


def model_card(record: Dict[str, Any], languages: Optional[List[str]], vocabulary_size: int, parameters: int,
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
    scores = record.get("scores", [])
    if scores:
        lines += ["", "## Scores (`translate bleu`)", ""]
        for score in scores:
            lines += [f"`{score['hyp']}` ({score['lines']:,} lines):", "", "```", score["text"], "```", ""]
    commands = record.get("commands", [])
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
