"""Offline ingestion: build or extend a pool from request logs.

Formats (``auto`` picks by the first record, or ``text`` for non-JSON files):

* ``trace``: JSON lines with ``output`` (see ``../shared/data/README.md``);
  outputs are ingested, and with ``include_prompts`` also prompts (for
  multi-turn records, the new text of each turn, ``prompt_delta``).  Each
  output keeps the anchors a live commit gives it: those of its prompt
  (``prompt``, or a conversation rebuilt from ``prompt_delta`` as
  ``replay.traces`` does), so a request with the same prompt, or the same
  prompt start, finds it as it would a live output.
* ``openai-chat``: one chat-completion log per line, ``{"messages": [...],
  "response": {...}}`` or ``{"messages": [...], "choices": [...]}``; messages
  whose role is in ``roles`` are ingested (default: the assistant's).  Tool
  calls count as text: name and arguments.
* ``text``: each file is one document (a code repository, docs).
* ``export``: what ``suffixspec export`` writes; token ids, no tokenizer run.

A bad line is reported with file, line number and reason and skipped; with
``strict`` ingestion stops there.  Either way everything before it stays
committed: sequences are committed in batches, each one transaction.
"""

from __future__ import annotations

import gzip
import json
import time
import zlib
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from suffixspec.anchors import MAX_ANCHORS, anchor_count, start_anchors, start_anchors_of
from suffixspec.fingerprint import TokenizerId
from suffixspec.native.tokens import SYNTHETIC_BASE
from suffixspec.config import DEFAULT_NAMESPACE, check_namespace
from suffixspec.replay.traces import ASSISTANT
from suffixspec.pools.identity import StoredRecords
from suffixspec.pools.store import DiskFullError, PoolStore, TokenizerMismatchError
from suffixspec.tokens import as_token_ids

INT32_MAX = (1 << 31) - 1

FORMATS = ("auto", "trace", "openai-chat", "text", "export")
EXPORT_HEADER = "suffixspec_export"
#: A line (or a text file) longer than this is refused like any bad record, read
#: past without being held: memory stays bounded whatever a log holds.
MAX_LINE_BYTES = 8 << 20
#: Conversations whose text ingest keeps, to rebuild the prompts of their next
#: turns (the least recently continued one goes first).
CONVERSATIONS = 4096
#: Tokenized prompt pieces kept (a conversation's turns share them).
PIECES = 1 << 15
#: Text tokenized in one call at most (characters): the tokenizer's working
#: memory grows with its batch.
TOKENIZE_BYTES = 1 << 20
#: Prompt tokens a held-back request keeps (its newest), so memory and the
#: time to serve it stay bounded however long a conversation grows.
HELD_PROMPT_TOKENS = 1 << 14


class BadRecord(ValueError):
    """A record that cannot be ingested; the message says why."""


class StopIngest(Exception):  # noqa: N818 - control flow, not an error
    """``strict`` ingestion met a bad record."""


@dataclass(frozen=True)
class Held:
    """A held-back logged request, for ``learn`` to serve: the newest
    ``HELD_PROMPT_TOKENS`` of its prompt, the anchors of the whole prompt, its
    output (int32 arrays), its namespace and its record's id."""

    prompt: np.ndarray
    anchors: np.ndarray
    output: np.ndarray
    namespace: str
    request_id: str

    @property
    def stored(self) -> np.ndarray:
        """The tokens a commit of it stores."""
        return np.concatenate([self.anchors, self.output])


def _tail(parts: list[np.ndarray], n: int) -> np.ndarray:
    """The last ``n`` tokens of ``parts`` laid end to end."""
    out, need = [], n
    for part in reversed(parts):
        if need <= 0:
            break
        out.append(part[-need:])
        need -= min(need, part.shape[0])
    return np.concatenate(out[::-1]) if out else np.empty(0, np.int32)


