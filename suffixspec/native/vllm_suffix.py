"""A model of vLLM's own GPU suffix drafter (Model Runner V2, ``method: "suffix"``).

vLLM's main branch (after 0.33) drafts ``suffix`` itself on the GPU
(``vllm/v1/worker/gpu/spec_decode/suffix/speculator.py``).  These kernels
draft by its rule, on the CPU, for replay: the anchor suffixspec is measured
against.  Per request:

* the request's own history: the longest suffix of its tokens (at most
  ``depth``) found earlier in them, the newest occurrence on ties;
* the corpus: finished responses (each with the last ``PROMPT_CONTEXT``
  prompt tokens ahead of it) in a ring of ``corpus.shape[0]`` tokens,
  oldest overwritten first, documents separated by -1.  Two hash tables
  keyed by the last 2 and the last 4 tokens before a position keep, per
  bucket, the newest occurrence in each of the last ``SLOTS`` documents
  holding the key.  Each of the (at most 16) candidates is extended to its
  longest suffix match; for each distinct match length L the candidates
  matching at least L vote token by token (most frequent next token, ties
  to the newest), a chain scores the sum of its running products of
  per-token shares, the best score wins (ties: longer L);
* the longer of the two matches wins (ties: the request's own); a draft is
  always ``k`` tokens, slots past the valid ones holding the last token.

Scores are float32 sums, as on the GPU, so ties break the same way.
"""

import numpy as np
from numba import njit

#: Odd 64-bit multiplier (golden ratio) of the key hash, as a signed int64.
HASH_MUL = np.int64(0x9E3779B97F4A7C15 - (1 << 64))
#: Corpus slots per hash bucket (documents kept per key).
SLOTS = 8
#: Prompt tokens kept ahead of each response in the corpus.
PROMPT_CONTEXT = 3
#: Match-length buckets of adaptive verification: 1..6 each, 7-10, 11-20, 21+.
LEN_BUCKETS = 9


