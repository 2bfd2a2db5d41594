"""The pool's recent outputs on the device, and the pool's one-token paths.

Windows (``native.windows``) are built from the context one step before the
device drafts from them.  When the engine's bonus token leaves every window
(the last draft was rejected somewhere no branch window covers), the host
policy would match a shorter suffix of the new context somewhere else in the
pool; device-resident tiers stand in for that, with no host work in the
step:

* ``DeviceCorpus``: the pool's newest outputs in a ring of tokens, indexed
  by their last 2 and last 4 tokens (``native.vllm_suffix``'s layout: each
  bucket keeps the newest occurrence in each of its last ``SLOTS``
  documents).  A lookup extends every candidate to its longest suffix match
  and lets the candidates vote token by token; each drafted token carries
  its votes ``(c, n)``, which calibration scores like a trie's counts.
* ``LiveCorpus``: the same index over the open outputs of the other
  requests in flight, read in place from the device's history rows; its
  draft is a candidate of its own, scored in calibration rows of its own
  (``calibration.SRC_LIVE``).
* ``OneTokenPaths``: per token id, the pool's most frequent continuation of
  that single token with its counts (``SuffixProposer.one_token_paths``),
  compiled by the host now and then.

All are torch ops on any device (``native.vllm_suffix.corpus_draft`` is the
corpus's Numba twin, which replay uses; the tests hold them equal, and the
live corpus to a brute-force reference).
"""

from __future__ import annotations

import numpy as np
import torch

from suffixspec.device.draft_ref import context_tail
from suffixspec.native.vllm_suffix import (HASH_MUL, PROMPT_CONTEXT, SLOTS, buckets_for,
                                           corpus_draft, family_match, local_match)

__all__ = ["DeviceCorpus", "LiveCorpus", "OneTokenPaths", "PROMPT_CONTEXT", "corpus_on_host",
           "scan_on_host", "vote_over"]

_KEYS = (4, 2)  # key lengths of table 0 and table 1


def _bucket(hv: torch.Tensor, buckets: int) -> torch.Tensor:
    return ((hv >> 29) ^ hv) & (buckets - 1)


def _hashes(tokens: torch.Tensor, at: torch.Tensor, start: torch.Tensor | int, buckets: int):
    """Buckets of the 2 and 4 tokens before each position ``at`` of ``tokens``
    (a row per batch entry, or one row), newest first; tokens before ``start``
    count as 0."""
    hv = torch.zeros_like(at)
    out = {}
    for d in range(4):
        src = at - 1 - d
        t = torch.where(src >= start, tokens.gather(-1, src.clamp(min=0)), 0).to(torch.int64)
        hv = (hv ^ t) * HASH_MUL
        if d + 1 in _KEYS:
            out[d + 1] = _bucket(hv, buckets)
    return out[4], out[2]


