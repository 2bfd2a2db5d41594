"""The arbiter on the device: ``draft_ref``'s step 5, held to the host's rule.

Drafting on the device keeps, per row, the pick and the own-history scan's
draft (the reference) where they differ, with the host's cell
(``arbiter.cell``); it drafts the reference where ``Calibration.prefer``
says the cell's reference has done better.  The host scores the pairs
(``SuffixProposer.adopt_pairs``) and ships ``arbiter.preferred``.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from suffixspec.device.cases import random_case  # noqa: E402
from suffixspec.device.draft_ref import (FROM_CORPUS, FROM_FAMILY, FROM_LIVE,  # noqa: E402
                                         FROM_NOTHING, FROM_SCAN, FROM_SHORT, PAIR_CELL, PAIR_PICK,
                                         PAIR_REFERENCE, fused_ref)
from suffixspec.device.layout import P_ARBITRATE, P_REFERENCE, W_SOURCE  # noqa: E402
from suffixspec.native import arbiter  # noqa: E402
from suffixspec.native import calibration as cal  # noqa: E402
from suffixspec.native import layout as lay  # noqa: E402


def _run(args, fresh, arbitrate: bool):
    calibration = args[7]
    calibration.params[P_ARBITRATE] = 1.0 if arbitrate else 0.0
    o = fresh()
    fused_ref(*args, o)
    return o


def _only_the_scan(args):
    """``args`` with every candidate but the own-history scan emptied: what the
    scan drafts on its own (its scoring does not depend on the others)."""
    tail, total, sampled, recent, slots, dw, direct, calibration, k, vocab = args
    d_tok, d_c, d_n, d_match = (x.clone() for x in direct)
    d_c[:, 1:] = 0
    d_n[:, 1:] = 0
    d_match[:, 1:] = 0
    meta = dw.meta.clone()
    dw.meta[:] = 0  # no window holds a token
    return (tail, total, sampled, recent, slots, dw, (d_tok, d_c, d_n, d_match), calibration,
            k, vocab), meta


def _source(choice: int, slot: int, meta) -> int:
    """The pick's ``FROM_*`` code (``arbiter.cell``'s source)."""
    if choice >= 0:
        return min(int(meta[slot, choice, W_SOURCE]), lay.FROM_ANCHOR)
    return {FROM_SCAN: lay.FROM_REQUEST, FROM_CORPUS: lay.FROM_CROSS,
            FROM_SHORT: lay.FROM_CROSS, FROM_FAMILY: lay.FROM_REQUEST,
            FROM_LIVE: lay.FROM_LIVE}[choice]


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_the_device_arbitrates_as_the_host_rule_says(seed):
    """Per row, against a brute force built from plain drafting steps: the
    pick (drafted with the arbiter off) and the scan's own draft (the scan
    alone) are the pair; it is kept where a reference exists and the two
    differ, in ``arbiter.cell``'s row; where ``prefer`` holds there, the scan's
    draft is drafted, with buckets -1; elsewhere the pick, as before."""
    rng = np.random.default_rng(seed)
    *args, fresh = random_case(rng)
    calibration = args[7]
    calibration.params[P_REFERENCE] = float(rng.integers(2))
    if rng.integers(2):  # often: the scan's continuation is the context's own
        args[6][1][:, 0] = torch.maximum(args[6][1][:, 0], torch.ones_like(args[6][1][:, 0]))
        args[6][2][:, 0] = args[6][1][:, 0]
    pick = _run(args, fresh, False)
    got = _run(args, fresh, True)
    alone_args, meta = _only_the_scan(args)
    alone = _run(alone_args, fresh, False)
    args[5].meta[:] = meta
    sampled, slots, direct = args[2], args[4], args[6]
    prefer = calibration.prefer.numpy()
    for b in range(sampled.shape[0]):
        n_pick, n_ref = int(pick.num_valid[b]), int(alone.num_valid[b])
        p_tok = pick.drafts[b, :n_pick].tolist()
        r_tok = alone.drafts[b, :n_ref].tolist()
        same = 0
        while same < min(n_pick, n_ref) and p_tok[same] == r_tok[same]:
            same += 1
        has_ref = (bool(calibration.params[P_REFERENCE] > 0) and int(direct[1][b, 0, 0]) > 0
                   and int(sampled[b]) > 0)
        paired = has_ref and not (same == n_pick == n_ref)
        assert got.pair[b, PAIR_PICK] == n_pick and got.pair[b, PAIR_REFERENCE] == n_ref
        assert got.pair_tokens[b, 0, :n_pick].tolist() == p_tok
        assert got.pair_tokens[b, 1, :n_ref].tolist() == r_tok
        if not paired:
            assert got.pair[b, PAIR_CELL] == -1
            swap = False
        else:
            source = _source(int(pick.choice[b]), int(slots[b]), meta) if n_pick else 0
            row = arbiter.cell(int(pick.match[b]), n_pick, source, int(direct[3][b, 0]),
                               1 if same > 0 else 0)
            assert got.pair[b, PAIR_CELL] == row
            swap = n_ref > 0 and prefer[row] > 0
        want = alone if swap else pick
        n = int(want.num_valid[b])
        assert int(got.num_valid[b]) == n
        assert got.drafts[b].tolist() == want.drafts[b].tolist()
        assert torch.allclose(got.probs[b], want.probs[b])
        if swap:
            assert int(got.choice[b]) == FROM_SCAN and int(got.match[b]) == int(direct[3][b, 0])
            assert (got.buckets[b, :n] == -1).all()
        else:
            assert got.choice[b] == pick.choice[b] and got.buckets[b].tolist() == \
                pick.buckets[b].tolist()
    assert got.choice.min() >= min(FROM_LIVE, FROM_NOTHING)


PRESET_SCORED = arbiter.DEVICE_MIN_SCORED


def _device_run(arbitrate: bool, prefer_all: bool = False, steps: int = 10):
    """Replay drafting on the device (windows one step old): 30 past outputs
    in the pool went "1 2 3 4", while this request's own "1 2 3" went on
    "5 6" and goes on so.  ``prefer_all``: every cell starts out preferring
    the reference.  Returns the first drafted tokens with their sources, and
    the proposer.  The token rows are kept empty: they would learn within
    steps that "4" misses and "5" is accepted, and the policy would then pick
    the reference's "5" itself, leaving the arbiter nothing to decide."""
    from suffixspec.device.replay import DeviceWindowsProposer

    p = DeviceWindowsProposer(max_depth=16, max_spec_tokens=5, draft_cost=0.0,
                              corpus_tokens=0, arbiter=arbitrate)
    for i in range(30):
        p.start_request(f"o{i}", [100 + i])
        p.extend(f"o{i}", [7, 1, 2, 3, 4, 8, 9])
        p.finish_request(f"o{i}")
    if prefer_all:  # a lead far past the device's margin, in every cell
        p.host.pending.arbiter[:, arbiter.A_REFERENCE] = 1e6
        p.host.pending.arbiter[:, arbiter.A_SCORED] = PRESET_SCORED
    p.start_request("r", [300, 1, 2, 3, 5, 6, 301, 1, 2, 3])
    firsts = []
    for i in range(steps):
        d = p.propose(["r"])[0]
        firsts.append((int(d.token_ids[0]) if len(d) else -1, d.source))
        p.extend("r", [5, 6, 400 + i, 1, 2, 3])
        p.host.stats.table[cal.TOKEN_BASE:] = 0
    return firsts, p


