"""vLLM's GPU suffix drafter written the plain way, to check ``native.vllm_suffix``.

Lists and dicts, Python integers masked to 64 bits, a Counter per vote: the
same rule as the kernels (their module docstring), none of their loops.
"""

from __future__ import annotations

import numpy as np

MUL = 0x9E3779B97F4A7C15
MASK = (1 << 64) - 1
SLOTS = 8


def _signed(x: int) -> int:
    x &= MASK
    return x - (1 << 64) if x >> 63 else x


def _bucket(hv: int, nb: int) -> int:
    return ((hv >> 29) ^ hv) & (nb - 1)  # Python's >> on a negative int is arithmetic too


def _hashes(before: list[int]) -> tuple[int, int]:
    """Bucket hashes of the last 2 and last 4 tokens of ``before`` (newest first; 0 past its start)."""
    hv, h2 = 0, 0
    for d in range(4):
        t = before[-1 - d] if d < len(before) else 0
        hv = _signed((hv ^ t) * MUL)
        if d == 1:
            h2 = hv
    return h2, hv


class NaiveDrafter:
    def __init__(self, cap: int, nb: int, depth: int, k: int):
        self.cap, self.nb, self.depth, self.k = cap, nb, depth, k
        self.corpus = [-1] * cap
        self.tables = [{}, {}]  # 4-key, 2-key: (bucket, slot) -> packed (doc << 32 | pos)
        self.head = 0
        self.docs = 0

    def ingest(self, doc: list[int]) -> None:
        doc = doc[-(self.cap - 1):] if self.cap > 1 else []
        n = len(doc)
        if self.head + n + 1 > self.cap:
            self.head = 0
        slot = self.docs % SLOTS
        for j, tok in enumerate(doc):
            self.corpus[self.head + j] = tok
            h2, h4 = _hashes(doc[:j])
            val = (self.docs << 32) | (self.head + j)
            for table, h, need in ((self.tables[1], h2, 2), (self.tables[0], h4, 4)):
                if j >= need:
                    key = (_bucket(h, self.nb), slot)
                    table[key] = max(table.get(key, -1), val)
        self.corpus[self.head + n] = -1
        self.head += n + 1
        self.docs += 1

    def _suffix_len(self, seq: list[int], end: int, corpus=False) -> int:
        """Tokens before ``end`` (in the corpus, or in ``seq``) equal to ``seq``'s last ones."""
        src = self.corpus if corpus else seq
        m = 0
        while m < self.depth and end - 1 - m >= 0 and m < len(seq) and \
                src[end - 1 - m] == seq[-1 - m]:
            m += 1
        return m

    def local(self, seq: list[int]) -> tuple[int, int]:
        best = (0, 0)
        for pos in range(1, len(seq)):
            m = self._suffix_len(seq, pos)
            if m > 0 and (m, pos) > best:
                best = (m, pos)
        return best

    def from_corpus(self, seq: list[int]) -> tuple[int, list[int]]:
        h2, h4 = _hashes(seq)
        cands = [(self.tables[0].get((_bucket(h4, self.nb), s), -1), 4) for s in range(SLOTS)]
        cands += [(self.tables[1].get((_bucket(h2, self.nb), s), -1), 2) for s in range(SLOTS)]
        seen, usable = set(), []  # (val, match length, continuation)
        for val, need in cands:
            if val < 0:
                continue
            pos = val & 0xFFFFFFFF
            m = self._suffix_len(seq, pos, corpus=True)
            if pos >= self.cap or self.corpus[pos] < 0 or m < need or len(seq) < need:
                continue
            if pos in seen:
                continue
            seen.add(pos)
            cont = []
            for p in range(pos, min(pos + self.k, self.cap)):
                if self.corpus[p] < 0:
                    break
                cont.append(self.corpus[p])
            usable.append((val, m, cont))
        best = (np.float32(-1.0), 0, [])
        for length in dict.fromkeys(m for _, m, _ in usable):  # each length once, first seen
            alive = [(val, cont) for val, m, cont in usable if m >= length]
            cum, score, chain = np.float32(1.0), np.float32(0.0), []
            for d in range(self.k):
                votes = {}
                for val, cont in alive:
                    if d < len(cont):
                        count, newest = votes.get(cont[d], (0, -1))
                        votes[cont[d]] = (count + 1, max(newest, val))
                if not votes or length == 0:
                    break
                tok, (count, _) = max(votes.items(), key=lambda kv: kv[1])
                cum = np.float32(np.float32(cum * np.float32(count)) / np.float32(len(alive)))
                score = np.float32(score + cum)
                chain.append(tok)
                alive = [(val, cont) for val, cont in alive if d < len(cont) and cont[d] == tok]
            if score > best[0] or (score == best[0] and best[1] < length):
                best = (score, length, chain)
        return best[1], best[2]

    def propose(self, seq: list[int]) -> tuple[list[int], int, int, int]:
        """(k tokens, valid, match length, source)."""
        l_len, l_pos = self.local(seq)
        draft = seq[l_pos:l_pos + self.k] if l_len else []
        length, source = l_len, 0
        if self.cap > 0:
            g_len, chain = self.from_corpus(seq)
            if g_len > l_len:
                draft, length, source = chain, g_len, 1
        return draft + [seq[-1]] * (self.k - len(draft)), len(draft), length, source
