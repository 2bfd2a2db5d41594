"""The kind of each token's text, read off a tokenizer.

The calibration's lift rows (``native.calibration``) learn how much more or
less often a token of each kind is accepted than its bucket says: after the
same match and counts, a newline or a bracket is more often what follows
than a word is.  Kinds, in ``KINDS``' order: a token holding a newline,
spaces only, punctuation only, a word with its leading space, a word
without one, digits, anything else.
"""

from __future__ import annotations

import numpy as np

from suffixspec.native.calibration import N_KIND

KINDS = ("newline", "space", "punctuation", "spaced word", "word", "digits", "mixed")
assert len(KINDS) == N_KIND


def kind_of_text(text: str) -> int:
    """The index in ``KINDS`` of a token whose text is ``text``."""
    body = text[1:] if text.startswith(" ") else text
    stripped = text.strip()
    if "\n" in text:
        return 0
    if not stripped:
        return 1
    if not any(ch.isalnum() for ch in stripped):
        return 2
    if stripped.isdigit():
        return 5
    if body.isalpha():
        return 3 if text.startswith(" ") else 4
    return 6


def token_kinds(tokenizer) -> np.ndarray:
    """Per token id of ``tokenizer`` (a ``tokenizers.Tokenizer`` or anything
    with ``decode(ids)`` and ``len``), its kind: int8 ``[vocabulary]``."""
    size = (tokenizer.get_vocab_size(with_added_tokens=True)
            if hasattr(tokenizer, "get_vocab_size") else len(tokenizer))
    return np.fromiter((kind_of_text(tokenizer.decode([t])) for t in range(size)), np.int8,
                       count=size)


def checked_kinds(kinds) -> np.ndarray:
    """``kinds`` as the kernels take them (int8, one dimension), or
    ``ValueError`` with one line: a kind outside ``[-1, N_KIND)`` would send a
    kernel past its table."""
    raw = np.asarray(kinds)
    if raw.ndim != 1 or raw.shape[0] == 0 or raw.dtype.kind not in "iu":
        raise ValueError("token_kinds must be a non-empty vector of integers, one per token id")
    if raw.min() < -1 or raw.max() >= N_KIND:
        raise ValueError(f"token_kinds must hold kinds in [-1, {N_KIND})")
    return np.array(raw, dtype=np.int8, order="C")  # a writable copy: the type warmup compiled


__all__ = ["KINDS", "checked_kinds", "kind_of_text", "token_kinds"]