@dataclass
class IngestReport:
    files: int = 0
    lines: int = 0
    sequences: int = 0
    tokens: int = 0
    skipped: int = 0
    duplicates: int = 0  # records the pool held already (a re-run, a copy)
    problems: list[str] = field(default_factory=list)
    tokenize_s: float = 0.0
    store_s: float = 0.0
    stopped: str | None = None
    # The last ``hold_back`` outputs with a prompt, not committed, for ``learn`` to serve.
    held: list[Held] = field(default_factory=list)

    def summary(self) -> dict:
        return {"files": self.files, "lines": self.lines, "sequences": self.sequences,
                "tokens": self.tokens, "skipped": self.skipped, "duplicates": self.duplicates,
                "tokenize_s": round(self.tokenize_s, 3), "store_s": round(self.store_s, 3),
                **({"stopped": self.stopped} if self.stopped else {})}


# ------------------------------------------------------------------- parsing
def _open_binary(path: Path):
    """The file's bytes, unzipped when it is gzip (by its first bytes, not its name)."""
    with open(path, "rb") as f:
        gzipped = f.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gzipped else open(path, "rb")


class _TooLong:
    """A line past ``MAX_LINE_BYTES``, skipped."""


def _lines(f):
    """The lines of a binary file, each at most ``MAX_LINE_BYTES`` long; a longer
    one comes as ``_TooLong`` once it was read past, a chunk at a time.  A UTF-8
    byte order mark before the first line is not part of it."""
    first = True
    while True:
        raw = f.readline(MAX_LINE_BYTES + 1)
        if first and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        first = False
        if not raw:
            return
        if len(raw) <= MAX_LINE_BYTES or raw.endswith(b"\n"):
            yield raw
            continue
        while raw and not raw.endswith(b"\n"):
            raw = f.readline(1 << 20)
        yield _TooLong()


# A file that cannot be read on: gzip cut short or damaged, or a read error.
_READ_ERRORS = (EOFError, OSError, zlib.error)


def _text(value, what: str) -> str:
    if not isinstance(value, str):
        raise BadRecord(f"{what} is {type(value).__name__}, not a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise BadRecord(f"{what} is not valid text ({e.reason} at character {e.start})"
                        ) from None
    return value


def _message_text(message) -> str:
    if not isinstance(message, dict):
        raise BadRecord(f"message is {type(message).__name__}, not an object")
    parts = []
    content = message.get("content")
    if isinstance(content, str):
        parts.append(_text(content, "message content"))
    elif isinstance(content, list):
        parts.extend(_text(p.get("text", ""), "message content")
                     for p in content if isinstance(p, dict))
    elif content is not None:
        raise BadRecord(f"message content is {type(content).__name__}")
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise BadRecord(f"tool_calls is {type(calls).__name__}, not a list")
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict):
            raise BadRecord("a tool call has no 'function' object")
        parts.append(f"{_text(fn.get('name', ''), 'tool name')}"
                     f"({_text(_arguments(fn.get('arguments', '')), 'tool arguments')})")
    return "\n".join(p for p in parts if p)


