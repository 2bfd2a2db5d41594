"""A fuzzer of snapshot segments: structural mutations, refused by the checks or drafted from safely.

Each case starts from an intact segment (two namespaces, freed rows from a
partitioned build) and applies one to three mutations, re-signed (a shard's
builder sets the checksums): a field of any array set to an edge value or
another node's id; a freed row linked from a live one, made to mirror it; a
live row freed; two rows swapped; an array cut short or grown; the
description's shapes, types or namespaces edited.  The case then goes the
way a shard does: the description parsed, the files' sizes matched, the
structure checked (``validate.check_segment``).  What the checks let through
is drafted from, path and tree drafts in both namespaces, with prompts cut
from the segment's own sequences so the walks reach deep.

Cases run in child processes, a batch per child, each under a timeout
(``signal.alarm``); the child names a case before running it, so a signal or
a hang is pinned on its case and the rest go on in a fresh child.  Children
run with ``NUMBA_BOUNDSCHECK=1`` (own kernel cache): an out-of-range read in
a kernel is an ``IndexError`` the fuzzer counts, not a silent read.

``run`` drives it; ``bench/fault_bench.py`` and the slow tier call it.
A case is reproducible from ``(seed, case)``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

NAMESPACES = ("a", "b")
EDGES = [-(1 << 31), -(1 << 20), -2, -1, 0, 1, 2, 3, 15, 16, 17, 63, 64, 65, 1 << 16,
         (1 << 30) - 1, 1 << 30, (1 << 31) - 1]
#: How a case ends in the child: refused by which check, or drafted from.
OUTCOMES = ("refused_description", "refused_size", "refused_structure", "drafted",
            "check_error", "out_of_range", "draft_error")


def make_pool(path: Path, n: int = 60, seed: int = 0) -> None:
    """A pool of ``n`` sequences over two namespaces, its snapshot built in
    partitions (so the segment holds freed rows: the partitions' roots)."""
    from suffixspec.testing.crafted import DEPTH, HEAD

    from suffixspec.fingerprint import BYTES
    from suffixspec.pools.segments import write_snapshot
    from suffixspec.pools.store import PoolStore

    store = PoolStore(path, tokenizer=BYTES, max_depth=DEPTH)
    rng = np.random.default_rng(seed)
    store.add_many([(np.concatenate([HEAD, rng.integers(20, 70, 120)]).astype(np.int32),
                     NAMESPACES[i % 2], "", f"r{i}") for i in range(n)])
    write_snapshot(store, jobs=2)
    store.close()


# --------------------------------------------------------------------------
# Mutations: (arrays, raw description, rng) -> None, in place.
# --------------------------------------------------------------------------

def _lay():
    from suffixspec.native import layout
    return layout


#: Live nodes the drafts of a case walk through (near the roots, or labelled
#: from the sequences the prompts are cut from): set by ``Case``.
HOT = np.zeros(0, np.int64)


def _node_ids(nodes, rng, freed: bool | None = None) -> int:
    """A node: any, a freed one, or a live one (half the time one the drafts walk)."""
    lay = _lay()
    n = max(1, nodes.shape[0])
    if freed is None:
        return int(rng.integers(0, n))
    if not freed and HOT.size and rng.random() < 0.5:
        x = int(rng.choice(HOT))
        if x < nodes.shape[0]:
            return x
    pick = np.flatnonzero((nodes[:, lay.COUNT] == lay.FREED) == freed)
    return int(rng.choice(pick)) if pick.size else int(rng.integers(0, n))


def _value(arrays, rng) -> int:
    nodes = arrays["nodes"]
    n = nodes.shape[0]
    choice = int(rng.integers(0, 6))
    if choice == 0:
        return _node_ids(nodes, rng, freed=True)
    if choice == 1:
        return _node_ids(nodes, rng, freed=False)
    if choice == 2:
        return int(rng.choice([n - 1, n, n + 1, -1, -2]))
    if choice == 3:
        return int(rng.integers(-(1 << 31), 1 << 31))
    return int(rng.choice(EDGES))


def _clip(a, value):
    info = np.iinfo(a.dtype)
    return max(min(value, info.max), info.min)


def set_field(arrays, raw, rng):
    """One field of one array, anywhere."""
    names = ["nodes"] * 6 + ["hkeys", "hvals", "seqs", "roots", "meta", "arena"]
    name = names[int(rng.integers(0, len(names)))]
    a = arrays[name]
    if a.size == 0:
        return
    if name == "nodes":
        row = _node_ids(a, rng, freed=[None, True, False][int(rng.integers(0, 3))])
        a[row, int(rng.integers(0, a.shape[1]))] = _clip(a, _value(arrays, rng))
    elif name == "hkeys" and rng.random() < 0.5:  # a key naming another (parent, token)
        used = np.flatnonzero(a != _lay().EMPTY)
        if used.size:
            a[int(rng.choice(used))] = (np.int64(_value(arrays, rng) & 0x7FFFFFFF) << 32) | int(
                rng.integers(0, 80))
    else:
        flat = a.reshape(-1)
        flat[int(rng.integers(0, flat.size))] = _clip(a, _value(arrays, rng))


def plausible(arrays, raw, rng):
    """A change that keeps every link in place and reads as a real pool: a
    count, the most frequent child, an edge's length or start, a token, a
    sequence's length, a child table entry dropped, the tie order."""
    lay = _lay()
    nodes, arena, seqs = arrays["nodes"], arrays["arena"], arrays["seqs"]
    x = _node_ids(nodes, rng, freed=False)
    kind = int(rng.integers(0, 8))
    if kind == 0:
        nodes[x, lay.COUNT] = int(rng.choice([0, 1, 2, 1 << 20, (1 << 31) - 1]))
    elif kind == 1:  # another child of the same parent, or none
        p = nodes[x, lay.PARENT]
        if p >= 0:
            nodes[p, lay.BEST] = x if rng.random() < 0.8 else -1
    elif kind == 2:
        nodes[x, lay.LEN] = int(rng.choice([1, 2, -1, -2, 15, 16, -16]))
    elif kind == 3:
        nodes[x, lay.REF_POS] = max(0, nodes[x, lay.REF_POS] + int(rng.integers(-3, 4)))
    elif kind == 4:
        if arena.size:
            arena[int(rng.integers(0, arena.size))] = int(rng.integers(0, 256))
    elif kind == 5 and seqs.shape[0]:
        row = int(rng.integers(0, seqs.shape[0]))
        seqs[row, lay.SEQ_LEN] = int(rng.integers(0, seqs[row, lay.SEQ_CAP] + 1))
    elif kind == 6:
        used = np.flatnonzero(arrays["hkeys"] != lay.EMPTY)
        if used.size:
            arrays["hkeys"][int(rng.choice(used))] = lay.EMPTY
            arrays["meta"][lay.META_HASH_FILL] -= 1
    else:
        arrays["meta"][lay.META_TIES] = 1 - arrays["meta"][lay.META_TIES]


def link_to_freed(arrays, raw, rng):
    """A live node's link (or a child table entry) names a freed row made to mirror it."""
    lay = _lay()
    nodes = arrays["nodes"]
    x = _node_ids(nodes, rng, freed=False)
    f = _node_ids(nodes, rng, freed=True)
    if nodes[f, lay.COUNT] != lay.FREED:
        return
    field = [lay.PARENT, lay.BEST, lay.FIRST, lay.NEXT, lay.PREV, -1][int(rng.integers(0, 6))]
    if field == -1:  # a child table entry
        used = np.flatnonzero(arrays["hkeys"] != lay.EMPTY)
        if not used.size:
            return
        slot = int(rng.choice(used))
        child = arrays["hvals"][slot]
        nodes[f, lay.PARENT], nodes[f, lay.TOKEN] = nodes[child, lay.PARENT], nodes[child, lay.TOKEN]
        arrays["hvals"][slot] = f
    else:
        nodes[x, field] = f
        if field == lay.NEXT:
            nodes[f, lay.PREV], nodes[f, lay.PARENT] = x, nodes[x, lay.PARENT]
        elif field == lay.PREV:
            nodes[f, lay.NEXT], nodes[f, lay.PARENT] = x, nodes[x, lay.PARENT]
        elif field in (lay.FIRST, lay.BEST):
            nodes[f, lay.PARENT] = x
    # The freed row's own links: wild, looping, or copied from a live node.
    for g in (lay.FIRST, lay.BEST, lay.NEXT, lay.REF_SEQ, lay.REF_POS, lay.LEN):
        if rng.random() < 0.5:
            nodes[f, g] = _clip(nodes, _value(arrays, rng))


def free_live(arrays, raw, rng):
    """A live node freed in place (as the trie frees one, or only its count)."""
    lay = _lay()
    nodes = arrays["nodes"]
    x = _node_ids(nodes, rng, freed=False)
    if rng.random() < 0.5:
        nodes[x, :] = -1
        nodes[x, lay.NEXT] = arrays["meta"][lay.META_FREE_HEAD]
        arrays["meta"][lay.META_FREE_HEAD] = x
    nodes[x, lay.COUNT] = lay.FREED


def swap_rows(arrays, raw, rng):
    """Two rows of the nodes (or two fields of one row) swapped."""
    nodes = arrays["nodes"]
    x, y = _node_ids(nodes, rng), _node_ids(nodes, rng)
    if rng.random() < 0.5:
        nodes[[x, y]] = nodes[[y, x]]
    else:
        f, g = rng.integers(0, nodes.shape[1], 2)
        nodes[x, f], nodes[x, g] = nodes[x, g], nodes[x, f]


def resize(arrays, raw, rng):
    """An array cut short or grown (with zeros or -1), its description following."""
    name = ["nodes", "hkeys", "hvals", "seqs", "roots", "meta", "arena"][int(rng.integers(0, 7))]
    a = arrays[name]
    rows = a.shape[0]
    if rng.random() < 0.5 and rows > 1:
        b = a[: int(rng.integers(0, rows))].copy()
    else:
        extra = np.full((int(rng.integers(1, 9)),) + a.shape[1:], int(rng.choice([0, -1])),
                        a.dtype)
        b = np.concatenate([a, extra])
    arrays[name] = b
    raw["arrays"][name][1] = list(b.shape)


def edit_description(arrays, raw, rng):
    """The description alone: a shape read another way, a type, or the namespaces."""
    kind = int(rng.integers(0, 5))
    names = sorted(raw["arrays"])
    if kind == 0:  # same bytes, another row width
        name = names[int(rng.integers(0, len(names)))]
        dtype, shape, _ = raw["arrays"][name]
        total = int(np.prod(shape))
        width = int(rng.choice([1, 2, 5, 7, 10, 14]))
        if total % width == 0:
            raw["arrays"][name][1] = [total // width, width] if rng.random() < 0.7 else [total]
    elif kind == 1:  # another type over the same bytes
        name = names[int(rng.integers(0, len(names)))]
        dtype, shape, _ = raw["arrays"][name]
        other = {"<i4": "<i8", "<i8": "<i4"}.get(dtype, "<i4")
        ratio = np.dtype(dtype).itemsize / np.dtype(other).itemsize
        new_shape = list(shape)
        new_shape[-1] = int(new_shape[-1] * ratio)
        raw["arrays"][name][:2] = [other, new_shape]
    elif kind == 2:  # a namespace moved to another tree, past the roots or onto its neighbour's
        ns = NAMESPACES[int(rng.integers(0, 2))]
        raw["namespaces"][ns] = int(rng.choice([0, 1, 2, 7, 1 << 20]))
    elif kind == 3:  # a namespace added, aliased to another's tree
        raw["namespaces"]["c"] = raw["namespaces"][NAMESPACES[int(rng.integers(0, 2))]]
    else:  # a namespace dropped
        raw["namespaces"].pop(NAMESPACES[int(rng.integers(0, 2))], None)


MUTATIONS = {"set_field": (set_field, 6), "plausible": (plausible, 4), "link_to_freed": (link_to_freed, 4),
             "free_live": (free_live, 2), "swap_rows": (swap_rows, 2), "resize": (resize, 1),
             "edit_description": (edit_description, 2)}


def mutate(arrays: dict, raw: dict, rng) -> list[str]:
    """Apply one to three mutations drawn by weight; returns their names."""
    names = list(MUTATIONS)
    weights = np.array([MUTATIONS[k][1] for k in names], float)
    done = []
    for _ in range(int(rng.integers(1, 4))):
        name = names[int(rng.choice(len(names), p=weights / weights.sum()))]
        try:
            MUTATIONS[name][0](arrays, raw, rng)
        except (IndexError, ValueError, KeyError):
            continue  # does not apply after an earlier one (an array cut short)
        done.append(name)
    return done


# --------------------------------------------------------------------------
# One case, in a child.
# --------------------------------------------------------------------------

class Case:
    """The intact segment of a pool, and one mutated case of it at a time."""

    def __init__(self, pool: Path):
        import copy

        from suffixspec.testing.crafted import DEPTH

        from suffixspec.pools import files
        from suffixspec.pools.store import PoolStore

        store = PoolStore(pool, readonly=True)
        self.segment = store.snapshot().segments[0]
        arrays, _, _ = files.open_arrays(store.snapshot_folders / self.segment.folder,
                                         self.segment.arrays)
        self.arrays = {k: np.array(v) for k, v in arrays.items()}
        store.close()
        self.depth = DEPTH
        self.copy = copy.deepcopy
        seqs, arena = self.arrays["seqs"], self.arrays["arena"]
        self.prompts = []
        rng = np.random.default_rng(0)
        lay = _lay()
        nodes = self.arrays["nodes"]
        roots = set(self.arrays["roots"][self.arrays["roots"] >= 0].tolist())
        hot = (nodes[:, lay.COUNT] >= 0) & ((nodes[:, lay.REF_SEQ] < 6)
                                            | np.isin(nodes[:, lay.PARENT], list(roots)))
        global HOT
        HOT = np.flatnonzero(hot)
        for row in seqs[:6]:
            off, length = int(row[0]), int(row[1])
            cut = int(rng.integers(4, max(5, length - 8)))
            self.prompts.append(arena[off: off + cut].tolist())

    def run(self, seed: int, case: int) -> tuple[str, list[str], str]:
        """(outcome, mutations, what went wrong when it did)."""
        from suffixspec.pools.records import Segment
        from suffixspec.pools.validate import SegmentError, check_segment

        rng = np.random.default_rng([seed, case])
        arrays = {k: v.copy() for k, v in self.arrays.items()}
        raw = self.copy(self.segment.to_dict())
        done = mutate(arrays, raw, rng)
        try:
            seg = Segment.parse(raw)
        except ValueError:
            return "refused_description", done, ""
        mine = {}
        for name, (dtype, shape, _) in seg.arrays.items():  # as files.open_arrays reads them
            data = np.ascontiguousarray(arrays[name]).tobytes()
            dt = np.dtype(dtype)
            if len(data) != int(np.prod(shape)) * dt.itemsize:
                return "refused_size", done, ""
            mine[name] = np.frombuffer(data, dt).reshape(shape).copy()
        try:
            check_segment(mine, self.depth, seg.namespaces, None)
        except SegmentError:
            return "refused_structure", done, ""
        except Exception as e:  # the check itself must not fail another way
            return "check_error", done, f"{type(e).__name__}: {e}"
        try:
            self.draft(seg, mine)
        except IndexError as e:
            return "out_of_range", done, f"IndexError: {e}"
        except Exception as e:
            return "draft_error", done, f"{type(e).__name__}: {e}"
        return "drafted", done, ""

    def draft(self, seg, arrays) -> int:
        """Path and tree drafts in each namespace from a pool of this one segment;
        returns the tokens drafted."""
        from suffixspec import SuffixProposer
        from suffixspec.index import SuffixIndex
        from suffixspec.pools.memory import CrossPool
        from suffixspec.pools.view import MappedSegment, PoolView

        pool = CrossPool(self.depth, None)
        pool.view = PoolView(1, (MappedSegment(seg, SuffixIndex.from_arrays(arrays,
                                                                           self.depth)),))
        drafted = 0
        for tree in (False, True):
            for ns in NAMESPACES:
                prop = SuffixProposer(max_depth=self.depth, max_spec_tokens=8, tree=tree,
                                      pool=pool, namespace=ns)
                for n, prompt in enumerate(self.prompts):
                    prop.start_request(n, prompt)
                    for _ in range(3):
                        d = prop.propose([n])[0]
                        drafted += len(d.token_ids)
                        prop.extend(n, d.token_ids[:2].tolist() or [7])
        return drafted


def child_main() -> None:
    """``python -m suffixspec.testing.segment_fuzz POOL SEED FIRST LAST TIMEOUT``: cases ``FIRST..LAST-1``;
    each named on stderr before it runs, one JSON line per case on stdout."""
    pool, seed, first, last, timeout = sys.argv[1], *map(int, sys.argv[2:6])
    case = Case(Path(pool))
    drafted = case.draft(case.segment, case.arrays)  # compiles the kernels before any case
    assert drafted > 0, "the intact segment drafts nothing"
    for k in range(first, last):
        print(f"case {k}", file=sys.stderr, flush=True)
        signal.alarm(timeout)  # a hang ends the child: SIGALRM
        outcome, done, why = case.run(seed, k)
        signal.alarm(0)
        print(json.dumps([k, outcome, done, why]), flush=True)


# --------------------------------------------------------------------------
# The driver.
# --------------------------------------------------------------------------

#: Where the bounds-checked kernels are cached: never the ordinary cache.
CACHE = Path(tempfile.gettempdir()) / f"suffixspec-numba-boundscheck-{os.getuid()}"


def run(pool: Path, cases: int, seed: int = 0, batch: int = 2000, timeout: int = 20,
        cache_dir: Path = CACHE, progress=None) -> dict:
    """Run ``cases`` cases in children; returns the counts and the failing cases."""
    env = dict(os.environ, NUMBA_BOUNDSCHECK="1", NUMBA_CACHE_DIR=str(cache_dir))
    counts = dict.fromkeys(OUTCOMES + ("signals", "hangs"), 0)
    by_mutation: dict[str, dict[str, int]] = {}
    failures = []
    started = time.monotonic()
    k = 0
    while k < cases:
        last = min(cases, k + batch)
        proc = subprocess.run([sys.executable, "-m", "suffixspec.testing.segment_fuzz", str(pool),
                               str(seed), str(k), str(last), str(timeout)],
                              capture_output=True, text=True, env=env,
                              timeout=timeout * (last - k) + 600)
        done_upto = k
        for line in proc.stdout.splitlines():
            case, outcome, done, why = json.loads(line)
            counts[outcome] += 1
            for name in set(done):
                row = by_mutation.setdefault(name, dict.fromkeys(OUTCOMES, 0))
                row[outcome] += 1
            if outcome in ("check_error", "out_of_range", "draft_error"):
                failures.append({"case": case, "outcome": outcome, "mutations": done,
                                 "why": why[:300]})
            done_upto = case + 1
        if proc.returncode > 0:
            raise RuntimeError(f"the fuzzer's child failed (exit {proc.returncode}): "
                               f"{proc.stderr[-2000:]}")
        if proc.returncode < 0:
            named = [ln for ln in proc.stderr.splitlines() if ln.startswith("case ")]
            if not named or int(named[-1].split()[1]) != done_upto:
                raise RuntimeError(f"the fuzzer's child failed outside a case "
                                   f"(exit {proc.returncode}): {proc.stderr[-2000:]}")
            kind = "hangs" if proc.returncode == -signal.SIGALRM else "signals"
            counts[kind] += 1
            failures.append({"case": done_upto, "outcome": kind,
                             "why": f"exit {proc.returncode}"})
            done_upto += 1
        k = done_upto
        if progress is not None:
            progress(k, counts)
    return {"seed": seed, "cases": cases, "seconds": round(time.monotonic() - started, 1),
            "counts": counts, "by_mutation": by_mutation, "failures": failures[:50]}


if __name__ == "__main__":
    child_main()
