"""``DeviceDrafter``: drafting on the device as an engine runs it, slot by slot, step by step.

One implementation of serving's drafting step, driven by two adapters: vLLM's
speculator for ``method: "suffixspec"``
(``integrations.vllm.device_speculator``) and the replay engine
``suffixspec-device`` (``device.replay``), so replay measures what serving
drafts.  An engine keeps its requests' tokens in slots (``states``, vLLM's
``RequestState`` or replay's stand-in: ``all_token_ids.gpu`` ``[slots,
max_len]``, ``total_len.gpu``, and on the host ``prompt_len.np``,
``prefill_len.np``, ``req_id_to_index``) and tells the drafter

* ``add``: a request took a slot (a new epoch for the slot; its prompt goes
  to the feeder at the next step, once the engine has written it);
* ``step``: draft for the batch.  It hands the feeder the new prompts,
  copies the newest payload the feeder packed to the device (with tensor
  parallelism, broadcast from rank 0), applies it, drafts from the windows,
  the request's own history and the device tiers (``draft_ref.draft_step``;
  on a GPU the Triton kernels, replayed as CUDA graphs per batch size),
  cuts each draft to the call's limit and the room before ``max_len``, and
  (rank 0) copies a snapshot of the step out for the feeder;
* ``finish``: requests ended, their slots not yet freed: their last tokens go
  to the feeder, which commits them to the pool;
* ``reset``: forget what the device state holds of requests so far.

The host's half, ``WindowFeeder`` (``device.feeder``), runs in a thread of
its own in serving and in the caller's thread in replay (``threaded``), one
step behind; with ``feeder_process`` in a process of its own
(``device.feeder_process``), which builds its proposer itself (``ready_with``).  A step reads none of its device values on the host; its one
wait is for the feeder's work on the previous step, bounded by
``deadline``.  Every copy the feeder reads (prompts, snapshots, finished
tails) lands in a host tensor of its own (pinned on a GPU, from torch's
caching host allocator), freed once the feeder is done with it: nothing the
feeder has not read is ever written over.  At most ``MAX_PENDING``
snapshots wait; past that a step is not learned from (counted).  A
payload built for a slot's earlier request never lands on it (epochs).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import torch

from suffixspec.config import ProposerConfig
from suffixspec.device.corpus import (DeviceCorpus, LiveCorpus, OneTokenPaths, corpus_on_host,
                                      family_scan_on_host, scan_on_host)
from suffixspec.device.draft_ref import (StepOutputs, context_tail, direct_sources, draft_step,
                                         fused_ref)
from suffixspec.device.feeder import WindowFeeder, snapshot_columns, snapshot_width
from suffixspec.device.feeder_process import FeederProcess
from suffixspec.device.graphs import Replay
from suffixspec.device.layout import Calibration, DeviceWindows, WindowSpec, family_width
from suffixspec.device.payload import Packer, PayloadSpec, apply, views
from suffixspec.native import calibration as cal

#: Seconds a step waits, at most, for the feeder's work on the previous step.
DEADLINE = 0.002
#: Tokens of the pool's newest outputs on the device (the corpus tier).
CORPUS_TOKENS = 1 << 20
#: Snapshots waiting for the feeder, at most; a step past that is not learned from.
MAX_PENDING = 64
#: Last tokens of a finished request copied for the feeder.
TAIL = 256


class DeviceDrafter:
    """See the module docstring.

    ``config``: the host policy's settings; ``k`` the longest draft;
    ``vocab_size`` the token ids a draft may hold; ``slots`` the engine's;
    ``max_len`` the longest a request may grow (``update``-able);
    ``corpus_tokens`` the corpus tier's size (0: none); ``tp``: a
    tensor-parallel group (``rank_in_group``, ``broadcast``), None alone;
    ``arbiter``, ``live``, ``cuda_graphs``: the device's options (``Settings``);
    ``family``, ``one_token_paths``: the family rows and the one-token paths
    tier (on where the pool is); ``branch_points``: branch windows per request;
    ``fit``: a function that cuts each step's drafts further (replay's GPU
    roofline model), before they are scored; ``logger``: where failures are said.
    """

    def __init__(self, config: ProposerConfig, states, *, k: int, vocab_size: int, slots: int,
                 max_len: int, device, corpus_tokens: int = CORPUS_TOKENS, tp=None,
                 arbiter: bool = True, live: bool = True, family: bool = True,
                 one_token_paths: bool = True, branch_points: int = 4,
                 cuda_graphs: bool = True, threaded: bool = True,
                 feeder_process: bool = False,
                 fit: Callable[[StepOutputs], None] | None = None,
                 logger: logging.Logger | None = None):
        self.config = config
        self.states = states
        self.k = k
        self.vocab_size = vocab_size
        self.slots = slots
        self.max_len = int(max_len)
        self.device = device = torch.device(device)
        self.tp = tp
        self.leader = tp is None or tp.rank_in_group == 0
        self.fit = fit
        self.logger = logger or logging.getLogger("suffixspec.device")
        self.deadline = DEADLINE
        self.feeder_process = feeder_process
        # Family rows where past outputs are kept (the proposer keeps families there).
        pooled = config.cross_pool_tokens != 0
        self.window_spec = WindowSpec(k=k, family=family_width(config.family_outputs)
                                      if pooled and family else 0)
        self.payload_spec = PayloadSpec(self.window_spec, rows=min(slots, 64))
        self.windows = DeviceWindows(self.window_spec, slots, device)
        self.calibration = Calibration(device, vocab=vocab_size)
        self.corpus = DeviceCorpus(corpus_tokens if pooled else 0, device)
        self.paths = OneTokenPaths(vocab_size if one_token_paths else 0, k, device)
        # The other requests' open outputs, where the host would draft from them (its
        # pool): a candidate of their own (on whenever the corpus is).
        self.live = None
        if (pooled and live and self.corpus.capacity > 1
                and LiveCorpus.fits(states.all_token_ids.gpu.shape[1])):
            self.live = LiveCorpus(slots, 2 * (k + 1), device=device)
        self.out = StepOutputs.empty(slots, k, device)
        self.payload = torch.zeros(self.payload_spec.size, dtype=torch.int32, device=device)
        # Until the first payload: the policy's settings, an empty calibration.
        state = cal.new_state(config.draft_cost)
        params = Calibration.host_params(state, float(cal.threshold(state)), config.spec_factor,
                                         float(config.max_spec_offset), config.max_depth,
                                         config.newest_window > 0, config.arbitrate and arbiter)
        self.calibration.params.copy_(torch.tensor(params))
        packer = Packer(self.payload_spec, trash_slot=slots, trash_key=vocab_size,
                        corpus_tokens=self.corpus.capacity, corpus_buckets=self.corpus.buckets)
        first = np.zeros(self.payload_spec.size, np.int32)  # what every rank applies first
        v = views(first, self.payload_spec)
        packer.clear(v)
        v["params"].view(np.float32)[:] = params
        self.payload.copy_(torch.from_numpy(first))
        self.epochs = np.zeros(slots + 1, np.int64)  # host mirror of the epochs
        self.steps = 0
        self.dropped_snapshots = 0  # steps not learned from: the feeder was MAX_PENDING behind
        cuda = device.type == "cuda"
        self._cuda = cuda
        if cuda:
            try:
                from suffixspec.device.draft_triton import (corpus_triton, family_scan_triton,
                                                            fused_triton, live_triton,
                                                            scan_triton)
            except ImportError as e:
                raise RuntimeError(f"drafting on the GPU needs Triton (pip install triton): "
                                   f"{e}") from None

            self._fused, self._scan, self._corpus_kernel = fused_triton, scan_triton, corpus_triton
            self._live_kernel, self._family_scan = live_triton, family_scan_triton
            self._side = torch.cuda.Stream(device)
            direct_sources(device)  # made here, not in a step (a copy from the host)
        else:  # CPU tensors are host memory: the tiers' Numba twins
            self._fused, self._scan, self._side = fused_ref, None, None
            self._family_views = (self.windows.family.numpy(), self.windows.family_len.numpy())
            self._corpus_views = (self.corpus.tokens[:max(self.corpus.capacity, 1)].numpy(),
                                  self.corpus.table.numpy())
            self.rebind()
        # Each step's inputs in fixed buffers, so that the step replays as a graph.
        self._idx = torch.zeros(slots, dtype=torch.int64, device=device)
        self._sampled = torch.zeros(slots, dtype=torch.int64, device=device)
        self._stage = torch.zeros(slots, snapshot_width(k), dtype=torch.int32,
                                  device=device)  # the step's snapshot, before it is copied out
        # The step's draft limits: the call's draft length, then max_len.
        self._limits = torch.tensor([k, self.max_len], dtype=torch.int64, device=device)
        self._limits_host = (k, self.max_len)
        self._cols = torch.arange(k, device=device)
        graphs = cuda and cuda_graphs
        self._draft_graphs = Replay(self._draft_on_device, device, enabled=graphs)
        self._apply_graph = Replay(self._apply, device, enabled=graphs)
        self._graph_failure_said = False
        self._prompts: list[tuple[str, int, int]] = []  # (request, slot, epoch) not yet sent
        self.feeder = None
        if not self.leader:
            return
        if feeder_process:
            self.feeder = FeederProcess(self.payload_spec, k, vocab_size, packer, params,
                                        branch_points=branch_points, arbiter=arbiter,
                                        logger=self.logger, on_built=self.calibration.set_kinds,
                                        lockstep=not threaded)
            self._host_payloads = [torch.from_numpy(b) for b in self.feeder.buffers]
            if cuda:
                pin(self._host_payloads, self.logger)
            return
        host = [torch.zeros(self.payload_spec.size, dtype=torch.int32, pin_memory=cuda)
                for _ in range(3)]
        self._host_payloads = host
        self.feeder = WindowFeeder(self.payload_spec, k, vocab_size, [b.numpy() for b in host],
                                   packer, params, branch_points=branch_points,
                                   arbiter=arbiter, threaded=threaded, logger=self.logger)

    def rebind(self) -> None:
        """On CPU tensors: read ``states``'s token rows where they are now (replay
        grows them)."""
        if not self._cuda:
            self._host_views = (self.states.all_token_ids.gpu.numpy(),
                                self.states.total_len.gpu.numpy())

    def ready(self, proposer) -> None:
        """The host policy is ready (its kernels compiled): the feeder follows the
        requests with ``proposer`` from now on."""
        if self.feeder_process:
            raise TypeError("a feeder process builds its own proposer: use ready_with(build)")
        proposer.vocab_size = self.vocab_size
        self.calibration.set_kinds(proposer.stats.kinds)
        self.feeder.ready(proposer)

    def ready_with(self, build: Callable) -> None:
        """As ``ready(build())``; a feeder in a process of its own builds the
        proposer there (``build``: picklable, no arguments)."""
        if self.feeder_process:
            self.feeder.ready(build)
        else:
            self.ready(build())

    # ----------------------------------------------------------- lifecycle
    def add(self, req_id: str, slot: int, prompt_len: int, learn: bool = True) -> None:
        """``req_id`` took ``slot`` (a new request, or one resumed after
        preemption): a new epoch for the slot.  Its prompt (and, resumed, what
        it emitted before) goes to the feeder at the next step, once the engine
        has written it; ``learn=False``: never (nothing of it is learned)."""
        self.epochs[slot] += 1
        epoch = int(self.epochs[slot])
        self.windows.epoch[slot] = epoch
        self.windows.reset(slot, prompt_len)
        if self.live is not None:
            self.live.start(slot, prompt_len)
        if self.feeder is not None and learn:
            self._prompts.append((req_id, slot, epoch))

    def finish(self, req_ids) -> None:
        """These requests ended, their slots not yet freed: their last tokens go to
        the feeder in stream order; it commits them to the pool.  A request no
        longer holding a slot (preempted, then ended) is forgotten, not learned."""
        if self.feeder is None:
            return
        self._send_prompts()  # those that end before their first step
        states = self.states
        rows, gone = [], []
        for req in req_ids:
            slot = states.req_id_to_index.get(req)
            (gone.append(req) if slot is None else rows.append((req, slot)))
        if gone:
            self.feeder.forget(gone)
        for at in range(0, len(rows), self.slots):
            part = rows[at:at + self.slots]
            slots = torch.tensor([s for _, s in part], dtype=torch.int64)
            slots = slots.to(self.device, non_blocking=True)
            total = states.total_len.gpu[slots].to(torch.int64)
            tail = context_tail(states.all_token_ids.gpu, total, TAIL, slots).flip(1)
            dev = torch.cat([total[:, None], tail.clamp(min=-1)], dim=1).to(torch.int32)
            host, event = self._copy_out(dev)
            self.feeder.finished([req for req, _ in part], host, event)

    def reset(self) -> None:
        """Forget what the device state holds of the requests so far (vLLM's
        warmup): their windows, last drafts and open outputs.  In place:
        recorded graphs hold these tensors."""
        self.windows.meta.zero_()
        self.windows.last_valid.zero_()
        self.windows.family_len.zero_()
        if self.live is not None:
            self.live.reset()
        self.out.num_valid.zero_()

    def close(self) -> None:
        """What requests in flight emitted is genuine model output: it joins the
        pool; the feeder stops and the pool closes."""
        if self.feeder is None:
            return
        self.feeder.close()
        self.feeder = None

    # ---------------------------------------------------------------- step
    def step(self, req_ids, idx: torch.Tensor, idx_np: np.ndarray, num_sampled: torch.Tensor,
             limit: int | None = None) -> StepOutputs:
        """Drafts for the batch: rows ``req_ids`` in slots ``idx`` (on the
        device; ``idx_np`` on the host), ``num_sampled`` tokens emitted per row
        by the last step (0: prefilling, no draft); at most ``limit`` tokens each
        (None: ``k``).  Returns the batch's rows of ``out``."""
        n = len(req_ids)
        self.steps += 1
        if self.feeder is not None:
            self._send_prompts()
        self._receive(self.steps)
        self._idx[:n].copy_(idx[:n], non_blocking=True)
        self._sampled[:n].copy_(num_sampled[:n], non_blocking=True)
        self._set_limits(self.k if limit is None else max(min(int(limit), self.k), 0))
        if self.live is not None:
            self.live.tick()
        if self._cuda:
            self._draft_graphs(n)
            self._say_graph_failure()
        else:
            self._draft_on_host(n, idx_np[:n])
        if self.feeder is not None:
            self._snapshot(req_ids, n)
        return self.out.rows(n)

    def _set_limits(self, cap: int) -> None:
        """The step's draft limits into their fixed buffer, when they change."""
        limits = (cap, self.max_len)
        if limits != self._limits_host:
            self._limits_host = limits
            self._limits.copy_(torch.tensor(limits, dtype=torch.int64), non_blocking=True)

    def _draft_on_device(self, n: int) -> None:
        """The step's device work (``Replay`` records it per batch size): drafts
        into ``out`` and the snapshot into ``_stage``, from the fixed buffers only."""
        rs = self.states
        idx = self._idx[:n]
        depth = self.window_spec.scan_depth
        corpus = live = None
        if self.corpus.capacity > 1:
            def corpus(tail):
                return self._corpus_kernel(self.corpus, tail, depth, self.k)
        if self.live is not None:
            def live(tail):  # the batch rows' new tokens, then the open outputs' draft
                self.live.index(rs.all_token_ids.gpu, rs.total_len.gpu, idx)
                return self._live_kernel(self.live, rs.all_token_ids.gpu, rs.total_len.gpu, idx,
                                         tail, depth, self.k)
        total = rs.total_len.gpu[idx]
        family = None
        if self.window_spec.family:
            family = self._family_scan(self.windows.family, self.windows.family_len,
                                       rs.all_token_ids.gpu, total, idx, depth)
        self._draft(n, self._scan(rs.all_token_ids.gpu, total, idx, depth), corpus, family,
                    live)

    def _draft_on_host(self, n: int, slots_np) -> None:
        """``_draft_on_device`` on CPU tensors, with the tiers' Numba twins."""
        depth = self.window_spec.scan_depth
        corpus = live = None
        if self.corpus.capacity > 1:
            corpus = corpus_on_host(*self._host_views, slots_np, *self._corpus_views, depth,
                                    self.k)
        if self.live is not None:  # the batch rows' new tokens, then the open outputs' draft
            rs = self.states
            live = self.live.index_and_draft(rs.all_token_ids.gpu, rs.total_len.gpu,
                                             self._idx[:n], depth, self.k)
        family = None
        if self.window_spec.family:
            family = family_scan_on_host(*self._family_views, *self._host_views, slots_np, depth)
        self._draft(n, scan_on_host(*self._host_views, slots_np, depth), corpus, family, live)

    def _draft(self, n: int, scan, corpus, family=None, live=None) -> None:
        rs = self.states
        slots = self._idx[:n]
        out = draft_step(rs.all_token_ids.gpu, rs.total_len.gpu, slots, self._sampled[:n],
                         self.windows, self.calibration, self.k, self.vocab_size, self.out,
                         scan=scan, scan_depth=self.window_spec.scan_depth, corpus=corpus,
                         short=self.paths.draft, family_scan=family, fused=self._fused,
                         live=live)
        # At most the call's limit, never past max_len.
        room = self._limits[1] - 1 - rs.total_len.gpu[slots].to(torch.int64)
        limit = torch.minimum(self._limits[0], room).clamp(min=0)
        keep = self._cols[None, :] < limit[:, None]
        out.num_valid.copy_(torch.minimum(out.num_valid.to(torch.int64), limit))
        out.conf.mul_(keep)
        out.probs.mul_(keep)
        out.buckets.mul_(keep)
        out.drafts.copy_(torch.where(keep, out.drafts, out.last[:, None]))
        if self.fit is not None:
            self.fit(out)
        self.windows.last_valid[slots] = out.num_valid
        if self.leader:
            self._stage_snapshot(n, out)

    def _say_graph_failure(self) -> None:
        failed = self._draft_graphs.failed or self._apply_graph.failed
        if failed is not None and not self._graph_failure_said:
            self._graph_failure_said = True
            self.logger.warning("suffixspec: recording the drafting step as a CUDA graph "
                                "failed; it runs kernel by kernel from now on: %r", failed)

    def _receive(self, step: int) -> None:
        """The feeder's newest payload to the device (rank 0), to every rank, applied."""
        if self.leader:
            b = self.feeder.take(step, self.deadline)
            if b is not None:
                self.payload.copy_(self._host_payloads[b], non_blocking=True)
                event = None
                if self._cuda:
                    event = torch.cuda.Event()
                    event.record()
                self.feeder.sent(b, event)
        if self.tp is not None:
            self.tp.broadcast(self.payload, src=0)
        self._apply_graph(0)

    def _apply(self, _key) -> None:
        apply(self.payload, self.payload_spec, self.windows, self.calibration, self.paths,
              self.corpus)

    def _stage_snapshot(self, n: int, out: StepOutputs) -> None:
        """The step's snapshot into ``_stage`` (device work only)."""
        k = self.k
        snap = self._stage[:n]
        rs = self.states
        slots = self._idx[:n]
        total = rs.total_len.gpu[slots]
        snap[:, 0] = slots
        snap[:, 1] = total
        snap[:, 2] = self._sampled[:n]
        snap[:, 3] = out.choice
        snap[:, 4] = out.num_valid
        tail = context_tail(rs.all_token_ids.gpu, total.to(torch.int64), k + 1, slots)
        col = snapshot_columns(k)
        snap[:, col["tail"]] = tail.flip(1).clamp(min=-1)
        snap[:, col["draft"]] = out.drafts
        snap[:, col["buckets"]] = out.buckets
        snap[:, col["pair"]] = out.pair
        snap[:, col["pair_tokens"]] = out.pair_tokens.flatten(1)

    def _snapshot(self, req_ids, n: int) -> None:
        """The staged snapshot, copied out behind an event, for the feeder (unless
        it is ``MAX_PENDING`` snapshots behind: this step is then not learned from)."""
        if self.feeder.pending_snapshots() >= MAX_PENDING:
            self.dropped_snapshots += 1
            return
        host, event = self._copy_out(self._stage[:n].clone())
        self.feeder.snapshot(self.steps, host, list(req_ids[:n]), event)

    def _send_prompts(self) -> None:
        """The prompts (and, for a resumed request, its output so far) of the
        requests that took a slot since the last call, to the feeder; those
        that lost their slot since are left out."""
        if not self._prompts:
            return
        states = self.states
        for req_id, slot, epoch in self._prompts:
            if states.req_id_to_index.get(req_id) != slot or self.epochs[slot] != epoch:
                continue
            length = int(states.prefill_len.np[slot])
            host, event = self._copy_out(states.all_token_ids.gpu[slot, :length])
            self.feeder.add(req_id, slot, epoch, host, int(states.prompt_len.np[slot]), event)
        self._prompts.clear()

    def _copy_out(self, dev: torch.Tensor):
        """``dev`` into a host tensor of its own (pinned on a GPU) on the side stream,
        after the work queued so far: the host tensor, and the event its reader
        waits on (None on CPU, where it is done).  Nothing else ever writes it."""
        if not self._cuda:
            return dev.clone(), None
        host = torch.empty(dev.shape, dtype=dev.dtype, pin_memory=True)
        side = self._side
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            host.copy_(dev, non_blocking=True)
            done = torch.cuda.Event()
            done.record(side)
        dev.record_stream(side)
        return host, done

    def stats(self) -> dict:
        """Counters for tests and tools."""
        out = {"steps": self.steps, "leader": self.leader,
               "dropped_snapshots": self.dropped_snapshots}
        if self.feeder is not None:
            s = self.feeder.stats
            out.update(snapshots=s.snapshots, windows_built=s.windows_built,
                       published=s.published, lost_requests=s.lost_requests,
                       stale_rows=s.stale_rows, feeder_seconds=s.seconds, **self.feeder.lag())
            prop = self.feeder.proposer
            if prop is not None and prop.cross is not None:
                out["cross_tokens"] = int(prop.cross.tokens)
            elif getattr(self.feeder, "cross_tokens", -1) >= 0:
                out["cross_tokens"] = self.feeder.cross_tokens
        return out


def pin(host: list[torch.Tensor], logger: logging.Logger) -> None:
    """Register ``host`` (shared, not torch's) as pinned memory, so that its
    copies to the device run asynchronously; where that fails they still
    copy, through a staging buffer.  Not yet run on a GPU."""
    try:
        cudart = torch.cuda.cudart()
        for t in host:
            err = cudart.cudaHostRegister(t.data_ptr(), t.numel() * t.element_size(), 0)
            if int(err) != 0:
                raise RuntimeError(f"CUDA error {err}")
    except Exception as exc:  # unpinned, the copies still run
        logger.warning("suffixspec: the feeder's shared buffers could not be pinned (%r); "
                       "their copies to the GPU wait for the host", exc)
