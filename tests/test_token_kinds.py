"""The kinds of token text the calibration's lift rows key on."""

from __future__ import annotations

import numpy as np
import pytest

from suffixspec.native import calibration as cal
from suffixspec.token_kinds import KINDS, checked_kinds, kind_of_text, token_kinds


@pytest.mark.parametrize("text, kind", [
    ("\n", "newline"), ("  \n\n", "newline"), (")\n", "newline"), (" ", "space"),
    ("\t", "space"), (".", "punctuation"), (" ==", "punctuation"), ("`,", "punctuation"),
    (" print", "spaced word"), ("print", "word"), ("42", "digits"), (" 7", "digits"),
    ("_id", "mixed"), (" foo_bar", "mixed"), ("x1", "mixed"), ("", "space")])
def test_a_tokens_text_has_one_kind(text, kind):
    assert KINDS[kind_of_text(text)] == kind


def test_the_kinds_of_a_real_tokenizer(tokenizer_path):
    from suffixspec.fingerprint import load_hf_tokenizer

    qwen_tokenizer = load_hf_tokenizer(tokenizer_path)
    kinds = token_kinds(qwen_tokenizer)
    assert kinds.dtype == np.int8
    assert kinds.shape == (qwen_tokenizer.get_vocab_size(with_added_tokens=True),)
    assert kinds.min() >= 0 and kinds.max() < cal.N_KIND
    assert set(np.unique(kinds)) == set(range(cal.N_KIND))  # every kind occurs
    ids = qwen_tokenizer.encode("def f(x):\n    return x + 12", add_special_tokens=False).ids
    got = [KINDS[kinds[t]] for t in ids]
    want = [kind_of_text(qwen_tokenizer.decode([t])) for t in ids]
    assert [KINDS[w] for w in want] == got
    assert got[0] == "word" and "newline" in got and "digits" in got
    np.testing.assert_array_equal(checked_kinds(kinds), kinds)
