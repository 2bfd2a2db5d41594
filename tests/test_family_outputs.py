"""A new request's own trie also holds the latest outputs of its prompt family."""

from __future__ import annotations

import numpy as np
import pytest

from suffixspec import SuffixProposer
from suffixspec.anchors import PROMPT_START_TOKENS
from suffixspec.pools import memory

START = np.arange(100, 100 + PROMPT_START_TOKENS, dtype=np.int32)  # a family's shared start
WRITTEN = [7, 8, 9, 10, 11, 12, 13, 14]


def prompt(end) -> np.ndarray:
    return np.r_[START, np.asarray(end, np.int32)]


def make(**kw) -> SuffixProposer:
    return SuffixProposer(max_depth=16, max_spec_tokens=8, draft_cost=0.0, **kw)


def finish(p, req_id, prompt_tokens, output) -> None:
    p.start_request(req_id, prompt_tokens)
    p.extend(req_id, output)
    p.finish_request(req_id)


def own_draft(p, req_id, prompt_tokens, output, **start) -> list[int]:
    """The draft after ``output``, with every past output out of the cross pool,
    so only the request's own trie can draft."""
    p.start_request(req_id, prompt_tokens, **start)
    p.extend(req_id, output)
    for seq in list(p.cross.delta.committed):
        p.cross.discard(seq)
    d = p.propose([req_id])[0]
    return d.token_ids.tolist() if d.source == "request" else []


def test_a_new_request_drafts_what_its_family_wrote_from_its_own_trie():
    on, off = make(family_outputs=2), make(family_outputs=0)
    for p in (on, off):
        finish(p, "earlier", prompt([1, 2]), WRITTEN)
    assert own_draft(on, "next", prompt([3, 4]), WRITTEN[:3])[:3] == WRITTEN[3:6]
    assert own_draft(off, "next", prompt([3, 4]), WRITTEN[:3]) == []
    other = make(family_outputs=2)  # another start: another family
    finish(other, "earlier", prompt([1, 2]), WRITTEN)
    assert own_draft(other, "next", np.r_[np.int32(5), prompt([3, 4])], WRITTEN[:3]) == []


def test_a_family_keeps_its_latest_finished_outputs_never_an_aborted_one():
    p = make(family_outputs=2)
    for i in range(3):
        finish(p, i, prompt([50 + i]), [20 + i] * 5)
    p.start_request("cancelled", prompt([60]))
    p.extend("cancelled", [30] * 5)
    p.abort_request("cancelled")
    (family,) = p.requests.families.values()
    assert [o.tolist() for o in family] == [[21] * 5, [22] * 5]  # oldest first, prompt cut off
    finish(p, "elsewhere", np.r_[np.int32(1), prompt([9])], [40] * 3)
    assert len(p.requests.families) == 2


def test_families_are_per_namespace():
    p = make(family_outputs=2)
    p.start_request("a", prompt([1]), namespace="tenant-a")
    p.extend("a", WRITTEN)
    p.finish_request("a")
    assert own_draft(p, "b", prompt([2]), WRITTEN[:3], namespace="tenant-b") == []
    assert own_draft(p, "c", prompt([3]), WRITTEN[:3], namespace="tenant-a")[:3] == WRITTEN[3:6]


def test_without_a_cross_pool_no_output_is_kept():
    p = make(family_outputs=2, cross_pool_tokens=0)
    finish(p, "earlier", prompt([1]), WRITTEN)
    assert not p.requests.families


def test_the_families_least_recently_joined_go_first_past_the_token_budget(monkeypatch):
    monkeypatch.setattr(memory, "FAMILY_TOKENS", 25)
    p = make(family_outputs=2)
    for i in range(4):  # four families, ten output tokens each
        finish(p, i, np.r_[np.int32(i), prompt([1])], [30 + i] * 10)
    kept = list(p.requests.families.values())
    assert [o[0][0] for o in kept] == [32, 33]
    assert p.requests._family_tokens == 20


def test_a_next_turn_of_a_conversation_indexes_its_family_no_more():
    p = make(family_outputs=2)
    finish(p, "other", prompt([1]), WRITTEN)
    first = prompt([2])
    finish(p, "turn 1", first, [5, 5, 5])
    tokens = p.requests.index.live_tokens
    p.start_request("turn 2", np.r_[first, 5, 5, 5, 6])
    assert p.reused_tokens == first.shape[0] + 3
    assert p.requests.index.live_tokens == tokens + 1  # its one new token
    p.requests.index.check_integrity()
    # It keeps those its tree indexed (its family row on the device, too).
    assert [o.tolist() for o in p.family_outputs("turn 2")] == [WRITTEN]


def test_the_family_outputs_a_request_names_are_those_its_tree_indexed():
    p = make(family_outputs=2)
    finish(p, "a", prompt([1]), WRITTEN)
    p.start_request("b", prompt([2]))
    finish(p, "c", prompt([3]), [40, 41])  # after "b" started: not in its tree
    assert [o.tolist() for o in p.family_outputs("b")] == [WRITTEN]
    p.start_request("d", prompt([4]))
    assert [o.tolist() for o in p.family_outputs("d")] == [WRITTEN, [40, 41]]
    p.start_request("alone", np.r_[np.int32(9), prompt([5])])  # another family: none
    assert p.family_outputs("alone") == ()
    p.finish_request("b")
    with pytest.raises(ValueError, match="unknown request"):
        p.family_outputs("b")


def test_a_family_size_that_is_not_a_whole_number_in_range_is_refused():
    from suffixspec.config import ProposerConfig

    for bad in (-1, 65, 1.5, True, None):
        with pytest.raises(ValueError, match="family_outputs"):
            ProposerConfig(family_outputs=bad)
