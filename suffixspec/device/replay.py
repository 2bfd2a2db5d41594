"""The replay engine ``suffixspec-device``: drafting on the device, as serving would.

Every step drafts with ``draft_ref.draft_step`` on CPU tensors, from the
windows the host built at the *previous* step (the feeder's windows are one
step old when the device uses them), and from the request's own history.
Between steps the host indexes what was emitted, scores the device's drafts
(calibration learns from them, ``SuffixProposer.adopt_drafts``; the arbiter
from the pairs the device kept, ``adopt_pairs``) and builds the
next windows from the context as it is now.  So replay measures what the
staleness of windows costs against drafting on the host, before any kernel
or engine work (``bench/device_gate.py``).
"""

from __future__ import annotations

from typing import Hashable, Sequence

import numpy as np
import torch

from suffixspec.draft import Draft
from suffixspec.native import arbiter, calibration as cal
from suffixspec.native import layout as lay
from suffixspec.native.warmup import warmup
from suffixspec.native import vllm_suffix as gpu
from suffixspec.proposer import SuffixProposer
from suffixspec.tokens import as_token_ids
from suffixspec.device.draft_ref import (FROM_CORPUS, FROM_FAMILY, FROM_LIVE, FROM_SCAN, FROM_SHORT,
                                         StepOutputs, context_tail, draft_step)
from suffixspec.device.corpus import (LiveCorpus, OneTokenPaths, corpus_on_host,
                                      family_scan_on_host, scan_on_host)
from suffixspec.device.fit import fit_batch
from suffixspec.device.layout import (Calibration, DeviceWindows, WindowSpec, family_row,
                                      family_width)