class DeviceCorpus:
    """A ring of ``capacity`` tokens of finished outputs (documents separated
    by -1) and its two hash tables, on ``device``.  ``head`` and ``docs`` are
    host ints: documents come from the host, so the ring's bookkeeping needs
    no read back."""

    def __init__(self, capacity: int, device="cpu"):
        self.capacity = int(capacity)
        self.buckets = buckets_for(self.capacity)
        # One more token: the trash position of ``put``'s unused entries.
        self.tokens = torch.full((self.capacity + 1,), -1, dtype=torch.int32, device=device)
        self.table = torch.full((2, self.buckets, SLOTS), -1, dtype=torch.int64, device=device)
        self.head = 0
        self.docs = 0

    def ingest(self, doc: torch.Tensor) -> None:
        """Append one document (int32 tokens on the device; the newest
        ``capacity - 1`` of them) and index it (``vllm_suffix.ingest``)."""
        cap = self.capacity
        n = min(int(doc.shape[0]), cap - 1)
        doc = doc[doc.shape[0] - n:]
        if self.head + n + 1 > cap:
            self.head = 0
        head, slot = self.head, self.docs % SLOTS
        self.tokens[head:head + n] = doc
        self.tokens[head + n] = -1
        if n:
            j = torch.arange(n, device=doc.device)
            val = (self.docs << 32) | (head + j)
            b4, b2 = _hashes(doc, j, 0, self.buckets)
            for t, (b, key) in enumerate(((b4, 4), (b2, 2))):
                flat = self.table[t].view(-1)
                flat.scatter_reduce_(0, b * SLOTS + slot, torch.where(j >= key, val, -1),
                                     reduce="amax")
        self.head = head + n + 1
        self.docs += 1

    def put(self, pos, tok, b4, b2, seq, keys) -> None:
        """Documents packed on the host (``payload.Packer.put_doc``): each token's
        ring position (``capacity``: unused), token, buckets, document number
        and which keys index it (bit 0: 4 tokens, bit 1: 2 tokens); fixed
        shapes, no read back."""
        pos = pos.to(torch.int64)
        self.tokens[pos] = tok.to(torch.int32)
        val = (seq.to(torch.int64) << 32) | pos
        slot = seq.to(torch.int64) % SLOTS
        for t, (b, bit) in enumerate(((b4, 1), (b2, 2))):
            flat = self.table[t].view(-1)
            index = b.to(torch.int64).clamp(0, self.buckets - 1) * SLOTS + slot
            flat.scatter_reduce_(0, index, torch.where((keys & bit) > 0, val, -1),
                                 reduce="amax")

    def draft(self, tail: torch.Tensor, depth: int, k: int):
        """The corpus's draft for each context, given by its last tokens ``tail``
        (``[B, >= max(depth, 4)]``, newest first, -2 before the context's start):
        ``(match length, tokens, c, n)`` (``[B]``, ``[B, k]`` x3), length 0
        when no candidate matches (``vllm_suffix.corpus_draft``)."""
        return vote_over(self.candidates(tail), tail, depth, k)

    def candidates(self, tail: torch.Tensor):
        """``(vals, ident, read)`` of the contexts whose last tokens are ``tail``
        (``vote_over``)."""
        tokens, table = self.tokens[:max(self.capacity, 1)], self.table
        cap = tokens.shape[0]
        b4, b2, _ = _tail_buckets(tail.to(torch.int64), table.shape[1])
        vals = torch.cat([table[0][b4], table[1][b2]], dim=1)                # [B, C]
        cpos = vals & 0xFFFFFFFF

        def read(offsets):
            at = cpos[:, :, None] + offsets
            inside = (at >= 0) & (at < cap)
            return torch.where(inside, tokens[at.clamp(0, max(cap - 1, 0))].to(torch.int64), -1)

        return vals, cpos, read


#: ``LiveCorpus`` values: ``stamp << 40 | slot << 24 | position``.
_STAMP_SHIFT, _SLOT_SHIFT = 40, 24
LIVE_STAMPS = 1 << 22  # index calls before the tables start afresh (the stamp's room)
LIVE_TOKENS = 1 << 18  # open-output tokens the live corpus's tables are sized for