def test_drafting_on_the_device_drafts_the_reference_where_the_host_prefers_it():
    """Where every cell prefers the reference, the device drafts the scan's
    "5 6" at every step whose pick differs; the calibration learns none of
    those tokens; without the arbiter the pick's "7" and "4" are drafted."""
    on, p = _device_run(True, prefer_all=True)
    off, _ = _device_run(False, prefer_all=True)
    assert [t for t, _ in on] == [5] * 10
    assert {t for t, _ in off[:4]} & {4, 7}
    swapped = [i for i, (t, src) in enumerate(on) if src == "scan"]
    assert swapped and 0 in swapped
    table = p.host.pending.arbiter
    scored = table[:, arbiter.A_SCORED].sum() - PRESET_SCORED * arbiter.ARB_ROWS
    # A step's pair reaches the host with its snapshot, at the next step, and is
    # scored by the tokens of the step after: the last two wait.
    assert scored >= len(swapped) - 3
    assert p.counts["scan"] == len(swapped)


def test_the_host_scores_the_devices_pairs_and_ships_its_choice(monkeypatch):
    """With an empty table the host scores each step's pair once the context
    has gone past it, and the device reads ``arbiter.preferred`` of it; the
    reference's wins ("5 6" accepted, "4" missed) make it drafted.  (The
    device's margin is set to none here: this slice's cells score one or two
    pairs each, and the margin has its own test above.)"""
    monkeypatch.setattr(arbiter, "preferred",
                        functools.partial(arbiter.preferred, margin=0.0, min_scored=0.0))
    _, p = _device_run(True, steps=12)
    table = p.host.pending.arbiter
    scored = table[:, arbiter.A_SCORED].sum()
    assert scored >= 3
    assert (arbiter.preferred(table) == p.drafter.calibration.prefer.numpy()).all()
    assert table[:, arbiter.A_REFERENCE].sum() > table[:, arbiter.A_POLICY].sum()
    assert p.counts["scan"] >= 1
    off, q = _device_run(False, steps=12)
    # Without the arbiter no pair is kept and the scan never drafts instead of the
    # pick (at the first step no windows have come yet: it may draft on its own).
    assert q.host.pending.arbiter.sum() == 0 and all(src != "scan" for _, src in off[1:])


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.large_base_example])  # a row per cell
@given(st.lists(st.tuples(st.floats(-50, 50), st.floats(-50, 50), st.integers(0, 40)),
                min_size=arbiter.ARB_ROWS, max_size=arbiter.ARB_ROWS))