def _arguments(value) -> str:
    """Tool-call arguments as text (some logs store them as an object)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def parse_trace(rec: dict, include_prompts: bool) -> list[tuple[str, bool]]:
    """``(text, is_output)`` pairs of a trace record."""
    if "output" not in rec:
        raise BadRecord("no 'output' field")
    texts = [(_text(rec["output"], "'output'"), True)]
    if include_prompts:
        key = "prompt_delta" if "prompt_delta" in rec else "prompt"
        if key in rec:
            texts.insert(0, (_text(rec[key], f"'{key}'"), False))
    return texts


class Conversations:
    """The prompt of each trace record as pieces (``replay.traces.prompt_texts``),
    for the anchors of its output; multi-turn records continue their
    conversation, of which the last ``CONVERSATIONS`` are kept."""

    def __init__(self):
        self.history: dict[str, list[str]] = {}

    def prompt(self, rec: dict) -> list[str] | None:
        if "prompt_delta" in rec and "session" in rec:
            key = str(rec["session"])
            past = self.history.pop(key, [])
            delta = _text(rec["prompt_delta"], "'prompt_delta'") + ASSISTANT
            pieces = past + [delta]
            self.history[key] = past + [delta, _text(rec["output"], "'output'"), "\n"]
            if len(self.history) > CONVERSATIONS:
                del self.history[next(iter(self.history))]
            return pieces
        if "prompt" in rec:
            return [_text(rec["prompt"], "'prompt'")]
        return None


def parse_openai_chat(rec: dict, roles: tuple[str, ...]) -> list[tuple[str, bool]]:
    """``(text, is_output)`` pairs of a chat record; assistant messages are outputs."""
    messages = rec.get("messages")
    if not isinstance(messages, list):
        raise BadRecord("no 'messages' list")
    chosen = [m for m in messages if isinstance(m, dict) and m.get("role") in roles]
    response = rec.get("response")
    if isinstance(response, dict) and "choices" in response:
        response = response["choices"]
    if response is None:
        response = rec.get("choices")
    if isinstance(response, list):
        response = [c.get("message") if isinstance(c, dict) and "message" in c else c
                    for c in response]
    elif response is not None:
        response = [response]
    for m in response or []:
        if isinstance(m, str):
            m = {"role": "assistant", "content": m}
        if isinstance(m, dict) and m.get("role", "assistant") in roles:
            chosen.append(m)
    return [(_message_text(m), m.get("role", "assistant") == "assistant") for m in chosen]


def sniff(path: Path) -> str:
    """The format of a file, from its first record."""
    try:
        with _open_binary(path) as f:
            for raw in _lines(f):
                if isinstance(raw, _TooLong):
                    return "text"
                if raw.strip():
                    rec = json.loads(raw)
                    break
            else:
                return "text"
    except (ValueError, UnicodeDecodeError, OSError, EOFError):
        return "text"
    if not isinstance(rec, dict):
        return "text"
    if EXPORT_HEADER in rec:
        return "export"
    if "messages" in rec:
        return "openai-chat"
    if "output" in rec:
        return "trace"
    return "text"


def records(path: Path, fmt: str, roles: tuple[str, ...], include_prompts: bool
            ) -> Iterator[tuple[int, list[str] | np.ndarray | BadRecord, dict]]:
    """``(line number, texts or token ids or BadRecord, stored fields)`` per record.

    Texts are ``(text, is_output)`` pairs; token ids of exported records carry
    their anchors.  Stored fields (namespace, source, request id) come with
    exported records; a trace record's fields hold its prompt's pieces
    (``"prompt"``), for its output's anchors.
    """
    conversations = Conversations()
    header = None  # an export's first header
    if fmt == "text":
        try:
            with _open_binary(path) as f:
                text = f.read(MAX_LINE_BYTES + 1)
            if len(text) > MAX_LINE_BYTES:
                yield 1, BadRecord(f"a text file over {MAX_LINE_BYTES} bytes"), {}
                return
            yield 1, [(text.decode("utf-8"), False)], {}
        except UnicodeDecodeError as e:
            yield 1, BadRecord(f"not UTF-8 text ({e.reason} at byte {e.start})"), {}
        return
    n = 0
    with _open_binary(path) as f:
        lines = enumerate(_lines(f), 1)
        while True:
            try:
                n, raw = next(lines)
            except StopIteration:
                return
            except _READ_ERRORS as e:
                yield n + 1, BadRecord(f"the file cannot be read on: it is cut short or "
                                       f"damaged ({e})"), {}
                return
            if isinstance(raw, _TooLong):
                yield n, BadRecord(f"line longer than {MAX_LINE_BYTES} bytes"), {}
                continue
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw.decode("utf-8"))
                if not isinstance(rec, dict):
                    raise BadRecord(f"record is {type(rec).__name__}, not an object")
                if fmt == "export":
                    if EXPORT_HEADER in rec:
                        if header is None:
                            header = rec
                        elif _pool_of(rec) != _pool_of(header):  # concatenated exports
                            yield n, BadRecord(
                                f"a second export header, of a pool with tokenizer "
                                f"{rec.get('tokenizer')} ({rec.get('fingerprint')}) where the "
                                f"first named {header.get('tokenizer')} "
                                f"({header.get('fingerprint')}): the lines after it are not "
                                f"ingested"), {}
                            return
                        continue
                    fields = {k: _text(str(rec[k]), f"'{k}'")
                              for k in ("source", "request_id") if rec.get(k)}
                    if rec.get("namespace"):
                        try:
                            fields["namespace"] = check_namespace(rec["namespace"])
                        except ValueError as e:
                            raise BadRecord(str(e)) from None
                    yield n, _export_tokens(rec), fields
                    continue
                texts = (parse_trace(rec, include_prompts) if fmt == "trace"
                         else parse_openai_chat(rec, roles))
                if not any(t for t, _ in texts):
                    raise BadRecord("nothing to ingest (empty output)")
                fields = {}
                if fmt == "trace":
                    fields["prompt"] = conversations.prompt(rec)
                if isinstance(rec.get("id"), str) and rec["id"]:
                    fields["id"] = _text(rec["id"], "'id'")
                yield n, [(t, out) for t, out in texts if t], fields
            except UnicodeDecodeError as e:
                yield n, BadRecord(f"not UTF-8 ({e.reason} at byte {e.start})"), {}
            except json.JSONDecodeError as e:
                yield n, BadRecord(f"invalid JSON ({e.msg} at column {e.colno})"), {}
            except BadRecord as e:
                yield n, e, {}
            except RecursionError:
                yield n, BadRecord("JSON nested too deeply"), {}
            except ValueError as e:  # e.g. an integer too long to convert
                yield n, BadRecord(f"unreadable JSON ({e})"), {}


def _export_tokens(rec: dict) -> np.ndarray:
    """An exported record's anchors and tokens, as stored."""
    try:
        tokens = as_token_ids(rec["token_ids"])
    except KeyError:
        raise BadRecord("no 'token_ids' field") from None
    except ValueError as e:
        raise BadRecord(str(e)) from None
    if tokens.shape[0] == 0:
        raise BadRecord("empty token_ids")
    anchors = rec.get("anchors", [])
    if (not isinstance(anchors, list) or len(anchors) > MAX_ANCHORS
            or not all(isinstance(a, int) and SYNTHETIC_BASE <= a <= INT32_MAX for a in anchors)):
        raise BadRecord(f"'anchors' must be a list of at most {MAX_ANCHORS} anchor ids "
                        f"in [{SYNTHETIC_BASE}, {INT32_MAX}]")
    return np.concatenate([np.asarray(anchors, np.int32), tokens])