class LiveCorpus:
    """The open outputs of the other requests in flight, read where they lie.

    ``DeviceCorpus`` holds finished outputs only; at many requests in flight
    a request's siblings (one database's questions, one tool list's calls)
    are mostly still running, and the host's pool drafts from their open
    outputs.  These hash tables index the device's own history rows (``hist``,
    ``[slots, max_len]``) as ``DeviceCorpus``'s index its ring, by the last 2
    and 4 tokens before each position, the entry of a bucket chosen by slot
    (``slot % SLOTS``), the newest write kept; ``index`` adds each batch
    row's new positions, ``draft`` drafts as the corpus does from the rows of
    every slot but the context's own (the own-history scan covers that).  A
    stale entry (its slot since taken by another request) names a position
    whose tokens are checked like any candidate's, and nothing at or past a
    row's end is read.  ``window``: positions a row may gain between two
    ``index`` calls (older unindexed ones are skipped).
    """

    def __init__(self, slots: int, window: int, buckets: int = buckets_for(LIVE_TOKENS),
                 device="cpu"):
        if slots >= 1 << (_STAMP_SHIFT - _SLOT_SHIFT):
            raise ValueError(f"the live corpus indexes fewer than "
                             f"{1 << (_STAMP_SHIFT - _SLOT_SHIFT)} slots, not {slots}")
        self.buckets = int(buckets)
        self.window = int(window)
        self.table = torch.full((2, self.buckets, SLOTS), -1, dtype=torch.int64, device=device)
        self.indexed = torch.zeros(slots, dtype=torch.int64, device=device)
        self.stamp = torch.zeros((), dtype=torch.int64, device=device)
        self.calls = 0  # host count of steps (``tick``) since the tables were new

    @staticmethod
    def fits(max_len: int) -> bool:
        """Whether rows of ``max_len`` tokens fit the entries' position field."""
        return max_len < 1 << _SLOT_SHIFT

    def grow(self, slots: int) -> None:
        """Room for ``slots`` slots (the ones there keep their state)."""
        more = slots - self.indexed.shape[0]
        if more > 0:
            self.indexed = torch.cat([self.indexed, self.indexed.new_zeros(more)])

    def start(self, slot: int, prompt_len: int) -> None:
        """A request took ``slot``: its output is indexed from its prompt's last token."""
        self.indexed[slot] = max(int(prompt_len) - 1, 0)

    def tick(self) -> None:
        """Once per step on the host, outside any recorded graph: the tables
        start afresh before the stamp outgrows its field."""
        self.calls += 1
        if self.calls >= LIVE_STAMPS:
            self.reset()

    def reset(self) -> None:
        """Index nothing (in place: recorded graphs hold these tensors)."""
        self.table.fill_(-1)
        self.stamp.zero_()
        self.calls = 0

    def index(self, hist: torch.Tensor, total_len: torch.Tensor, slots: torch.Tensor) -> None:
        """Index the positions rows ``slots`` gained since their last call (at
        most ``window`` of each): fixed shapes, no read back."""
        if not self.fits(hist.shape[1]):
            raise ValueError(f"the live corpus indexes rows of fewer than "
                             f"{1 << _SLOT_SHIFT} tokens")
        slots = slots.to(torch.int64)
        end = total_len[slots].to(torch.int64)
        at = end[:, None] - self.window + torch.arange(self.window, device=end.device)
        use = (at >= self.indexed[slots][:, None]) & (at >= 0)
        # The 4 tokens before each position (0 before the row's start), gathered alone.
        src = at[:, :, None] - 1 - torch.arange(4, device=at.device)          # [B, W, 4]
        before = hist[slots[:, None, None], src.clamp(0, hist.shape[1] - 1)].to(torch.int64)
        before = torch.where(src >= 0, before, 0)
        hv = torch.zeros_like(at)
        for d in range(4):
            hv = (hv ^ before[..., d]) * HASH_MUL
            if d == 1:
                b2 = _bucket(hv, self.buckets)
        b4 = _bucket(hv, self.buckets)
        val = (self.stamp << _STAMP_SHIFT) | (slots[:, None] << _SLOT_SHIFT) | at.clamp(min=0)
        entry = (slots % SLOTS)[:, None]
        for t, (b, key) in enumerate(((b4, 4), (b2, 2))):
            flat = self.table[t].view(-1)
            flat.scatter_reduce_(0, (b * SLOTS + entry).view(-1),
                                 torch.where(use & (at >= key), val, -1).view(-1),
                                 reduce="amax")
        self.indexed[slots] = torch.maximum(self.indexed[slots], end)
        self.stamp += 1

    def draft(self, hist: torch.Tensor, total_len: torch.Tensor, slots: torch.Tensor,
              tail: torch.Tensor, depth: int, k: int):
        """The draft from the other rows for the contexts of ``slots``, whose last
        tokens are ``tail`` (as ``DeviceCorpus.draft``): ``(match length,
        tokens, c, n)``."""
        return vote_over(self.candidates(hist, total_len, slots, tail), tail, depth, k)

    def index_and_draft(self, hist: torch.Tensor, total_len: torch.Tensor,
                        slots: torch.Tensor, depth: int, k: int):
        """Rows ``slots`` take their new tokens (``index``), then ``draft``s."""
        self.index(hist, total_len, slots)
        tail = context_tail(hist, total_len[slots].to(torch.int64), max(depth, 4), slots)
        return self.draft(hist, total_len, slots, tail, depth, k)

    def candidates(self, hist: torch.Tensor, total_len: torch.Tensor, slots: torch.Tensor,
                   tail: torch.Tensor):
        """``(vals, ident, read)`` from the other rows for the contexts of
        ``slots`` (``vote_over``)."""
        b4, b2, _ = _tail_buckets(tail.to(torch.int64), self.buckets)
        vals = torch.cat([self.table[0][b4], self.table[1][b2]], dim=1)      # [B, C]
        where = vals & ((1 << _STAMP_SHIFT) - 1)
        c_slot = (where >> _SLOT_SHIFT).clamp(max=hist.shape[0] - 1)
        c_pos = where & ((1 << _SLOT_SHIFT) - 1)
        own = slots.to(torch.int64)[:, None]
        vals = torch.where((vals >= 0) & (c_slot != own), vals, -1)
        ends = total_len.to(torch.int64)[c_slot]                             # [B, C]
        width = hist.shape[1]

        def read(offsets):
            at = c_pos[:, :, None] + offsets
            inside = (at >= 0) & (at < ends[:, :, None])
            got = hist[c_slot[:, :, None], at.clamp(0, width - 1)].to(torch.int64)
            return torch.where(inside, got, -1)

        return vals, where, read


