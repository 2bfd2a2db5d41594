"""``DeviceSuffixSpeculator``: ``method: "suffixspec"`` on Model Runner V2, drafting on the device.

vLLM >= 0.34 builds it through its speculator registry (``speculator_config``)
with ``init_speculator(vllm_config, device, req_states=...)`` and tells it of
requests through ``BaseSpeculator``'s own hooks; no vLLM name is rebound.
It is vLLM's face of ``suffixspec.device.drafter.DeviceDrafter``, which
drafts (and which the replay engine ``suffixspec-device`` drives too):

* ``add_request(slot)``: a request took a slot (a new one, or one resumed
  after preemption);
* ``propose(...)``: the step's drafts for the batch, at most this call's
  ``num_speculative_tokens`` (vLLM's dynamic speculation) and never past
  ``max_model_len``, with per-slot confidences for adaptive verification
  (``draft_token_confidence_probs``; vLLM trims drafts by them when
  ``enable_adaptive_verification`` is set, else it verifies all ``k``);
* ``on_requests_finished(ids)``: before their slots are freed, finished
  requests' outputs go to the pool.  vLLM's worker is not told whether a
  request ended by itself or was aborted: both are learned (an aborted
  output is still the model's own text).  A preempted request is never
  reported; resumed, it starts over (``add_request``).
* ``reset_state()``: warmup is over.  Warmup's requests (ids
  ``_...warmup...``) draft like any but never reach the feeder, so nothing
  of them reaches the pool, the calibration or the host's windows; this
  clears what they left on the device.

With tensor parallelism rank 0 alone runs the feeder and touches the pool;
every rank applies rank 0's payload (one broadcast a step), so all draft
alike.  Data-parallel replicas are separate engines: each drafts alone, and
they share the pool file.  No hook tells a speculator of shutdown: it closes
at interpreter exit (``atexit``), what requests in flight emitted joining
the pool.

It has run on an H100 in ``bench/device_check.py`` (a synthetic MRV2 loop),
not yet in a vLLM server on a GPU.  In the tests it runs on CPU tensors
through vLLM 0.34's own config, ``init_speculator``, ``RequestState`` and
``InputBatch`` (``tests/test_vllm034.py``).
"""

from __future__ import annotations

import atexit
import functools
import logging
import weakref

import torch

try:
    from vllm.v1.worker.gpu.spec_decode.speculator import BaseSpeculator
except ImportError:  # no vLLM (the device check on a bare GPU machine): the same methods
    BaseSpeculator = object

from suffixspec.device.drafter import DeviceDrafter
from suffixspec.integrations.vllm.build import (device_proposer, engine_token_kinds,
                                                pool_tokenizer, proposer_config,
                                                tensor_parallel_group)
from suffixspec.integrations.vllm.prometheus import Publisher, announce
from suffixspec.integrations.vllm.settings import Settings
from suffixspec.kernels import BackgroundStart, from_cache

logger = logging.getLogger("vllm.suffixspec")