def _pool_of(header: dict) -> tuple:
    """What an export header says of the pool its records' token ids belong to."""
    return header.get("fingerprint"), header.get("max_depth"), header.get("vocab_size")


def export_header(path: Path) -> dict:
    with _open_binary(path) as f:
        for raw in _lines(f):
            if isinstance(raw, _TooLong):
                break
            if raw.strip():
                rec = json.loads(raw)
                if isinstance(rec, dict) and EXPORT_HEADER in rec:
                    return rec
                break
    raise BadRecord(f"{path}: no export header line")


# ----------------------------------------------------------------- ingestion
def ingest(store: PoolStore, files: list[str | Path], encode_batch: Callable | None,
           namespace: str | None = None, fmt: str = "auto", roles: tuple[str, ...] = ("assistant",),
           include_prompts: bool = False, strict: bool = False, progress: Callable | None = None,
           batch_tokens: int = 1 << 20, warn: Callable[[str], None] | None = None,
           hold_back: int = 0, keep_held: Callable[[list[Held]], None] | None = None
           ) -> IngestReport:
    """Ingest ``files`` into ``store``; returns the counts.

    ``encode_batch`` turns a list of texts into token id lists (None only for
    the ``export`` format).  Sequences go to ``namespace``; without one, exported
    records keep the namespace the file names and the rest go to ``DEFAULT_NAMESPACE``.
    ``progress(tokens)`` is called after each commit,
    ``warn(message)`` for each bad record.  The last ``hold_back`` outputs
    whose record names a prompt are not committed but returned in
    ``report.held`` (``learn`` serves them, which commits them);
    ``keep_held(held)`` is called with them before the last batch is
    committed, so they are kept somewhere durable before ingestion ends.

    A record the pool holds already (same namespace, record id and tokens:
    ``pools.identity``) is not added again, so ingesting a log again, after a
    run was killed or to the end, adds only what is missing.  A record's id
    is its ``id`` (trace), its exported request id or source, else
    ``file:line``; a record's second output onwards adds ``#k``.
    """
    if namespace is not None:
        check_namespace(namespace)
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
    report = IngestReport()
    present: StoredRecords | None = None  # the records the pool held when ingestion began
    pending: list[tuple] = []  # (tokens, namespace, source, request_id)
    # (text, source, record id, is_output, prompt pieces or None) to tokenize
    texts: list[tuple[str, str, str, bool, list[str] | None]] = []
    pieces: dict[str, np.ndarray] = {}  # tokenized prompt pieces, oldest first
    held: deque = deque()  # Held, newest last
    pending_tokens = 0
    text_bytes = 0  # of the texts and new prompt pieces waiting to be tokenized

    def known() -> StoredRecords:
        nonlocal present
        if present is None:
            present = StoredRecords(store)
        return present

    def stored(ns: str, record_id: str, tokens: np.ndarray) -> bool:
        """Whether the pool holds this record already (then it counts once less)."""
        if known().take(ns, record_id, tokens):
            report.duplicates += 1
            return True
        return False

    def problem(message: str):
        report.skipped += 1
        if len(report.problems) < 1000:
            report.problems.append(message)
        if warn is not None:
            warn(message)
        if strict:
            raise StopIngest(message)

    def tokenize():
        nonlocal pending_tokens, text_bytes
        text_bytes = 0
        if not texts:
            return
        t0 = time.perf_counter()
        # Prompts repeat (a database's schema, a task's statement, a function
        # list) and an output's prompt is also a prompt text: each distinct
        # prompt is tokenized once and kept among the pieces.
        outputs = [t for t, _, _, is_output, _ in texts if is_output]
        wanted = dict.fromkeys(t for t, _, _, is_output, _ in texts if not is_output)
        wanted.update(dict.fromkeys(p for *_, prompt in texts for p in prompt or ()))
        new = [p for p in wanted if p not in pieces]
        ids = encode_batch(outputs + new)
        for p, tok in zip(new, ids[len(outputs):]):
            pieces[p] = np.asarray(tok, np.int32)
        report.tokenize_s += time.perf_counter() - t0
        ns = namespace or DEFAULT_NAMESPACE
        output_ids = iter(ids[:len(outputs)])
        for text, source, record_id, is_output, prompt in texts:
            arr = np.asarray(next(output_ids), np.int32) if is_output else pieces[text]
            if is_output:
                # The anchors of the prompt the log names (the engine's own
                # prompt when the log holds what the engine saw); without
                # one, the global output-start anchor.
                parts = None if prompt is None else [pieces[p] for p in prompt]
                anchors = start_anchors(None) if parts is None else start_anchors_of(parts)
                arr = np.concatenate([anchors, arr])
                if stored(ns, record_id, arr):
                    continue
                if parts is not None and hold_back > 0:
                    held.append(Held(_tail(parts, HELD_PROMPT_TOKENS), anchors,
                                     arr[anchors.shape[0]:], ns, record_id))
                    if len(held) <= hold_back:
                        continue
                    h = held.popleft()
                    arr, record_id = h.stored, h.request_id
            elif stored(ns, record_id, arr):
                continue
            pending.append((arr, ns, source, record_id))
            pending_tokens += arr.shape[0] - anchor_count(arr)
        texts.clear()
        while len(pieces) > PIECES:
            del pieces[next(iter(pieces))]

    def commit():
        nonlocal pending_tokens
        tokenize()
        if not pending:
            return
        t0 = time.perf_counter()
        try:  # checked again in the commit: another ingest may have stored some since
            added = known().add_missing(store, pending)
        except DiskFullError as e:
            raise DiskFullError(f"{e}; committed before this batch: {report.sequences} "
                                f"sequences, {report.tokens} tokens") from e
        report.store_s += time.perf_counter() - t0
        report.duplicates += len(pending) - len(added)
        report.sequences += len(added)
        report.tokens += sum(item[0].shape[0] - anchor_count(item[0]) for item in added)
        if progress is not None:
            progress(pending_tokens)
        pending.clear()
        pending_tokens = 0

    try:
        for file in map(Path, files):
            report.files += 1
            kind = sniff(file) if fmt == "auto" else fmt
            if kind == "export":
                _check_export_header(file, store)
            elif encode_batch is None:
                raise ValueError(f"{file}: ingesting {kind} needs a tokenizer")
            for line, item, fields in records(file, kind, roles, include_prompts):
                report.lines += 1
                if isinstance(item, BadRecord):
                    commit()  # everything before a bad line is committed first
                    problem(f"{file}:{line}: {item}")
                    continue
                source = f"{file.name}:{line}"
                if isinstance(item, np.ndarray):
                    vocab = store.vocab_size
                    if vocab is not None and item[anchor_count(item):].max() >= vocab:
                        commit()
                        problem(f"{file}:{line}: token id "
                                f"{int(item[anchor_count(item):].max())} is outside the "
                                f"pool's vocabulary of {vocab}")
                        continue
                    ns = namespace or fields.get("namespace", DEFAULT_NAMESPACE)
                    rid = fields.get("request_id", "")
                    if stored(ns, rid or fields.get("source", source), item):
                        continue  # ingesting an export again adds nothing
                    pending.append((item, ns, fields.get("source", source), rid))
                    pending_tokens += item.shape[0] - anchor_count(item)
                else:
                    prompt = fields.get("prompt")
                    base = fields.get("id", source)
                    texts.extend((t, source, base if k == 0 else f"{base}#{k}", is_output,
                                  prompt if is_output else None)
                                 for k, (t, is_output) in enumerate(item))
                    text_bytes += sum(len(t) for t, _ in item) + sum(
                        len(p) for p in prompt or () if p not in pieces)
                    if len(texts) >= 512 or text_bytes >= TOKENIZE_BYTES:
                        tokenize()
                if pending_tokens >= batch_tokens:
                    commit()
        tokenize()
        if held and keep_held is not None:
            keep_held(list(held))  # durable before the last batch lands
        commit()
    except StopIngest as e:
        report.stopped = str(e)
    report.held = list(held)
    return report