def vote_over(part, tail: torch.Tensor, depth: int, k: int):
    """The draft of the candidates ``part`` (``(vals, ident, read)``: ``SLOTS``
    keyed by 4 tokens then ``SLOTS`` by 2) voting (``vote``): ``(match length,
    tokens, c, n)``."""
    tail = tail.to(torch.int64)
    if tail.shape[1] < max(depth, 4):
        raise ValueError(f"a corpus draft needs the last {max(depth, 4)} tokens")
    _, _, held = _tail_buckets(tail, 2)
    vals, ident, read = part
    return vote(vals, ident, read, tail[:, :depth], held, k)


def _tail_buckets(tail: torch.Tensor, buckets: int):
    """Buckets of each context's last 4 and last 2 tokens (``tail``, newest
    first; tokens before the context's start count as 0) and how many of its
    last 4 tokens the context holds."""
    hv = torch.zeros(tail.shape[0], dtype=torch.int64, device=tail.device)
    for d in range(4):
        hv = (hv ^ torch.where(tail[:, d] >= 0, tail[:, d], 0)) * HASH_MUL
        if d == 1:
            b2 = _bucket(hv, buckets)
    return _bucket(hv, buckets), b2, (tail[:, :4] >= 0).sum(dim=1)


def vote(vals, ident, read, tail, held, k: int):
    """The draft of the candidates ``vals`` (``[B, C]``, -1 none; the first
    ``SLOTS`` keyed by 4 tokens, the rest by 2; larger is newer) for contexts
    whose last tokens are ``tail`` (``[B, depth]``, newest first): each
    candidate's match is extended backwards as far as ``depth``, candidates
    naming one position (``ident``) count once, and for each distinct match
    length the candidates matching at least that long vote token by token
    (the most votes, then the newest); the chain of the best running product
    of vote shares drafts.  ``read(offsets)`` gives each candidate's tokens at
    those offsets from its position (``[B, C, len(offsets)]``, -1 where it
    has none).  ``(match length, tokens, c, n)`` as ``DeviceCorpus.draft``."""
    dev = vals.device
    b, c = vals.shape
    depth = tail.shape[1]
    cand = torch.arange(c, device=dev)
    key_len = torch.where(cand < SLOTS, 4, 2)
    d = torch.arange(depth, device=dev)
    same = (vals[:, :, None] >= 0) & (read(-1 - d) == tail[:, None, :])  # [B, C, D]
    c_len = same.to(torch.int64).cumprod(dim=2).sum(dim=2)               # [B, C]
    j = torch.arange(k, device=dev)
    cont = read(j)                                                       # [B, C, K]
    nxt = cont[..., 0]
    ok = (vals >= 0) & (nxt >= 0) & (c_len >= key_len) & (held[:, None] >= key_len)
    earlier = cand[:, None] < cand[None, :]                              # [i, j]: i < j
    dup = (ident[:, :, None] == ident[:, None, :]) & ok[:, :, None] & earlier
    ok = ok & ~dup.any(dim=1)
    cont = torch.where(ok[:, :, None], cont, -1)
    cont = torch.where((cont >= 0).to(torch.int64).cumprod(dim=2).bool(), cont, -1)
    # One chain per distinct match length (its first candidate).
    same_len = (c_len[:, :, None] == c_len[:, None, :]) & ok[:, :, None] & earlier
    first = ok & ~same_len.any(dim=1)                                    # [B, C]
    alive = ok[:, None, :] & (c_len[:, None, :] >= c_len[:, :, None])    # [B, chain, C]
    go = first & (c_len > 0)
    cum = torch.ones(b, c, dtype=torch.float32, device=dev)
    score = torch.zeros(b, c, dtype=torch.float32, device=dev)
    chain = torch.zeros(b, c, k, dtype=torch.int64, device=dev)
    votes = torch.zeros(b, c, k, 2, dtype=torch.int64, device=dev)
    for t in range(k):
        col = cont[:, None, :, t].expand(b, c, c)                       # [B, chain, C]
        has = alive & (col >= 0)
        count = ((col[..., :, None] == col[..., None, :]) & has[..., None, :]).sum(dim=3)
        count = torch.where(has, count, 0)
        cmax = count.max(dim=2).values                                   # [B, chain]
        newest = torch.where(has & (count == cmax[..., None]), vals[:, None, :], -1)
        pick = newest.argmax(dim=2, keepdim=True)
        tok = col.gather(2, pick)[..., 0]
        go = go & (cmax > 0)
        denom = alive.sum(dim=2).clamp(min=1)
        cum = torch.where(go, cum * cmax.to(torch.float32) / denom.to(torch.float32), cum)
        score = torch.where(go, score + cum, score)
        chain[:, :, t] = torch.where(go, tok, 0)
        votes[:, :, t, 0] = torch.where(go, cmax, 0)
        votes[:, :, t, 1] = torch.where(go, denom, 0)
        alive = alive & (col >= 0) & (col == tok[..., None])
    # The best chain: the highest score, then the longer match, then the first.
    score = torch.where(first, score, -1.0)
    top = score.max(dim=1, keepdim=True).values
    length = torch.where(first & (score == top), c_len, -1)
    best = length.argmax(dim=1)
    matched = first.any(dim=1)
    length = torch.where(matched, c_len.gather(1, best[:, None])[:, 0], 0)
    rows = torch.arange(b, device=dev)
    tokens = chain[rows, best]
    v = votes[rows, best]
    live = matched[:, None]
    return length, tokens * live, v[..., 0] * live, v[..., 1] * live


