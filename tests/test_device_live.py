"""The live corpus (``device.corpus.LiveCorpus``): the open outputs of the other
requests in flight, indexed in place, against the corpus's Numba twin over the
same text laid out as documents."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from suffixspec.device.corpus import LiveCorpus  # noqa: E402
from suffixspec.device.draft_ref import context_tail  # noqa: E402
from suffixspec.native import vllm_suffix as gpu  # noqa: E402

import naive_device as naive  # noqa: E402

CHECKED = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
STAMP_MASK = (1 << 40) - 1  # a value's slot and position, without its stamp
WIDTH = 48  # the history rows' room


def _rows(texts) -> tuple[torch.Tensor, torch.Tensor]:
    """History rows holding ``texts`` (stale tokens 9 past each end) and their lengths."""
    hist = torch.full((len(texts), WIDTH), 9, dtype=torch.int32)
    for s, t in enumerate(texts):
        hist[s, :len(t)] = torch.tensor(t, dtype=torch.int32)
    return hist, torch.tensor([len(t) for t in texts], dtype=torch.int32)


def _grown(texts, gains, window):
    """A live corpus indexing ``texts`` as they grow, ``gains`` tokens per row
    per call (each at most ``window``), every row from its first token."""
    hist, total = _rows(texts)
    final = total.clone()
    live = LiveCorpus(len(texts), window, buckets=gpu.buckets_for(200))
    for s in range(len(texts)):
        live.start(s, 1)
    slots = torch.arange(len(texts))
    shown = torch.zeros_like(final)
    while (shown < final).any():
        shown = torch.minimum(shown + gains, final)
        live.index(hist, shown, slots)
    return live, hist, final


texts_st = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=30), min_size=2,
                    max_size=6)


@CHECKED
@given(texts_st, st.integers(1, 5))
def test_indexing_as_rows_grow_equals_indexing_them_whole(texts, gain):
    """Step by step, each position is indexed once, where it would be at once."""
    window = 5
    grown, _, _ = _grown(texts, gain, window)
    whole = LiveCorpus(len(texts), WIDTH, buckets=gpu.buckets_for(200))
    hist, total = _rows(texts)
    for s in range(len(texts)):
        whole.start(s, 1)
    whole.index(hist, total, torch.arange(len(texts)))
    assert ((grown.table & STAMP_MASK) == (whole.table & STAMP_MASK)).all()


def test_a_slot_taken_again_drafts_nothing_of_its_old_request():
    """Entries left by a slot's earlier request name positions of the new one:
    checked like any candidate, never read past the row's end."""
    old = [5, 6, 7, 1, 2, 3, 4, 1, 2, 3, 4]
    hist, total = _rows([old, [0, 1, 2]])
    live = LiveCorpus(2, WIDTH)
    live.start(0, 1)
    live.index(hist, total, torch.tensor([0]))
    rows = torch.tensor([1])
    tail = context_tail(hist, total.to(torch.int64)[rows], 8, rows)
    assert live.draft(hist, total, rows, tail, 8, 4)[0].item() == 2  # "1 2" -> "3 4 1 2"
    # Slot 0 now holds a request of 3 tokens; its old entries stay in the table.
    hist[0, :3] = torch.tensor([1, 2, 8], dtype=torch.int32)
    total[0] = 3
    live.start(0, 1)
    assert live.draft(hist, total, rows, tail, 8, 4)[0].item() == 0  # position 9 is past 3
    # Indexed now, its "1 2" is newer than the old request's (by its stamp, not its place).
    live.index(hist, total, torch.tensor([0]))
    length, tokens, c, n = live.draft(hist, total, rows, tail, 8, 4)
    assert length.item() == 2 and tokens[0].tolist() == [8, 0, 0, 0]
    assert c[0].tolist() == [1, 0, 0, 0] and n[0].tolist() == [1, 0, 0, 0]


def test_a_row_never_drafts_from_itself():
    hist, total = _rows([[1, 2, 3, 1, 2]])
    live = LiveCorpus(1, WIDTH)
    live.start(0, 1)
    live.index(hist, total, torch.tensor([0]))
    rows = torch.tensor([0])
    tail = context_tail(hist, total.to(torch.int64)[rows], 8, rows)
    assert live.draft(hist, total, rows, tail, 8, 4)[0].item() == 0


@CHECKED
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=30), min_size=1, max_size=5),
       st.data())
def test_the_open_outputs_draft_as_one_corpus_of_the_other_rows(texts, data):
    """``LiveCorpus.draft`` equals the corpus's Numba twin over one ring
    holding the other rows, in slot order, each a document of its own."""
    buckets = gpu.buckets_for(400)
    hist, total = _rows(texts)
    own = data.draw(st.integers(0, len(texts) - 1))
    k, depth = data.draw(st.integers(1, 6)), data.draw(st.integers(1, 8))
    live = LiveCorpus(len(texts), WIDTH, buckets=buckets)
    for s in range(len(texts)):
        live.start(s, 1)
    live.index(hist, total, torch.arange(len(texts)))
    ring = np.full(400, -1, np.int32)
    table = np.full((2, buckets, gpu.SLOTS), -1, np.int64)
    head = np.zeros(2, np.int64)
    for doc in [t for s, t in enumerate(texts) if s != own]:
        row = np.asarray(doc, np.int32)
        gpu.ingest(ring, table, head, row, 0, row.shape[0])
    rows = torch.tensor([own])
    tail = context_tail(hist, total.to(torch.int64)[rows], max(depth, 4), rows)
    naive.assert_drafts_as_corpus_twin(live.draft(hist, total, rows, tail, depth, k),
                                       np.asarray(texts[own], np.int32), ring, table, depth, k)
