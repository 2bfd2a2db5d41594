"""Which tokenizer produced a pool's token ids.

A pool stores the fingerprint of its tokenizer (a hash of the vocabulary and
the special tokens) with a readable name, and refuses token ids from any other.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class TokenizerId:
    name: str
    fingerprint: str
    vocab_size: int | None = field(default=None, compare=False)  # ids lie below it

    def __str__(self) -> str:
        return f"{self.name} ({self.fingerprint})"


#: The built-in workload's tokenizer: token id = UTF-8 byte value.
BYTES = TokenizerId("utf8-bytes", hashlib.sha256(b"utf8-bytes/256").hexdigest()[:16], 256)


def fingerprint_vocab(vocab: dict[str, int], special: list[tuple[str, int]]) -> str:
    """Hash of a vocabulary (token -> id) and its special tokens."""
    h = hashlib.sha256()
    for token, idx in sorted(vocab.items(), key=lambda kv: kv[1]):
        h.update(f"{idx}\t{token}\n".encode("utf-8", "surrogatepass"))
    h.update(b"--special--\n")
    for token, idx in sorted(special, key=lambda kv: kv[1]):
        h.update(f"{idx}\t{token}\n".encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:16]


def load_hf_tokenizer(path: str | Path):
    """The ``tokenizers.Tokenizer`` in ``tokenizer.json`` (the file or its folder).

    Raises ``ValueError`` with one clear line when there is none or it is not one.
    """
    from tokenizers import Tokenizer

    path = Path(path)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise ValueError(f"no tokenizer.json at {path}")
    try:
        return Tokenizer.from_file(str(file))
    except Exception as e:  # the tokenizers library raises plain Exception
        raise ValueError(f"{file} is not a Hugging Face tokenizer.json ({e})") from None


def tokenizer_id(path: str | Path) -> TokenizerId:
    """The id of a Hugging Face ``tokenizer.json`` (the file or its folder)."""
    path = Path(path)
    file = path / "tokenizer.json" if path.is_dir() else path
    tok = load_hf_tokenizer(path)
    special = [(t.content, i) for i, t in tok.get_added_tokens_decoder().items() if t.special]
    name = file.parent.name or file.stem
    config = file.parent / "tokenizer_config.json"
    if config.is_file():
        try:
            name = json.loads(config.read_text()).get("name_or_path") or name
        except (ValueError, OSError):
            pass
    return TokenizerId(name, fingerprint_vocab(tok.get_vocab(with_added_tokens=False), special),
                       tok.get_vocab_size(with_added_tokens=True))
