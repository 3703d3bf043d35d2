"""The config tree: presets carry the paper's values; bad keys fail with one line."""

import pytest

from tests.conftest import one_line_error, run_cli


def test_base_preset_has_the_papers_values(compose):
    cfg = compose("train", "config=base")
    assert (cfg.model.layers, cfg.model.d_model, cfg.model.d_ff, cfg.model.heads) == (6, 512, 2048, 8)
    assert cfg.model.dropout == 0.1 and cfg.train.label_smoothing == 0.1
    assert cfg.optim.betas == [0.9, 0.98] and cfg.optim.eps == 1e-9 and cfg.optim.warmup_steps == 4000
    assert cfg.optim.lr_scale == 1.0
    assert cfg.train.tokens_per_update == 25000 and cfg.train.max_steps == 100000
    assert (cfg.decode.beam_size, cfg.decode.length_penalty, cfg.decode.max_len_b) == (4, 0.6, 50)
    assert (cfg.data.path, cfg.data.name, cfg.data.vocab_size) == ("wmt/wmt14", "de-en", 37000)
    assert (cfg.data.src_lang, cfg.data.tgt_lang) == ("en", "de")
    assert (cfg.checkpoint.every_minutes, cfg.checkpoint.average_last) == (10.0, 5)  # section 6.1


def test_big_presets(compose):
    big = compose("train", "config=big")
    assert (big.model.d_model, big.model.d_ff, big.model.heads, big.model.dropout) == (1024, 4096, 16, 0.3)
    assert big.train.max_steps == 300000 and big.checkpoint.average_last == 20
    en_fr = compose("train", "config=big_en_fr")
    assert (en_fr.model.d_model, en_fr.model.dropout) == (1024, 0.1)
    assert (en_fr.data.name, en_fr.data.tgt_lang, en_fr.data.vocab_size) == ("fr-en", "fr", 32000)


def test_tiny_preset_is_the_scaled_down_recipe(compose):
    cfg = compose("train", "config=tiny")
    assert (cfg.model.layers, cfg.model.d_model, cfg.model.d_ff, cfg.model.heads) == (3, 256, 1024, 4)
    assert cfg.data.vocab_size == 8000 and cfg.train.tokens_per_batch == 4096
    assert cfg.data.src_lang == "en" and cfg.data.tgt_lang == "de"
    assert (cfg.checkpoint.every_steps, cfg.checkpoint.average_last) == (200, 3)


def test_run_dir_is_derived_from_preset_and_data():
    from translate.hydra_cli import load_config

    assert load_config("train", ["config=base"]).run_dir == "runs/base-wmt14_en_de"
    assert load_config("decode", ["config=base"]).run_dir == "runs/base-wmt14_en_de"
    assert load_config("bleu", ["config=tiny"]).run_dir == "runs/tiny-multi30k_en_de"
    assert load_config("train", ["config=base", "data=wmt14_en_fr"]).run_dir == "runs/base-wmt14_en_fr"


def test_every_verb_defaults_to_base():
    from translate.hydra_cli import load_config

    for verb in ("train", "decode", "bleu"):
        assert load_config(verb, []).run_dir == "runs/base-wmt14_en_de"


def test_command_line_overrides_win_over_presets(compose):
    cfg = compose("train", "config=tiny", "model.d_model=128", "optim.lr_scale=2.0")
    assert cfg.model.d_model == 128 and cfg.optim.lr_scale == 2.0


@pytest.mark.parametrize(
    "override, expected",
    [
        ("model.foo=1", "model.foo"),
        ("model.d_model=abc", "model.d_model"),
        ("config=nope", "config/nope"),
        ("model.d_model=100", "d_model (100) must be divisible by heads (8)"),
        ("optim.warmup_ratio=1.5", "optim.warmup_ratio (1.5) must be in (0, 1], or null"),
        ("optim.cut_peak_power=0.5", "optim.cut_peak_power (0.5) applies to a warmup cut by optim.warmup_ratio, which is null"),
        ("data.bpe_dropout=1.0", "data.bpe_dropout (1.0) must be in [0, 1)"),
        ("data.bpe_dropout_copies=0", "data.bpe_dropout_copies (0) must be at least 1"),
        ("data.vocab_type=unigram data.bpe_dropout=0.1", "data.bpe_dropout needs data.vocab_type=bpe"),
    ],
)
def test_bad_configuration_is_one_line(override, expected):
    one_line_error(run_cli("train", *override.split()), expected)


def test_cfg_job_prints_the_papers_values():
    result = run_cli("train", "config=base", "--cfg", "job")
    assert result.returncode == 0, result.stderr
    for text in ("d_model: 512", "d_ff: 2048", "heads: 8", "warmup_steps: 4000", "eps: 1.0e-09", "beam_size: 4"):
        assert text in result.stdout