class DeviceWindowsProposer:
    """Drafts as ``suffixspec.device`` does on a GPU, behind the proposer protocol.

    ``stale``: steps between building windows and drafting from them (1, as
    serving; 0 drafts from windows of the same step).  ``branch_points``:
    branch windows per request.  ``scan``: the own-history candidate.
    ``arbiter``: the device arbitrates from the host's table
    (``arbitrate``, ``arbiter.preferred``; on by default, as
    ``SUFFIXSPEC_DEVICE_ARBITER``).  ``family``: each slot's family row
    (``layout.family_row``; the spec's width, by default the proposer's
    ``family_outputs``).  ``live``: the open outputs of the other requests
    in flight as a corpus (``corpus.LiveCorpus``; as ``SUFFIXSPEC_DEVICE_LIVE``,
    where past outputs are kept).  The remaining settings are
    ``SuffixProposer``'s (the host policy).  A ``step_cost`` with ``admit``
    (a GPU ``Roofline``) fits each step's drafts to it on the device
    (``fit.fit_batch``), as the host proposer does.
    """

    def __init__(self, spec: WindowSpec | None = None, stale: int = 1, branch_points: int = 4,
                 scan: bool = True, slots: int = 8, max_len: int = 4096,
                 corpus_tokens: int = 1 << 20, vocab_size: int = 1 << 18,
                 arbiter: bool = True, family: bool = True, live: bool = True, **settings):
        self.host = SuffixProposer(**settings)
        warmup(steps=("windows",))
        k = self.host.max_spec_tokens
        self.spec = spec or WindowSpec(
            k=k, family=family_width(self.host.requests.family_outputs) if family else 0)
        if self.spec.k != k:
            raise ValueError(f"window spec drafts {self.spec.k} tokens, the proposer {k}")
        if stale not in (0, 1):
            raise ValueError("stale must be 0 or 1")
        self.stale = stale
        self.branch_points = branch_points
        self.use_scan = scan
        self.arbiter = arbiter
        self.max_spec_tokens = k
        self.calibration = Calibration(dtype=torch.float64,
                                       vocab=int(self.host.stats.kinds.shape[0]))
        self.calibration.table = torch.from_numpy(self.host.stats.table)  # shared, learned here
        self.calibration.set_kinds(self.host.stats.kinds)
        self._slot: dict[Hashable, int] = {}
        self._free = list(range(slots - 1, -1, -1))
        self._emitted: dict[Hashable, int] = {}
        self._alloc(slots, max_len)
        self._staged = lay.windows(slots, self.spec.rows, self.spec.width)
        self.counts = dict.fromkeys(("window", "scan", "corpus", "live", "short", "family",
                                     "none"), 0)
        self.corpus = np.full(max(corpus_tokens, 0), -1, np.int32)
        self.table = np.full((2, gpu.buckets_for(corpus_tokens) if corpus_tokens else 1,
                              gpu.SLOTS), -1, np.int64)
        self.head = np.zeros(2, np.int64)
        self._prompt_len: dict[Hashable, int] = {}
        self.short = OneTokenPaths(vocab_size, self.spec.k)
        self.live = LiveCorpus(slots, 2 * (k + 1)) if live and corpus_tokens else None
        self._changed: list[np.ndarray] = []  # tokens whose one-token paths changed

    @property
    def step_cost(self):
        return self.host.step_cost

    @step_cost.setter
    def step_cost(self, cost) -> None:
        self.host.step_cost = cost

    def _alloc(self, slots: int, max_len: int) -> None:
        old = getattr(self, "hist", None)
        hist = np.zeros((slots, max_len), np.int32)
        total = np.zeros(slots, np.int32)
        windows = DeviceWindows(self.spec, slots)
        if old is not None:
            n, m = old.shape
            hist[:n, :m] = old
            total[:n] = self.total
            for name in ("tokens", "c", "n", "meta", "epoch", "last_valid", "recent", "start",
                         "family", "family_len"):
                getattr(windows, name)[:n] = getattr(self.windows, name)[:n]
        self.hist, self.total, self.windows = hist, total, windows
        if getattr(self, "live", None) is not None:
            self.live.grow(slots)
        self.out = StepOutputs.empty(slots, self.spec.k)

    # ------------------------------------------------------------ lifecycle
    def start_request(self, req_id, prompt_token_ids) -> None:
        prompt = as_token_ids(prompt_token_ids)
        self.host.start_request(req_id, prompt)
        if not self._free:
            n = self.hist.shape[0]
            self._alloc(2 * n, self.hist.shape[1])
            self._free = list(range(2 * n - 1, n - 1, -1))
            self._staged = lay.windows(2 * n, self.spec.rows, self.spec.width)
        slot = self._free.pop()
        self._slot[req_id] = slot
        self.total[slot] = 0
        self.windows.reset(slot, prompt.shape[0])
        row = family_row(self.host.family_outputs(req_id), self.spec.family)
        self.windows.family[slot, :row.shape[0]] = torch.from_numpy(row)
        self.windows.family_len[slot] = row.shape[0]
        self._append(slot, prompt)
        if self.live is not None:
            self.live.start(slot, prompt.shape[0])
        self._emitted[req_id] = 1
        self._prompt_len[req_id] = prompt.shape[0]
        if self.stale:  # windows ready before the first step, as the feeder builds them
            self._build([req_id])

    def _append(self, slot: int, tokens: np.ndarray) -> None:
        n = int(self.total[slot])
        need = n + tokens.shape[0]
        if need > self.hist.shape[1]:
            self._alloc(self.hist.shape[0], max(2 * self.hist.shape[1], need))
        self.hist[slot, n:need] = tokens
        self.total[slot] = need

    def extend(self, req_id, token_ids) -> None:
        tokens = as_token_ids(token_ids)
        self.host.extend(req_id, tokens)
        slot = self._slot[req_id]
        if tokens.shape[0]:
            # The output grows in the pool: the paths of its tokens, and of the
            # ``k`` before them (a path is ``k`` tokens long), change.
            end = int(self.total[slot])
            self._changed.append(self.hist[slot, max(end - self.spec.k, 0):end])
            self._changed.append(tokens)
        self._append(slot, tokens)
        self._emitted[req_id] = max(tokens.shape[0], 1)

    def finish_request(self, req_id) -> None:
        self.host.finish_request(req_id)
        slot = self._slot[req_id]
        if self.corpus.shape[0]:
            start = max(self._prompt_len[req_id] - gpu.PROMPT_CONTEXT, 0)
            gpu.ingest(self.corpus, self.table, self.head, self.hist[slot], start,
                       int(self.total[slot]))
        self._release(req_id)

    def abort_request(self, req_id) -> None:
        self.host.abort_request(req_id)
        self._release(req_id)

    def _release(self, req_id) -> None:
        self._free.append(self._slot.pop(req_id))
        del self._emitted[req_id], self._prompt_len[req_id]

    def index_memory(self):
        return self.host.index_memory()

    # ------------------------------------------------------------- drafting
    def _build(self, req_ids) -> None:
        """Windows for ``req_ids`` from their contexts now (the feeder's work)."""
        b = len(req_ids)
        staged = self._staged
        self.host.candidate_windows(req_ids, staged, self.branch_points)
        slots = torch.as_tensor([self._slot[r] for r in req_ids], dtype=torch.int64)
        w = self.windows
        w.tokens[slots] = torch.from_numpy(staged.tokens[:b])
        w.c[slots] = torch.from_numpy(staged.c[:b])
        w.n[slots] = torch.from_numpy(staged.n[:b])
        w.meta[slots] = torch.from_numpy(staged.meta[:b])

    def propose(self, req_ids: Sequence[Hashable], max_spec_tokens=None) -> list[Draft]:
        b = len(req_ids)
        if b == 0:
            return []
        if not self.stale:
            self._build(req_ids)
            self._update_short()
        host = self.host
        fitted = getattr(host.step_cost, "admit", None) is not None
        if fitted:  # candidates as long as they go; the fit prices the batch (as the host's)
            host.stats.state[cal.ST_COST] = 0.0
        thr = 0.0 if fitted else float(cal.threshold(host.stats.state))
        self.calibration.params[:] = torch.as_tensor(self.calibration.host_params(
            host.stats.state, max(thr, host.min_token_prob), host.max_spec_factor,
            host.max_spec_offset, host.max_depth, host.config.newest_window > 0,
            self.arbiter and host.config.arbitrate), dtype=torch.float64)
        self.calibration.prefer[:] = torch.from_numpy(arbiter.preferred(host.pending.arbiter))
        slots = np.array([self._slot[r] for r in req_ids], np.int64)
        sampled = torch.as_tensor([self._emitted[r] for r in req_ids], dtype=torch.int64)
        depth = self.spec.scan_depth
        scan = (scan_on_host(self.hist, self.total, slots, depth) if self.use_scan
                else (torch.zeros(b, dtype=torch.int64),) * 2)
        family = (family_scan_on_host(self.windows.family.numpy(),
                                      self.windows.family_len.numpy(), self.hist, self.total,
                                      slots, depth) if self.spec.family else None)
        corpus = corpus_on_host(self.hist, self.total, slots, self.corpus, self.table,
                                depth, self.spec.k)
        live = None
        if self.live is not None:  # the open outputs' draft, a candidate of its own
            self.live.tick()
            hist_t, total_t, slots_t = (torch.from_numpy(self.hist), torch.from_numpy(self.total),
                                        torch.from_numpy(slots))
            self.live.index(hist_t, total_t, slots_t)
            tail = context_tail(hist_t, total_t[slots_t].to(torch.int64), max(depth, 4), slots_t)
            live = self.live.draft(hist_t, total_t, slots_t, tail, depth, self.spec.k)
        out = draft_step(torch.from_numpy(self.hist), torch.from_numpy(self.total),
                         torch.from_numpy(slots), sampled, self.windows, self.calibration,
                         self.spec.k, host.vocab_size or (1 << 31) - 1, self.out, scan=scan,
                         corpus=corpus,
                         short=self.short.draft, family_scan=family, live=live)
        if self.arbiter:  # else the device keeps no pairs
            host.adopt_pairs(req_ids, out.pair.numpy(), out.pair_tokens.numpy())
        if fitted:
            fit_batch(out, host.step_cost)
            self.windows.last_valid[torch.from_numpy(slots)] = out.num_valid
        n = out.num_valid.numpy().astype(np.int64)
        if max_spec_tokens is not None:
            n = np.minimum(n, np.broadcast_to(np.asarray(max_spec_tokens), (b,)))
        tokens = out.drafts.numpy().astype(np.int32)
        probs = out.probs.numpy()
        choice = out.choice.numpy()
        match = out.match.numpy()
        host.adopt_drafts(req_ids, tokens, out.buckets.numpy(), n)
        if self.stale:  # for the next step
            self._build(req_ids)
            self._update_short()
        drafts = []
        for i in range(b):
            m = int(n[i])
            kind = ("none" if m == 0 else "scan" if choice[i] == FROM_SCAN
                    else "corpus" if choice[i] == FROM_CORPUS
                    else "short" if choice[i] == FROM_SHORT
                    else "family" if choice[i] == FROM_FAMILY
                    else "live" if choice[i] == FROM_LIVE else "window")
            self.counts[kind] += 1
            if m == 0:
                drafts.append(Draft(match_len=int(match[i])))
                continue
            p = probs[i, :m].copy()
            drafts.append(Draft(tokens[i, :m].copy(), np.arange(-1, m - 1, dtype=np.int32), p,
                                float(p.sum()), int(match[i]), kind))
        return drafts

    def _update_short(self) -> None:
        """One-token paths of the tokens that the pool's open outputs gained."""
        if not self._changed or self.short.vocab == 0:
            self._changed.clear()
            return
        tokens = np.concatenate(self._changed)
        self._changed.clear()
        self.short.update(*self.host.one_token_paths(self.spec.k, self.short.vocab,
                                                     tokens))