class OneTokenPaths:
    """``SuffixProposer.one_token_paths`` on the device, a row per token id:
    ``tokens``, ``c``, ``n`` (int32, ``[vocab_size, k]``; ``n`` 0: none)."""

    def __init__(self, vocab_size: int, k: int, device="cpu"):
        self.vocab = vocab_size
        rows = vocab_size + 1  # and a trash row, for ``put``'s unused entries
        self.tokens = torch.full((rows, k), -1, dtype=torch.int32, device=device)
        self.c = torch.zeros(rows, k, dtype=torch.int32, device=device)
        self.n = torch.zeros(rows, k, dtype=torch.int32, device=device)

    def put(self, keys, tokens, c, n) -> None:
        """Rows ``keys`` (device tensors; ``vocab``: unused) take these paths."""
        keys = keys.to(torch.int64).clamp(0, self.vocab)
        self.tokens[keys] = tokens.to(torch.int32)
        self.c[keys] = c.to(torch.int32)
        self.n[keys] = n.to(torch.int32)

    def update(self, keys, tokens, c, n) -> None:
        """Rows ``keys`` (token ids) take the paths the host walked (device tensors
        or arrays, as ``one_token_paths`` returns them)."""
        vocab, k = self.vocab, self.tokens.shape[1]
        keys = torch.as_tensor(keys, device=self.tokens.device).to(torch.int64)
        ok = (keys >= 0) & (keys < vocab)
        keys = keys.clamp(0, vocab - 1)
        for mine, theirs in ((self.tokens, tokens), (self.c, c), (self.n, n)):
            rows = torch.as_tensor(theirs, device=mine.device)[:, :k].to(torch.int32)
            old = mine[keys]
            mine[keys] = torch.where(ok[:, None], rows, old)

    def draft(self, last: torch.Tensor):
        """``(match length, tokens, c, n)`` of each row's last token ``last``."""
        vocab, k = self.vocab, self.tokens.shape[1]
        if vocab == 0:
            zero = torch.zeros(last.shape[0], k, dtype=torch.int64, device=last.device)
            return torch.zeros_like(last, dtype=torch.int64), zero, zero, zero
        inside = (last >= 0) & (last < vocab)
        r = last.clamp(0, vocab - 1).to(torch.int64)
        live = (inside & (self.n[r, 0] > 0)).to(torch.int64)
        return (live, self.tokens[r].to(torch.int64) * live[:, None],
                self.c[r].to(torch.int64) * live[:, None],
                self.n[r].to(torch.int64) * live[:, None])