def buckets_for(corpus_tokens: int) -> int:
    """Hash buckets per table for a corpus of ``corpus_tokens`` tokens."""
    n = max(16, corpus_tokens // 4)
    return 1 << int(np.ceil(np.log2(n)))


@njit(cache=True)
def _bucket(hv, n_buckets):
    return ((hv >> 29) ^ hv) & (n_buckets - 1)


@njit(cache=True)
def _key_buckets(row, end, n_buckets):
    """The 4- and 2-token key buckets of the tokens before ``row[end]`` (0 for
    those before the row's start), as ``ingest`` keys each position."""
    hv = np.int64(0)
    b2 = np.int64(0)
    for d in range(4):
        t = np.int64(0)
        if end - 1 - d >= 0:
            t = np.int64(row[end - 1 - d])
        hv = (hv ^ t) * HASH_MUL
        if d == 1:
            b2 = _bucket(hv, n_buckets)
    return _bucket(hv, n_buckets), b2


@njit(cache=True, nogil=True)
def ingest(corpus, table, state, row, start, end):
    """Append document ``row[start:end]`` (the newest ``cap - 1`` tokens of it) to
    the corpus ring and index it.  ``state`` is ``[head, documents so far]``."""
    cap = corpus.shape[0]
    nb = table.shape[1]
    head = state[0]
    doc = state[1]
    if start < end - (cap - 1):
        start = end - (cap - 1)
    n = end - start
    if n < 0:
        n = 0
    if head + n + 1 > cap:
        head = 0
    slot = doc % SLOTS
    for j in range(n):
        corpus[head + j] = row[start + j]
        val = (doc << 32) | (head + j)
        hv = np.int64(0)
        for d in range(4):
            t = np.int64(0)
            if j - 1 - d >= 0:
                t = np.int64(row[start + j - 1 - d])
            hv = (hv ^ t) * HASH_MUL
            if d == 1 and j >= 2:
                b = _bucket(hv, nb)
                if val > table[1, b, slot]:
                    table[1, b, slot] = val
            if d == 3 and j >= 4:
                b = _bucket(hv, nb)
                if val > table[0, b, slot]:
                    table[0, b, slot] = val
    corpus[head + n] = -1
    state[0] = head + n + 1
    state[1] = doc + 1


@njit(cache=True, nogil=True)
def pack_doc(doc, head, seq, n_buckets, pos, tok, b4, b2, seqs, keys):
    """A document's entries for the device corpus (``device.payload.Packer``):
    per token of ``doc`` and then its end marker (token -1), its ring position
    from ``head``, token, 4- and 2-token hash buckets (``ingest``'s keys),
    document number ``seq`` and which keys index it (bit 0: 4 tokens, bit 1:
    2).  Writes ``len(doc) + 1`` entries of each output; False, writing
    nothing, when one is shorter or ``n_buckets`` is not a power of two."""
    n = doc.shape[0]
    for out in (pos, tok, b4, b2, seqs, keys):
        if out.shape[0] < n + 1:
            return False
    if n_buckets <= 0 or n_buckets & (n_buckets - 1) != 0:
        return False
    for j in range(n):
        b4[j], b2[j] = _key_buckets(doc, j, n_buckets)
        pos[j] = head + j
        tok[j] = doc[j]
        seqs[j] = seq
        keys[j] = (1 if j >= 4 else 0) | (2 if j >= 2 else 0)
    pos[n] = head + n
    tok[n] = -1
    b4[n] = 0
    b2[n] = 0
    seqs[n] = seq
    keys[n] = 0
    return True


@njit(cache=True, nogil=True)
def family_match(family, family_len, row, seq_len, depth):
    """``(length, end)``: the longest suffix of ``row[:seq_len]`` (at most
    ``depth`` tokens) that ends at a position ``end`` of ``family[:family_len]``
    with a token after it (``end < family_len``), the newest of equals;
    length 0 when none.  Token ids are never negative in ``row``."""
    best_len = 0
    best_pos = 0
    for pos in range(1, family_len):
        m = 0
        while (m < depth and m < seq_len and pos - 1 - m >= 0 and row[seq_len - 1 - m] >= 0
               and family[pos - 1 - m] == row[seq_len - 1 - m]):
            m += 1
        if m > 0 and (m > best_len or (m == best_len and pos > best_pos)):
            best_len = m
            best_pos = pos
    return best_len, best_pos


@njit(cache=True, nogil=True)
def local_match(row, seq_len, depth):
    """``(length, end)``: the longest suffix of ``row[:seq_len]`` (at most ``depth``
    tokens) that also ends at an earlier position ``end`` (the newest of equals);
    length 0 when none (``family_match`` of the row against itself)."""
    return family_match(row, seq_len, row, seq_len, depth)


@njit(cache=True, nogil=True)
def corpus_draft(row, seq_len, corpus, table, depth, k, chain, votes):
    """The corpus's draft for ``row[:seq_len]``: ``(match length, tokens)``, the
    tokens in ``chain[:tokens]``; ``(0, 0)`` when no candidate matches.
    ``votes[:tokens]`` gets each token's ``(c, n)``: ``c`` of the ``n``
    candidates still matching voted for it."""
    cap = corpus.shape[0]
    nb = table.shape[1]
    c = 2 * SLOTS
    b4, b2 = _key_buckets(row, seq_len, nb)
    vals = np.empty(c, np.int64)
    key_len = np.empty(c, np.int64)
    for i in range(SLOTS):
        vals[i] = table[0, b4, i]
        vals[SLOTS + i] = table[1, b2, i]
        key_len[i] = 4
        key_len[SLOTS + i] = 2
    cpos = vals & 0xFFFFFFFF
    c_len = np.zeros(c, np.int64)
    ok = np.zeros(c, np.bool_)
    for i in range(c):
        if vals[i] < 0:
            continue
        m = 0
        while (m < depth and cpos[i] - 1 - m >= 0 and seq_len - 1 - m >= 0
               and corpus[cpos[i] - 1 - m] == row[seq_len - 1 - m]):
            m += 1
        c_len[i] = m
        nxt = corpus[cpos[i]] if cpos[i] < cap else -1
        ok[i] = nxt >= 0 and m >= key_len[i] and seq_len >= key_len[i]
    # Both tables often name the same position: it counts once (the first).
    keep = ok.copy()
    for j in range(c):
        for i in range(j):
            if ok[i] and cpos[i] == cpos[j]:
                keep[j] = False
    ok = keep
    cont = np.full((c, k), -1, np.int64)
    for i in range(c):
        if not ok[i]:
            continue
        for d in range(k):
            p = cpos[i] + d
            if p >= cap or corpus[p] < 0:
                break  # the document ends
            cont[i, d] = corpus[p]
    best_score = np.float32(-1.0)
    best_len = 0
    best_n = 0
    col = np.empty(c, np.int64)
    for i in range(c):
        if not ok[i]:
            continue
        first = True
        for j in range(i):
            if ok[j] and c_len[j] == c_len[i]:
                first = False
        if not first:
            continue
        length = c_len[i]
        alive = ok & (c_len >= length)
        go = length > 0
        cum = np.float32(1.0)
        score = np.float32(0.0)
        n_emit = 0
        draft = np.zeros(k, np.int64)
        tally = np.zeros((k, 2), np.int64)
        for d in range(k):
            for j in range(c):
                col[j] = cont[j, d]
            cmax = 0
            newest = np.int64(-1)
            tok = np.int64(0)
            for j in range(c):
                if not (alive[j] and col[j] >= 0):
                    continue
                cnt = 0
                for q in range(c):
                    if alive[q] and col[q] == col[j]:
                        cnt += 1
                if cnt > cmax or (cnt == cmax and vals[j] > newest):
                    cmax = cnt
                    newest = vals[j]
                    tok = col[j]
            go = go and cmax > 0
            denom = 0
            for j in range(c):
                denom += alive[j]
            if denom < 1:
                denom = 1
            if go:
                cum = np.float32(np.float32(cum * np.float32(cmax)) / np.float32(denom))
                score = np.float32(score + cum)
                draft[d] = tok
                tally[d, 0] = cmax
                tally[d, 1] = denom
                n_emit += 1
            for j in range(c):
                alive[j] = alive[j] and col[j] >= 0 and col[j] == tok
        if score > best_score or (score == best_score and best_len < length):
            best_score = score
            best_len = length
            best_n = n_emit
            for d in range(k):
                chain[d] = draft[d]
                votes[d, 0] = tally[d, 0]
                votes[d, 1] = tally[d, 1]
    return best_len, best_n


@njit(cache=True, nogil=True)
def propose(row, seq_len, corpus, table, depth, k, out):
    """A draft of ``k`` tokens for ``row[:seq_len]`` into ``out``; returns
    ``(valid tokens, match length, source)``, source 0 for the request's own
    history and 1 for the corpus.  Slots past the valid ones hold the last token."""
    l_len, l_pos = local_match(row, seq_len, depth)
    valid = 0
    length = l_len
    source = 0
    if l_len > 0:
        while valid < k and l_pos + valid < seq_len:
            out[valid] = row[l_pos + valid]
            valid += 1
    if corpus.shape[0] > 0:
        chain = np.zeros(k, np.int64)
        g_len, g_n = corpus_draft(row, seq_len, corpus, table, depth, k, chain,
                                  np.zeros((k, 2), np.int64))
        if g_len > l_len:
            for d in range(g_n):
                out[d] = chain[d]
            valid = g_n
            length = g_len
            source = 1
    last = row[seq_len - 1]
    for d in range(valid, k):
        out[d] = last
    return valid, length, source


@njit(cache=True)
def len_bucket(length):
    """Adaptive verification's match-length bucket (``LEN_BUCKETS`` of them)."""
    if length <= 6:
        return length - 1
    if length <= 10:
        return 6
    if length <= 20:
        return 7
    return 8


@njit(cache=True, nogil=True)
def confidences(stats, valid, length, source, conf):
    """Each slot's acceptance estimate (accepted + 1) / (observed + 2) in its
    (source, match-length bucket, position) cell; filler slots 0.  Returns the bucket."""
    bucket = source * LEN_BUCKETS + len_bucket(max(length, 1))
    for d in range(conf.shape[0]):
        if d < valid:
            conf[d] = np.float32(stats[bucket, d, 0] + 1.0) / np.float32(stats[bucket, d, 1] + 2.0)
        else:
            conf[d] = np.float32(0.0)
    return bucket


@njit(cache=True, nogil=True)
def observe(stats, bucket, valid, verified, accepted):
    """Fold one draft's verdict in: the accepted positions and the first rejected
    one were observed (among the verified, valid slots)."""
    if bucket < 0:
        return
    for d in range(stats.shape[1]):
        if d <= accepted and d < verified and d < valid:
            stats[bucket, d, 1] += 1
            if d < accepted:
                stats[bucket, d, 0] += 1