def test_the_device_swaps_only_where_the_lead_passes_the_margin(rows):
    """``preferred``: a row is preferred exactly where at least
    ``DEVICE_MIN_SCORED`` drafts were scored and the reference's value leads
    by more than ``DEVICE_MARGIN * sqrt(scored)``; with no margin and no
    minimum it is the host's ``prefers_reference`` of every row."""
    table = np.array(rows, np.float64)
    got = arbiter.preferred(table)
    for r, (ref, pick, scored) in enumerate(rows):
        lead = ref - pick
        want = (scored >= arbiter.DEVICE_MIN_SCORED
                and lead > arbiter.DEVICE_MARGIN * math.sqrt(scored))
        assert got[r] == int(want), (r, ref, pick, scored)
    host = [int(arbiter.prefers_reference(table, r)) for r in range(arbiter.ARB_ROWS)]
    assert arbiter.preferred(table, 0.0, 0.0).tolist() == host


def test_adopt_pairs_keeps_what_is_in_range_and_scores_it_later():
    """Pairs from the device: a cell out of range is no pair, lengths past the
    drafts' width are clipped; a kept pair is scored once the context has gone
    past it, at the cell the device named."""
    from suffixspec import SuffixProposer

    p = SuffixProposer(max_depth=16, max_spec_tokens=4, draft_cost=0.0)
    p.start_request("r", [1, 2, 3, 4])
    pairs = np.array([[arbiter.ARB_ROWS, 2, 2]])
    tokens = np.array([[[5, 6, 0, 0], [7, 8, 0, 0]]])
    p.adopt_pairs(["r"], pairs, tokens)
    assert (p.pending.keep_meta[:, :, arbiter.K_START] < 0).all()
    p.adopt_pairs(["r"], np.array([[9, 99, 2]]), tokens)
    row = p.requests.requests["r"][1]
    kept = p.pending.keep_meta[row]
    assert ((kept[:, arbiter.K_START] == 4) & (kept[:, arbiter.K_CELL] == 9)
            & (kept[:, arbiter.K_POLICY] == 4)).sum() == 1
    p.extend("r", [7, 8, 1, 1, 1])
    p.adopt_pairs(["r"], np.array([[-1, 0, 0]]), tokens)
    assert p.pending.arbiter[9].tolist() == [2.0, 0.0, 1.0]  # the reference took both
    with pytest.raises(ValueError):
        p.adopt_pairs(["r"], np.zeros((1, 2), np.int64), tokens)