def scan_on_host(rows: np.ndarray, totals: np.ndarray, slots: np.ndarray, depth: int):
    """``draft_ref.own_history_scan`` of rows ``slots`` of host arrays, by its
    Numba twin (replay, and the speculator on CPU tensors): ``(length, end)``."""
    found = np.zeros((2, slots.shape[0]), np.int64)
    for i, s in enumerate(slots):
        found[:, i] = local_match(rows[s], int(totals[s]), depth)
    return torch.from_numpy(found[0]), torch.from_numpy(found[1])


def family_scan_on_host(family: np.ndarray, family_len: np.ndarray, rows: np.ndarray,
                        totals: np.ndarray, slots: np.ndarray, depth: int):
    """``draft_ref.suffix_scan`` of the family rows of ``slots`` against their
    contexts (rows of host arrays), by its Numba twin: ``(length, end)``."""
    found = np.zeros((2, slots.shape[0]), np.int64)
    for i, s in enumerate(slots):
        if family_len[s] > 1:
            found[:, i] = family_match(family[s], int(family_len[s]), rows[s], int(totals[s]),
                                       depth)
    return torch.from_numpy(found[0]), torch.from_numpy(found[1])


def corpus_on_host(rows: np.ndarray, totals: np.ndarray, slots: np.ndarray, ring: np.ndarray,
                   table: np.ndarray, depth: int, k: int):
    """``DeviceCorpus.draft`` of rows ``slots`` of host arrays over a host ring and
    table, by its Numba twin: ``(match length, tokens, c, n)``."""
    b = slots.shape[0]
    length = np.zeros(b, np.int64)
    tokens = np.zeros((b, k), np.int64)
    votes = np.zeros((b, k, 2), np.int64)
    if ring.shape[0] > 1:
        for i, s in enumerate(slots):
            length[i], _ = corpus_draft(rows[s], int(totals[s]), ring, table, depth, k,
                                        tokens[i], votes[i])
    return (torch.from_numpy(length), torch.from_numpy(tokens),
            torch.from_numpy(votes[..., 0].copy()), torch.from_numpy(votes[..., 1].copy()))