def export_tokenizer(files) -> tuple[TokenizerId, int] | None:
    """The tokenizer and max_depth the export ``files`` name, if they are all
    exports from pools of one tokenizer; else None."""
    found = set()
    for file in map(Path, files):
        try:
            if sniff(file) != "export":
                return None
            h = export_header(file)
        except (OSError, ValueError):
            return None
        found.add((h.get("tokenizer"), h.get("fingerprint"), h.get("vocab_size"),
                   h.get("max_depth")))
    if len(found) != 1:
        return None
    name, fingerprint, vocab, depth = found.pop()
    if not (isinstance(name, str) and isinstance(fingerprint, str) and isinstance(depth, int)):
        return None
    return TokenizerId(name, fingerprint, vocab if isinstance(vocab, int) else None), depth


def _check_export_header(file: Path, store: PoolStore) -> None:
    header = export_header(file)
    if header.get("fingerprint") != store.info["fingerprint"]:
        raise TokenizerMismatchError(
            f"{file} was exported from a pool with tokenizer {header.get('tokenizer')} "
            f"({header.get('fingerprint')}); this pool uses {store.tokenizer}")


def export(store: PoolStore, out, namespace: str | None = None,
           damaged: list | None = None) -> int:
    """Write the pool's sequences as JSON lines (ingestable); returns how many.
    ``damaged``: where the ids of damaged records go (they are left out);
    without it the first one raises ``CorruptPoolError``."""
    info = store.info
    out.write(json.dumps({EXPORT_HEADER: 1, "tokenizer": info["tokenizer"],
                          "fingerprint": info["fingerprint"], "max_depth": info["max_depth"],
                          "vocab_size": store.vocab_size})
              + "\n")
    n = 0
    for seq in store.sequences(namespace=namespace, damaged=damaged):
        out.write(json.dumps({"namespace": seq.namespace, "source": seq.source,
                              "request_id": seq.request_id, "added": seq.added,
                              "anchors": seq.tokens[:seq.anchors].tolist(),
                              "token_ids": seq.output.tolist()}) + "\n")
        n += 1
    return n
