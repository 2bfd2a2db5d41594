"""Which tokenizer produced a pool's token ids.

A pool stores the fingerprint of its tokenizer with a readable name, and
refuses token ids from any other.  The fingerprint hashes the whole
vocabulary: every token and id, added tokens special or not (with which they
are), and the vocabulary's size.  Pools made before it covered the added
tokens and the size keep their older fingerprint (``TokenizerId.legacy``):
a tokenizer with no added tokens beyond its special ones still opens them.
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
    #: The fingerprint pools made by earlier versions hold for this tokenizer,
    #: where it names it alone (None: it cannot tell it from others).
    legacy: str | None = field(default=None, compare=False)

    def matches(self, fingerprint: str) -> bool:
        """Whether a pool holding ``fingerprint`` was made with this tokenizer."""
        return fingerprint == self.fingerprint or (self.legacy is not None
                                                   and fingerprint == self.legacy)

    def __str__(self) -> str:
        return f"{self.name} ({self.fingerprint})"


#: The built-in workload's tokenizer: token id = UTF-8 byte value.
BYTES = TokenizerId("utf8-bytes", hashlib.sha256(b"utf8-bytes/256").hexdigest()[:16], 256)


def fingerprint_tokenizer(vocab: dict[str, int], added: list[tuple[str, int, bool]],
                          vocab_size: int) -> str:
    """Hash of a whole vocabulary: ``vocab`` (token -> id, added tokens too),
    the added tokens ``(content, id, special)`` and the vocabulary's size."""
    h = hashlib.sha256(b"suffixspec-tokenizer/2\n")
    for token, idx in sorted(vocab.items(), key=lambda kv: kv[1]):
        h.update(f"{idx}\t{token}\n".encode("utf-8", "surrogatepass"))
    h.update(b"--added--\n")
    for token, idx, special in sorted(added, key=lambda t: t[1]):
        h.update(f"{idx}\t{int(special)}\t{token}\n".encode("utf-8", "surrogatepass"))
    h.update(f"--size--\t{vocab_size}\n".encode())
    return h.hexdigest()[:16]


def fingerprint_vocab(vocab: dict[str, int], special: list[tuple[str, int]]) -> str:
    """The earlier fingerprint: the base vocabulary (token -> id) and the special
    tokens only (``TokenizerId.legacy``)."""
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


def tokenizer_id(path: str | Path, tok=None) -> TokenizerId:
    """The id of a Hugging Face ``tokenizer.json`` (the file or its folder);
    ``tok``: the ``tokenizers.Tokenizer`` already loaded from it."""
    path = Path(path)
    file = path / "tokenizer.json" if path.is_dir() else path
    tok = load_hf_tokenizer(path) if tok is None else tok
    added = [(t.content, i, bool(t.special)) for i, t in tok.get_added_tokens_decoder().items()]
    special = [(content, i) for content, i, is_special in added if is_special]
    name = file.parent.name or file.stem
    config = file.parent / "tokenizer_config.json"
    if config.is_file():
        try:
            name = json.loads(config.read_text()).get("name_or_path") or name
        except (ValueError, OSError):
            pass
    size = tok.get_vocab_size(with_added_tokens=True)
    plain = any(not is_special for _, _, is_special in added)
    return TokenizerId(name,
                       fingerprint_tokenizer(tok.get_vocab(with_added_tokens=True), added, size),
                       size, None if plain else fingerprint_vocab(
                           tok.get_vocab(with_added_tokens=False), special))


def id_and_encoder(path: str | Path) -> tuple[TokenizerId, object]:
    """``(tokenizer_id, hf_encoder)`` of a ``tokenizer.json``, read once (a
    second's work)."""
    tok = load_hf_tokenizer(path)
    return tokenizer_id(path, tok), hf_encoder(path, tok)


def hf_encoder(path: str | Path, tok=None):
    """Batch encoder of a Hugging Face ``tokenizer.json`` (file or its folder;
    ``tok``: the ``tokenizers.Tokenizer`` already loaded from it): a list of
    texts to their token id lists, no special tokens added.  The library
    encodes a batch on every core."""
    tok = load_hf_tokenizer(path) if tok is None else tok
    # The same ids without the character offsets (tokenizers >= 0.20), which cost time.
    batch = getattr(tok, "encode_batch_fast", tok.encode_batch)

    def encode(texts: list[str]) -> list[list[int]]:
        return [e.ids for e in batch(texts, add_special_tokens=False)]

    return encode