def test_bare_translate_lists_the_verbs():
    result = run_cli()
    assert result.returncode != 0
    for verb in ("train", "decode", "bleu"):
        assert verb in result.stdout


WRONG_CHOICES = {  # an enumerated setting's wrong value: what its one line says
    "valid.metric=blue": "valid.metric",
    "train.precision=fp8": "expected one of [auto, fp32, bf16, fp16]",
    "data.vocab_type=wordpiece": "expected one of [bpe, unigram]",
    "bleu.format=xml": "expected one of [text, json]",
}


@pytest.mark.parametrize("override, expected", WRONG_CHOICES.items())
def test_a_wrong_enumerated_value_fails_at_start_up_naming_the_choices(override, expected):
    one_line_error(run_cli("train", override), expected, override.split("=")[0])


def test_a_broken_rule_between_settings_fails_at_start_up():
    """valid.metric=bleu needs dev sentences to translate: said before any training."""
    result = run_cli("train", "config=tiny", "valid.metric=bleu")
    one_line_error(result, "valid.metric=bleu needs valid.bleu_sentences > 0")
    assert "preparing" not in result.stderr


def test_big_differs_from_base_by_tables_row_and_its_averaging_alone(compose):
    """The presets state only what differs: big is Table 3's big row, 300K updates, and the
    average of the last 20 checkpoints (section 6.1)."""
    from translate.core.config import to_plain

    def leaves(tree, prefix=""):
        for key, value in tree.items():
            if isinstance(value, dict):
                yield from leaves(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}", value

    base, big = (dict(leaves(to_plain(compose("train", f"config={name}")))) for name in ("base", "big"))
    differing = {key for key in base if base[key] != big[key]}
    assert differing == {"model.d_model", "model.d_ff", "model.heads", "model.dropout", "train.max_steps",
                         "checkpoint.keep_last", "checkpoint.average_last"}


def test_group_files_state_only_what_differs_from_the_schema():
    """Each default is stated once, in translate/core/config.py: a config group's file that restates
    a default (warmup_steps: 4000 in optim/noam.yaml, say) fails here."""
    from dataclasses import fields
    from omegaconf import OmegaConf

    from translate.core import config
    from translate.hydra_cli import CONFIG_DIR

    schemas = {"model": config.ModelConfig, "data": config.DataConfig, "optim": config.OptimConfig}
    restated = []
    for group, schema in schemas.items():
        defaults = {f.name: getattr(schema(), f.name) for f in fields(schema)}
        for path in sorted((CONFIG_DIR / group).glob("*.yaml")):
            values = OmegaConf.to_container(OmegaConf.load(path) or OmegaConf.create()) or {}
            restated += [f"{group}/{path.name}: {key}" for key, value in values.items() if defaults.get(key) == value]
    assert restated == []


def test_plain_values_come_back_as_the_config_with_its_choices():
    """from_plain is to_plain's inverse for every field, a Choice included, whatever the class:
    checkpoints keep plain strings, and no field has to be converted by hand where they are read."""
    import dataclasses

    from translate.core.choices import Choice, Norm, Positions

    from translate.core.config import ModelConfig, from_plain, to_plain

    cfg = ModelConfig(d_model=64, heads=2, positions=Positions.learned, norm=Norm.pre, max_positions=9)
    back = from_plain(ModelConfig, to_plain(cfg))
    assert back == cfg and back.positions is Positions.learned and back.norm is Norm.pre

    class Colour(Choice):
        red = "red"
        blue = "blue"

    @dataclasses.dataclass
    class WithAChoice:
        colour: Colour = Colour.red
        size: int = 1

    assert from_plain(WithAChoice, {"colour": "blue", "unknown": 3}) == WithAChoice(Colour.blue, 1)
    with pytest.raises(ValueError):
        from_plain(WithAChoice, {"colour": "green"})


def test_the_published_multi30k_recipe_is_a_preset(compose):
    """config=multi30k_wu2021: Wu et al. (2021)'s Transformer-Tiny, its peak rate 0.005 after
    2,000 warmup updates, 8,192 tokens an update, fairseq's initialization, the last 10 epoch
    checkpoints averaged, beam 5."""
    cfg = compose("train", "config=multi30k_wu2021")
    m, o, t, c = cfg.model, cfg.optim, cfg.train, cfg.checkpoint
    assert (m.d_model, m.d_ff, m.heads, m.layers, m.dropout) == (128, 256, 4, 4, 0.3)
    assert o.lr_scale * m.d_model**-0.5 * o.warmup_steps**-0.5 == pytest.approx(0.005, rel=1e-4)
    assert (o.eps, o.clip_norm, t.label_smoothing, t.tokens_per_update, t.max_steps) == (1e-8, 25.0, 0.1, 8192, 8000)
    assert c.by_epochs_alone and (c.keep_last, c.average_last) == (10, 10) and cfg.decode.beam_size == 5
    assert cfg.data.literature_bleu == "lowercased" and t.init == "fairseq"