class DeviceSuffixSpeculator(BaseSpeculator):
    """See the module docstring.  ``tp_group``: the tensor-parallel group
    (default: vLLM's, where it has more than one rank); ``start``: build the
    proposer now (else call ``start``)."""

    supports_mm_inputs = False
    draft_logits = None
    #: Ranks agree by rank 0's payload: tensor parallelism is served.
    broadcasts = True

    def __init__(self, vllm_config, device: torch.device, req_states, tp_group=None,
                 start: bool = True):
        spec = vllm_config.speculative_config
        model = vllm_config.model_config
        self.req_states = req_states
        self.settings = settings = Settings.from_env(
            options=getattr(spec, "speculator_options", None))
        config, _ = proposer_config(spec, settings)
        # vLLM trims each draft by its confidences when asked to (else it verifies all k).
        self.enable_adaptive_verification = bool(getattr(spec, "enable_adaptive_verification",
                                                         False))
        self.vocab_size = int(model.get_vocab_size())
        self.drafter = DeviceDrafter(
            config, req_states, k=int(spec.num_speculative_tokens), vocab_size=self.vocab_size,
            slots=int(vllm_config.scheduler_config.max_num_seqs),
            max_len=int(model.max_model_len), device=device,
            tp=tp_group if tp_group is not None else tensor_parallel_group(),
            arbiter=settings.device_arbiter, live=settings.device_live,
            cuda_graphs=settings.cuda_graphs, feeder_process=settings.device_feeder_process,
            logger=logger)
        self.draft_token_confidence_probs = self.drafter.out.conf
        self._start = None
        self._closed = False
        self.publisher = None
        announce("suffixspec", "mrv2", bool(getattr(vllm_config.scheduler_config,
                                                    "async_scheduling", False)))
        if self.drafter.feeder is None:  # a rank after the first: it applies rank 0's work
            return
        self.publisher = Publisher(self.stats)
        self._tokenizer = pool_tokenizer(model, settings, config)
        self._model = model
        atexit.register(_close_at_exit, weakref.ref(self))
        if start:
            self.start()

    def start(self, wait: bool = False) -> None:
        """Build the proposer (the kernels compile in the background on a cold
        cache, unless ``wait``; until then the device drafts from its own tiers)."""
        from suffixspec.native.warmup import DEVICE, SERVING

        drafter = self.drafter

        def begin():
            ranks = drafter.tp.world_size if drafter.tp is not None else 1
            drafter.ready_with(functools.partial(
                device_proposer, drafter.config, self.settings, self._tokenizer,
                engine_token_kinds(self._model, self.settings), drafter.k, ranks))

        if wait or from_cache(SERVING + DEVICE):  # the device's kernels too, else in the background
            begin()
        else:
            self._start = BackgroundStart(lambda s: begin(), logger, SERVING + DEVICE).start()

    # ---------------------------------------------------------- BaseSpeculator
    def init_cudagraph_manager(self, cudagraph_mode) -> None:
        del cudagraph_mode  # drafts eagerly after sampling, as vLLM's own suffix drafter

    def capture(self) -> None:
        return None

    def load_model(self, *args, **kwargs) -> None:
        """Nothing to load: drafts come from the tries."""

    def update_max_model_len(self, max_model_len: int) -> None:
        """No draft reaches past ``max_model_len`` (vLLM may lower it after start)."""
        self.drafter.max_len = int(max_model_len)

    def add_request(self, req_index: int) -> None:
        rs = self.req_states
        req_id = rs.index_to_req_id[req_index]
        self.drafter.add(req_id, req_index, int(rs.prompt_len.np[req_index]),
                         learn=not is_warmup(req_id))

    def on_requests_finished(self, finished_req_ids) -> None:
        self.drafter.finish([r for r in sorted(finished_req_ids) if not is_warmup(r)])

    def reset_state(self) -> None:
        self.drafter.reset()

    @torch.inference_mode()
    def propose(self, input_batch, attn_metadata, slot_mappings, last_hidden_states,
                aux_hidden_states, num_sampled, num_rejected, last_sampled, next_prefill_tokens,
                temperature, seeds, *args, dummy_run: bool = False, is_profile: bool = False,
                num_speculative_tokens: int | None = None, **kwargs) -> torch.Tensor:
        n = input_batch.num_reqs
        if dummy_run or is_profile or n == 0:
            return self.drafter.out.drafts[:n]
        out = self.drafter.step(input_batch.req_ids[:n], input_batch.idx_mapping,
                                input_batch.idx_mapping_np, num_sampled,
                                limit=num_speculative_tokens)
        return out.drafts

    # ------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """What requests in flight emitted joins the pool; the feeder stops and the
        pool closes.  Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._start is not None:
            self._start.stop()
        self.drafter.close()
        if self.publisher is not None:
            self.publisher.close()

    def stats(self) -> dict:
        """Counters for tests and tools."""
        return self.drafter.stats()


def is_warmup(req_id: str) -> bool:
    """Whether ``req_id`` names one of vLLM's warmup requests (``_warmup_3_``,
    ``_context_warmup_0_``, ``_v2_mixed_warmup_prefill_0_``...): vLLM's own
    request ids never start with ``_``."""
    return req_id.startswith("_") and "warmup" in req_id


def _close_at_exit(ref) -> None:
    speculator = ref()
    if speculator is not None:
        speculator.close()
