"""Vocabulary (translate.data.vocabulary): trained, sampled and round-tripped; any sentencepiece
model's special pieces, mapped onto our special symbols."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import TEXT, need, train_sentencepiece
from translate.core.errors import TranslateError
from translate.data.vocabulary import OUR_LAYOUT, SpecialIds, Vocabulary


def test_sentencepiece_defaults_get_a_pad_after_their_pieces(default_spm_model):
    vocabulary = Vocabulary(default_spm_model.read_bytes())
    pieces = vocabulary.piece_count
    assert vocabulary.specials == SpecialIds(pad=pieces, unk=0, bos=1, eos=2)  # sentencepiece's: unk 0, bos 1, eos 2
    assert len(vocabulary) == pieces + 1
    names = vocabulary.piece_names()
    assert names[:3] == ["<unk>", "<s>", "</s>"] and names[-1] == "<pad>" and len(names) == len(vocabulary)
    ids = vocabulary.to_ids(["A man is riding a red bicycle."])[0]
    assert max(ids) < pieces
    # The added id never reaches sentencepiece, which would fail on it.
    assert vocabulary.to_text([ids + [pieces]]) == vocabulary.to_text([ids]) == ["A man is riding a red bicycle."]


def test_custom_layout_maps_control_pieces_only(tmp_path):
    """A user-defined piece `<s>` looks like bos but is text: bos is added; the control `<pad>`
    and the chosen eos and unk are used where they are."""
    path = train_sentencepiece(tmp_path / "custom.model", pad_id=3, unk_id=2, eos_id=0, bos_id=-1,
                               user_defined_symbols=["<s>"], control_symbols=["<mask>"])
    vocabulary = Vocabulary(path.read_bytes())
    pieces = vocabulary.piece_count
    assert vocabulary.specials == SpecialIds(pad=3, unk=2, bos=pieces, eos=0)
    assert vocabulary.piece_names()[pieces] == "<s_>"  # `<s>` is the model's own piece
    user_piece = vocabulary.processor.piece_to_id("<s>")
    assert user_piece in vocabulary.to_ids(["<s> a dog"])[0] and user_piece != vocabulary.specials.bos
    assert not vocabulary.processor.is_control(user_piece)


def test_our_own_layout_adds_nothing():
    vocabulary = Vocabulary.train([f"A dog number {i} runs on the grass." for i in range(100)], vocab_size=60)
    assert vocabulary.specials == OUR_LAYOUT == SpecialIds(pad=0, unk=1, bos=2, eos=3)
    assert len(vocabulary) == vocabulary.piece_count and vocabulary.added == {}
    assert Vocabulary(vocabulary.model_bytes).specials == OUR_LAYOUT  # found again from the model alone


def test_recorded_mapping_is_checked_and_defaults_to_the_old_fixed_ids(default_spm_model):
    assert SpecialIds.from_dict(None) == SpecialIds(0, 1, 2, 3)  # checkpoints from before the record
    assert SpecialIds.from_dict({"pad": 9, "unk": 0, "bos": 1, "eos": 2}) == SpecialIds(9, 0, 1, 2)
    model = default_spm_model.read_bytes()
    with pytest.raises(TranslateError, match="pad=3: not a control or unknown piece"):
        Vocabulary(model, SpecialIds(pad=3, unk=0, bos=1, eos=2))  # piece 3 is an ordinary piece
    with pytest.raises(TranslateError, match="do not fit"):
        Vocabulary(model, SpecialIds(pad=10_000, unk=0, bos=1, eos=2))  # not right after the pieces


def test_vocabulary_round_trips_and_has_fixed_special_ids():
    sentences = [f"A man number {i} is riding a red bicycle down the street." for i in range(200)]
    vocabulary = Vocabulary.train(sentences, vocab_size=120)
    assert vocabulary.specials == OUR_LAYOUT and len(vocabulary) == vocabulary.piece_count  # nothing added
    assert (vocabulary.processor.pad_id(), vocabulary.processor.eos_id()) == (OUR_LAYOUT.pad, OUR_LAYOUT.eos)
    ids = vocabulary.to_ids(["A man is riding a bicycle."])
    assert vocabulary.to_text(ids) == ["A man is riding a bicycle."]
    assert Vocabulary(vocabulary.model_bytes).to_ids(["red street"]) == vocabulary.to_ids(["red street"])


def test_vocabulary_sample_is_seeded():
    need(TEXT)
    sentences = (TEXT / "newstest2012.en").read_text(encoding="utf-8").splitlines()
    first = Vocabulary.train(sentences, vocab_size=500, sample_size=1000)
    again = Vocabulary.train(sentences, vocab_size=500, sample_size=1000)
    other = Vocabulary.train(sentences, vocab_size=500, sample_size=1000, seed=2)
    assert first.model_bytes == again.model_bytes
    assert first.model_bytes != other.model_bytes  # the sample (of 1,000 of 3,003) is what changed


def test_reservoir_sample_is_uniform_and_seeded():
    from translate.data.vocabulary import reservoir_sample

    items = [str(i) for i in range(10000)]
    sample = reservoir_sample(items, 1000, seed=1)
    assert len(set(sample)) == 1000 and set(sample) <= set(items)
    assert sample == reservoir_sample(items, 1000, seed=1) != reservoir_sample(items, 1000, seed=2)
    assert reservoir_sample(items[:10], 1000, seed=1) == items[:10]
    # Uniform: over many seeds, each decile of the input is equally represented.
    counts = np.zeros(10)
    for seed in range(50):
        counts += np.bincount([int(x) // 1000 for x in reservoir_sample(items, 200, seed)], minlength=10)
    assert counts.min() > 0.8 * counts.mean() and counts.max() < 1.2 * counts.mean()
