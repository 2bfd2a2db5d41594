"""Recorded requests: trace files and their tokenization.

A trace is JSON lines (optionally gzipped), one record per model call:
``{"id", "prompt", "output", ...}``; multi-turn records also carry
``"session"``, ``"turn"`` and ``"prompt_delta"``.  For those, the full prompt of
turn k is every earlier turn's ``prompt_delta + "<|assistant|>\\n" + output +
"\\n"`` followed by turn k's ``prompt_delta + "<|assistant|>\\n"``.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from suffixspec.fingerprint import hf_encoder  # noqa: F401 - the traces' encoder

ASSISTANT = "<|assistant|>\n"


@dataclass
class Request:
    """One recorded model call: prompt and output token ids (int32), and the
    conversation it continues (``session`` of a multi-turn record; None: a
    call on its own)."""

    req_id: str
    prompt: np.ndarray
    output: np.ndarray
    session: str | None = None
    #: The anchors of the whole prompt when ``prompt`` is only its end (``learn``).
    anchors: np.ndarray | None = None


def open_text(path: str | Path):
    path = Path(path)
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def read_records(path: str | Path, max_sessions: int | None = None,
                 max_records: int | None = None) -> Iterator[dict]:
    """Records of a trace in file order.

    ``max_sessions`` keeps the records of the first N sessions (records without
    a session count as their own); ``max_records`` stops after N records.
    """
    sessions: set = set()
    with open_text(path) as f:
        for n, line in enumerate(f):
            if max_records is not None and n >= max_records:
                return
            rec = json.loads(line)
            key = rec.get("session", ("record", n))
            if max_sessions is not None and key not in sessions:
                if len(sessions) >= max_sessions:
                    return
                sessions.add(key)
            yield rec


def prompt_texts(records: list[dict]) -> list[list[str]]:
    """The prompt of each record as pieces whose concatenation is the full prompt.

    Multi-turn records rebuild the conversation from ``prompt_delta``; the
    pieces are shared between turns so each is tokenized once.
    """
    history: dict = {}
    out = []
    for rec in records:
        if "prompt_delta" in rec and "session" in rec:
            past = history.setdefault(rec["session"], [])
            pieces = past + [rec["prompt_delta"] + ASSISTANT]
            # The output is its own piece: a chat template closes a message
            # with a special token, so the next prompt holds the generated
            # tokens exactly, not a re-tokenization across the boundary.
            past.extend([rec["prompt_delta"] + ASSISTANT, rec["output"], "\n"])
        else:
            pieces = [rec["prompt"]]
        out.append(pieces)
    return out


_CHUNK = 2048  # texts per tokenizer call: large enough to keep its threads busy


def load_trace(path: str | Path, encode_batch: Callable[[list[str]], list[list[int]]],
               max_sessions: int | None = None, max_records: int | None = None,
               progress: Callable[[int, int], None] | None = None) -> list[Request]:
    """Read and tokenize a trace into ``Request`` objects, in file order.

    ``progress(done, total)`` follows the tokenizing, in texts.
    """
    records = list(read_records(path, max_sessions, max_records))
    pieces = prompt_texts(records)
    # Tokenize every distinct text once; multi-turn prompts reuse pieces.
    texts: dict[str, int] = {}
    for rec, ps in zip(records, pieces):
        for p in ps:
            texts.setdefault(p, len(texts))
        texts.setdefault(rec["output"], len(texts))
    distinct = list(texts)
    arrays = []
    for at in range(0, len(distinct), _CHUNK):
        arrays.extend(np.asarray(x, np.int32) for x in encode_batch(distinct[at:at + _CHUNK]))
        if progress is not None:
            progress(len(arrays), len(distinct))
    out = []
    for n, (rec, ps) in enumerate(zip(records, pieces)):
        prompt = np.concatenate([arrays[texts[p]] for p in ps]) if ps else np.empty(0, np.int32)
        session = rec.get("session") if "prompt_delta" in rec else None
        out.append(Request(str(rec.get("id", n)), prompt, arrays[texts[rec["output"]]],
                           None if session is None else str(session)))
    return out


