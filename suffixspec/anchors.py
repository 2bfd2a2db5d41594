"""Output-start anchors: synthetic tokens that let a trie match where outputs begin.

Every output in a cross-request pool is indexed as ``[prompt key, prompt-start
key, BOS, output...]``.  A request at output position i queries with ``[its
prompt key, its prompt-start key, BOS, output[:i]]``, so the suffix trie finds
past outputs of the same prompt, of prompts with the same start (the same
system prompt, schema or tool list), or any output start (BOS alone): the
anchors are substrings of every indexed sequence like any others.

Anchor ids lie from ``SYNTHETIC_BASE`` (2**30) up, above every vocabulary id
(the public API refuses ids there), and the kernels never draft one.
"""

from __future__ import annotations

import zlib

import numpy as np

from suffixspec.native.tokens import SYNTHETIC_BASE

BOS = SYNTHETIC_BASE
MAX_ANCHORS = 3
PROMPT_START_TOKENS = 64
_HALF = 1 << 29


def start_anchors(prompt: np.ndarray | None) -> np.ndarray:
    """The anchors of an output of ``prompt`` (int32 tokens), or just BOS without one."""
    if prompt is None:
        return np.array([BOS], np.int32)
    return start_anchors_of([prompt])


def start_anchors_of(pieces: list[np.ndarray]) -> np.ndarray:
    """``start_anchors`` of the prompt ``pieces`` make end to end (int32 arrays),
    without laying them together: a long conversation's prompt costs no copy."""
    whole = 0
    head = []
    need = PROMPT_START_TOKENS
    for piece in pieces:
        whole = zlib.crc32(np.ascontiguousarray(piece, np.int32).tobytes(), whole)
        if need > 0:
            head.append(piece[:need])
            need -= min(need, piece.shape[0])
    start = zlib.crc32(np.concatenate(head or [np.empty(0, np.int32)]).astype(np.int32)
                       .tobytes()) % (_HALF - 1)
    return np.array([SYNTHETIC_BASE + _HALF + whole % _HALF, SYNTHETIC_BASE + 1 + start, BOS],
                    np.int32)


def anchor_count(tokens: np.ndarray) -> int:
    """How many leading tokens of a stored sequence are anchors."""
    n = 0
    while n < tokens.shape[0] and tokens[n] >= SYNTHETIC_BASE:
        n += 1
    return n
