"""``SuffixSpecDrafter``: suffixspec behind vLLM's ``SuffixDecodingProposer`` (V1 runner, vLLM <= 0.33).

The V1 model runner calls ``propose`` once per step with its persistent
batch, whose rows move between steps; ``DraftService`` keys everything by
request id and reads each request's tokens from ``token_ids_cpu``.
"""

from __future__ import annotations

import logging

from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

from suffixspec.integrations.vllm.build import (build_proposer, engine_token_kinds,
                                                pool_tokenizer, proposer_config,
                                                tensor_parallel_group)
from suffixspec.integrations.vllm.prometheus import Publisher, announce
from suffixspec.integrations.vllm.v1_runner.hooks import install_runner_hooks
from suffixspec.integrations.vllm.v1_runner.service import NAMESPACE_ARG, DraftService, Step
from suffixspec.integrations.vllm.settings import Settings
from suffixspec.kernels import BackgroundStart, from_cache

logger = logging.getLogger("vllm.suffixspec")


class SuffixSpecDrafter(SuffixDecodingProposer):
    """Serves ``--speculative-config '{"method": "suffix", ...}'`` with suffixspec.

    ``num_speculative_tokens`` caps each draft; ``suffix_decoding_max_tree_depth``
    is the trie depth, and ``suffix_decoding_max_cached_requests`` bounds the
    in-memory cross-request pool (0 turns it off).
    ``suffix_decoding_max_spec_factor`` and ``suffix_decoding_min_token_prob``
    apply only when they differ from vLLM's defaults (1.0 and 0.1), since vLLM
    passes those whether or not a user set them.  Settings vLLM has no key
    for come from ``Settings`` (environment).
    """

    def __init__(self, vllm_config):  # no super().__init__: it builds arctic-inference's cache
        spec = vllm_config.speculative_config
        assert spec is not None, "speculative config must be set"
        model = vllm_config.model_config
        self.num_speculative_tokens = int(spec.num_speculative_tokens)
        self.max_num_batched_tokens = vllm_config.scheduler_config.max_num_batched_tokens
        settings = Settings.from_env()
        config, measured = proposer_config(spec, settings)
        # With tensor parallelism every rank runs a drafter, and the ranks must
        # verify the same drafts.  Only rank 0 drafts (and alone touches the
        # pool); the others take its drafts, one broadcast per step.
        self.tp = tensor_parallel_group()
        self.leader = self.tp is None or self.tp.rank_in_group == 0
        # Drafts never hold an id the model cannot take (a pool may be shared).
        self.service = DraftService(self.num_speculative_tokens, model.max_model_len,
                                    model.get_vocab_size(), settings, measured,
                                    ranks=1 if self.tp is None else self.tp.world_size)
        self.runner_requests: dict = {}  # the runner's request states (see_requests)

        from vllm.v1.worker import gpu_model_runner

        install_runner_hooks(gpu_model_runner.GPUModelRunner, type(self))
        self._start = None
        if not self.leader:
            self.publisher = None
            return
        announce("suffix", "v1", bool(getattr(vllm_config.scheduler_config, "async_scheduling",
                                              False)))
        self.publisher = Publisher(self.stats)  # the counters on the server's /metrics
        tokenizer = pool_tokenizer(model, settings, config)

        def build():
            return build_proposer(config, settings, tokenizer,
                                  engine_token_kinds(model, settings))

        if from_cache():
            self.service.ready(build())
            return
        logger.info("suffixspec: compiling kernels in the background (first run with this "
                    "Numba cache, about a minute); the engine serves without drafts meanwhile")

        def then(seconds: float) -> None:
            self.service.ready(build())
            logger.info("suffixspec: kernels ready in %.0f s; drafting from engine step %d on",
                        seconds, self.service.metrics.steps + 1)

        self._start = BackgroundStart(then, logger).start()

    @property
    def proposer(self):
        return self.service.proposer

    def load_model(self, *args, **kwargs) -> None:
        """Nothing to load: drafts come from the tries."""

    # -------------------------------------------------------------- per step
    def propose(self, num_speculative_tokens, input_batch, sampled_token_ids,
                slot_mappings=None) -> list[list[int]]:
        """One draft per batch row; rows still in prefill (no sampled token) get none."""
        n = len(sampled_token_ids)
        drafts = None
        if self.leader:
            drafts = [[] for _ in range(n)]
            rows = [i for i in range(n) if sampled_token_ids[i]]
            step = self._step(input_batch, rows, decode_only=len(rows) == n)
            # One token per row is already scheduled.
            found = self.service.step(step, int(num_speculative_tokens),
                                      self.max_num_batched_tokens - n)
            for i, draft in zip(rows, found):
                if draft is not None:
                    drafts[i] = draft.tolist()
        if self.tp is not None:
            drafts = self.tp.broadcast_object(drafts, src=0)
        return drafts

    def _step(self, batch, rows: list[int], decode_only: bool) -> Step:
        token_ids, spec = batch.token_ids_cpu, batch.spec_token_ids

        def end(j: int, have: int, tokens) -> int | None:
            return output_end(self.runner_requests.get(batch.req_ids[rows[j]]),
                              int(batch.num_prompt_tokens[rows[j]]), have, tokens,
                              self.service.max_model_len)

        def named(j: int):
            return named_namespace(self.runner_requests.get(batch.req_ids[rows[j]]))

        return Step(req_ids=[batch.req_ids[i] for i in rows],
                    totals=batch.num_tokens_no_spec[rows],
                    prompt_lens=batch.num_prompt_tokens[rows],
                    verified=[len(spec[i]) for i in rows],
                    tokens=lambda j, lo, hi: token_ids[rows[j], lo:hi],
                    end=end, decode_only=decode_only, named=named)

    def see_requests(self, requests: dict) -> None:
        """The runner's request states, by id (its own dict, read each step)."""
        self.runner_requests = requests

    # ------------------------------------------------------------ lifecycle
    def request_removed(self, req_id: str) -> None:
        """The runner dropped ``req_id`` (finished or aborted, never preempted)."""
        self.service.removed(req_id)

    def close(self) -> None:
        """Engine shutdown: see ``DraftService.close``."""
        if not self.leader:
            return
        if self._start is not None:
            self._start.stop()
        self.service.close()
        self.publisher.close()

    def stats(self) -> dict:
        """Counters for tests and tools: steps, per-pool drafts and acceptance."""
        return dict(self.service.stats(), leader=self.leader)


def named_namespace(state):
    """What a request named as its namespace: its ``vllm_xargs`` key
    ``NAMESPACE_ARG`` (``SamplingParams.extra_args``), or None (nothing, or
    ``state``, the runner's request state, is unknown)."""
    args = getattr(getattr(state, "sampling_params", None), "extra_args", None)
    return args.get(NAMESPACE_ARG) if isinstance(args, dict) else None


def output_end(state, prompt_len: int, have: int, tokens, max_model_len: int) -> int | None:
    """Where a request's output ends, if it ends within ``tokens`` (which
    start at position ``have``), as the scheduler decides it: at
    ``max_tokens`` or the context length, or at a stop token once
    ``min_tokens`` are out.  None: it goes on (or ``state``, the runner's
    request state, is unknown)."""
    params = getattr(state, "sampling_params", None)
    if params is None:
        return None
    limit = max_model_len
    if params.max_tokens is not None:
        limit = min(limit, prompt_len + params.max_tokens)
    stops = params.all_stop_token_ids
    if stops:
        first = max(have, prompt_len + params.min_tokens - 1)
        for j in range(first - have, min(len(tokens), limit - have)):
            if int(tokens[j]) in stops:
                return have + j + 1
    return limit if have + len(tokens) >= limit else None
