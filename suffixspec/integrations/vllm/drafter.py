"""``SuffixSpecDrafter``: suffixspec behind vLLM's ``SuffixDecodingProposer`` interface.

The model runner calls ``propose`` once per step with its persistent batch.
Rows move between steps, so all state is keyed by request id: per request,
how many of its tokens (prompt and output) are indexed.  Each step catches
every request up from ``token_ids_cpu``, which also covers a request resumed
after preemption, then drafts for all of them in one native call.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

from suffixspec.config import DEFAULT_DRAFT_COST
from suffixspec.integrations.vllm.early import BeforeReady
from suffixspec.integrations.vllm.metrics import DrafterMetrics
from suffixspec.integrations.vllm.prometheus import Publisher
from suffixspec.integrations.vllm.settings import Settings, length_knobs
from suffixspec.kernels import BackgroundStart, from_cache
from suffixspec.native.calibration import ST_COST
from suffixspec.stepcost import StepCost, StepCostEstimator

logger = logging.getLogger("vllm.suffixspec")


class SuffixSpecDrafter(SuffixDecodingProposer):
    """Serves ``--speculative-config '{"method": "suffix", ...}'`` with suffixspec.

    ``num_speculative_tokens`` caps each draft; ``suffix_decoding_max_tree_depth``
    is the trie depth, and ``suffix_decoding_max_cached_requests`` bounds the
    in-memory cross-request pool (0 turns it off).
    ``suffix_decoding_max_spec_factor`` and ``suffix_decoding_min_token_prob``
    shape drafts as in arctic-inference under the ``counts`` policy; the
    default calibrated policy applies them only when they differ from vLLM's
    defaults (1.0 and 0.1), since vLLM passes those whether or not a user set
    them.  Settings vLLM has no key for come from ``Settings`` (environment).
    """

    def __init__(self, vllm_config):  # no super().__init__: it builds arctic-inference's cache
        config = vllm_config.speculative_config
        assert config is not None, "speculative config must be set"
        self.num_speculative_tokens = int(config.num_speculative_tokens)
        self.max_model_len = vllm_config.model_config.max_model_len
        self.max_num_batched_tokens = vllm_config.scheduler_config.max_num_batched_tokens
        # Drafts never hold an id the model cannot take (a pool may be shared).
        self.vocab_size = vllm_config.model_config.get_vocab_size()
        self.settings = Settings.from_env()
        self.indexed: dict[str, int] = {}  # req_id -> tokens indexed (prompt + output)
        self.runner_requests: dict = {}  # the runner's request states (see_requests)
        self.metrics = DrafterMetrics(self.settings.log_interval)
        self._warned = False

        from vllm.v1.worker import gpu_model_runner

        from suffixspec.integrations.vllm.patch import install_runner_hooks

        install_runner_hooks(gpu_model_runner.GPUModelRunner)
        # With tensor parallelism every rank runs a drafter, and the ranks must
        # verify the same drafts.  Only rank 0 drafts (and alone touches the
        # pool); the others take its drafts, one broadcast per step.
        self.tp = _tensor_parallel_group()
        self.leader = self.tp is None or self.tp.rank_in_group == 0
        # Until the kernels are ready there is no proposer, and steps get no
        # draft; what requests emit meanwhile is kept for it.
        self.proposer = None
        self.before_ready = None
        self.step_cost = None
        self._step_end = None  # when the last propose returned: the next step starts
        self._start = None
        if not self.leader:
            self.publisher = None
            return
        self.publisher = Publisher(self.stats)  # the counters on the server's /metrics
        # A pool that cannot serve (another tokenizer's, damaged) stops the
        # engine's start now, whether or not the kernels are ready.
        tokenizer = None
        if self.settings.pool is not None and config.suffix_decoding_max_cached_requests != 0:
            tokenizer = engine_tokenizer(vllm_config.model_config, self.settings)
            check_pool(self.settings.pool, tokenizer, config)

        def build():
            return build_proposer(config, vllm_config.model_config, self.settings, tokenizer)

        if from_cache():
            self._start_drafting(build())
            return
        logger.info("suffixspec: compiling kernels in the background (first run with this "
                    "Numba cache, about a minute); the engine serves without drafts meanwhile")
        self.before_ready = BeforeReady()

        def then(seconds: float) -> None:
            self._start_drafting(build())
            logger.info("suffixspec: kernels ready in %.0f s; drafting from engine step %d on",
                        seconds, self.metrics.steps + 1)

        self._start = BackgroundStart(then, logger).start()

    def _start_drafting(self, prop) -> None:
        # The draft cost: set by the user, or measured from the engine's step times.
        if self.settings.draft_cost is None and prop.policy == "calibrated":
            self.step_cost = StepCostEstimator(StepCost.from_draft_cost(DEFAULT_DRAFT_COST))
            prop.step_cost = self.step_cost
        self.metrics.step_cost = self.step_cost
        pool = self.settings.pool or ("in memory" if prop.cross is not None else "off")
        ranks = "" if self.tp is None else f", drafting for {self.tp.world_size} ranks"
        logger.info("suffixspec drafter: %s policy, up to %d tokens, depth %d, %s, "
                    "cross-request pool %s%s", prop.policy, self.num_speculative_tokens,
                    prop.max_depth, _length_rule(prop, self.settings), pool, ranks)
        self.proposer = prop  # last: a step sees a proposer only once it is complete

    def load_model(self, *args, **kwargs) -> None:
        """Nothing to load: drafts come from the tries."""

    # -------------------------------------------------------------- per step
    def propose(self, num_speculative_tokens, input_batch, sampled_token_ids,
                slot_mappings=None) -> list[list[int]]:
        """One draft per batch row; rows still in prefill (no sampled token) get none."""
        drafts = None
        if self.leader and self.proposer is None:  # kernels still compiling
            drafts = [[] for _ in sampled_token_ids]
            self.metrics.steps += 1
            self.metrics.steps_before_ready += 1
            self.before_ready.see(input_batch, sampled_token_ids)
        elif self.leader:
            n = len(sampled_token_ids)
            if self.before_ready is not None:
                self._hand_over()
            start = time.perf_counter()
            if self.step_cost is not None:
                self._time_step(start, input_batch, sampled_token_ids)
            try:
                drafts = self._propose(min(int(num_speculative_tokens),
                                           self.num_speculative_tokens),
                                       input_batch, sampled_token_ids)
            except Exception as exc:  # a drafting bug must never stop the engine
                self._failed(exc, input_batch.req_ids[:n])
                drafts = [[] for _ in range(n)]
            self.metrics.steps += 1
            self._step_end = time.perf_counter()
            self.metrics.seconds += self._step_end - start
            self.metrics.maybe_log(logger)
        if self.tp is not None:
            drafts = self.tp.broadcast_object(drafts, src=0)
        return drafts

    def _hand_over(self) -> None:
        """The first step with a proposer: the requests that finished while the
        kernels compiled join the pools, as if it had seen them finish."""
        early, self.before_ready = self.before_ready, None
        try:
            kept = early.hand_over(self.proposer)
        except Exception as exc:
            self._failed(exc, [])
            return
        self.metrics.finished += kept
        self.metrics.finished_before_ready = kept
        if kept:
            logger.info("suffixspec: %d requests that finished while the kernels compiled "
                        "joined the cross-request pool", kept)

    def _time_step(self, now: float, batch, sampled_token_ids) -> None:
        """Feed the step that just ran to the cost estimator: the time since the
        last draft was handed over, against the tokens the step verified (one
        per request plus its scheduled draft).  Only steps where every request
        was decoding count: prefill chunks cost differently."""
        if self._step_end is None:
            return
        n = len(sampled_token_ids)
        req_ids, spec = batch.req_ids, batch.spec_token_ids
        verified = n
        for i in range(n):
            if not sampled_token_ids[i] or req_ids[i] not in self.indexed:
                return
            verified += len(spec[i])
        if n:
            self.step_cost.observe(verified, now - self._step_end)

    def _propose(self, k: int, batch, sampled_token_ids) -> list[list[int]]:
        n = len(sampled_token_ids)
        out: list[list[int]] = [[] for _ in range(n)]
        req_ids = batch.req_ids
        num_tokens = batch.num_tokens_no_spec
        token_ids = batch.token_ids_cpu
        prop = self.proposer
        grown_ids, grown = [], []
        rows, ids, limits = [], [], []
        for i in range(n):
            if not sampled_token_ids[i]:
                continue  # still prefilling
            req = req_ids[i]
            total = int(num_tokens[i])
            have = self.indexed.get(req)
            if have is None or have > total:  # new, or tokens were taken back
                if have is not None:
                    prop.abort_request(req)
                have = int(batch.num_prompt_tokens[i])
                prop.start_request(req, token_ids[i, :have])
                self.indexed[req] = have
                self.metrics.forget(req)
            if total > have:
                tokens = token_ids[i, have:total]
                self.indexed[req] = total
                self.metrics.emitted(req, tokens, len(batch.spec_token_ids[i]))
                end = self._output_end(req, int(batch.num_prompt_tokens[i]), have, tokens)
                grown_ids.append(req)
                if end is not None:
                    # The request ends in this step.  What the last accepted
                    # draft ran past the end is never output: it is left out,
                    # so the request's trie holds exactly its prompt and
                    # output (a next turn can continue it).  No draft.
                    grown.append(tokens[:max(end - have, 0)])
                    continue
                grown.append(tokens)
            room = min(k, self.max_model_len - total - 1)
            if room > 0:
                rows.append(i)
                ids.append(req)
                limits.append(room)
        prop.extend_batch(grown_ids, grown)
        if not ids:
            return out
        self.metrics.request_steps += len(ids)
        budget = self.max_num_batched_tokens - n  # one token per row is already scheduled
        for i, req, draft in zip(rows, ids, prop.propose(ids, np.asarray(limits, np.int64))):
            tokens = draft.token_ids[:max(budget, 0)]
            outside = np.flatnonzero(tokens >= self.vocab_size)
            if outside.size:
                tokens = tokens[:outside[0]]
            if tokens.shape[0]:
                budget -= tokens.shape[0]
                out[i] = tokens.tolist()
                self.metrics.drafted(req, tokens, draft.source)
        return out

    def _output_end(self, req: str, prompt_len: int, have: int, tokens) -> int | None:
        """Where ``req``'s output ends, if it ends within ``tokens`` (which
        start at position ``have``), as the scheduler decides it: at
        ``max_tokens`` or the context length, or at a stop token once
        ``min_tokens`` are out.  None: it goes on (or its state is unknown)."""
        state = self.runner_requests.get(req)
        params = getattr(state, "sampling_params", None)
        if params is None:
            return None
        limit = self.max_model_len
        if params.max_tokens is not None:
            limit = min(limit, prompt_len + params.max_tokens)
        stops = params.all_stop_token_ids
        if stops:
            first = max(have, prompt_len + params.min_tokens - 1)
            for j in range(first - have, min(len(tokens), limit - have)):
                if int(tokens[j]) in stops:
                    return have + j + 1
        return limit if have + len(tokens) >= limit else None

    def see_requests(self, requests: dict) -> None:
        """The runner's request states, by id (its own dict, read each step)."""
        self.runner_requests = requests

    # ------------------------------------------------------------ lifecycle
    def request_removed(self, req_id: str) -> None:
        """The runner dropped ``req_id`` (finished or aborted, never preempted)."""
        if self.before_ready is not None:
            self.before_ready.removed(req_id)
        if self.indexed.pop(req_id, None) is None:
            return
        self.metrics.forget(req_id)
        try:
            self.proposer.finish_request(req_id)
            self.metrics.finished += 1
        except Exception as exc:
            self._failed(exc, [])

    def close(self) -> None:
        """Engine shutdown: keep what in-flight requests emitted and the
        calibration, close the pool.

        Their outputs so far are genuine model output, so they join the
        cross-request pool like finished requests.
        """
        if not self.leader:
            return
        if self._start is not None:
            self._start.stop()
        if self.proposer is None:
            logger.info("suffixspec metrics at shutdown: %s", self.metrics.summary())
            self.publisher.close()
            return
        for req_id in list(self.indexed):
            self.request_removed(req_id)
        logger.info("suffixspec metrics at shutdown: %s", self.metrics.summary())
        self.publisher.close()
        close = getattr(self.proposer.cross, "close", None)
        if close is not None:
            try:
                self.proposer.save_calibration()
                close()
            except Exception as exc:
                self._failed(exc, [])

    def stats(self) -> dict:
        """Counters for tests and tools: steps, per-pool drafts and acceptance."""
        out = self.metrics.as_dict()
        out["active_requests"] = len(self.indexed)
        out["leader"] = self.leader
        if self.proposer is None:
            return out
        cross = self.proposer.cross
        out["cross_tokens"] = 0 if cross is None else int(cross.tokens)
        out["draft_cost"] = float(self.proposer.stats.state[ST_COST])  # last step's, its batch's
        if self.step_cost is not None:
            cost = self.step_cost.estimate()
            out["step_fixed_seconds"], out["step_token_seconds"] = cost.fixed, cost.per_token
            out["step_cost_steps"] = self.step_cost.steps
        out["reused_prompt_tokens"] = self.proposer.reused_tokens
        return out

    def _failed(self, exc: Exception, req_ids) -> None:
        """Log the first failure with its cause; restart the affected requests."""
        self.metrics.failures += 1
        if not self._warned:
            self._warned = True
            logger.warning("suffixspec: drafting failed, the affected requests get no draft "
                           "this step and are indexed again from their tokens next step; "
                           "later failures are only counted in the metrics line: %r", exc,
                           exc_info=exc)
        for req in list(req_ids):
            if self.indexed.pop(req, None) is None:
                continue
            self.metrics.forget(req)
            try:
                self.proposer.abort_request(req)
            except Exception:
                pass  # state for req is gone either way; it restarts next step


def _tensor_parallel_group():
    """vLLM's tensor-parallel group when it has more than one rank, else None."""
    from vllm.distributed import get_tp_group

    try:
        group = get_tp_group()
    except AssertionError:  # no distributed environment (some tools build a drafter alone)
        return None
    return group if group.world_size > 1 else None


def _length_rule(prop, settings: Settings) -> str:
    if prop.policy == "counts":
        return (f"spec factor {prop.max_spec_factor:.2f}, "
                f"min token prob {prop.min_token_prob:.2f}")
    extra = "".join([f", spec factor {prop.max_spec_factor:.2f}"
                     if prop.max_spec_factor >= 0 else "",
                     f", min token prob {prop.min_token_prob:.2f}"
                     if prop.min_token_prob > 0 else ""])
    cost = (f"draft cost {settings.draft_cost:.3f}" if settings.draft_cost is not None
            else f"draft cost measured from step times (prior {DEFAULT_DRAFT_COST})")
    return cost + extra


def check_pool(path: str, tokenizer, spec_config) -> None:
    """Open the pool file and close it: refuses another tokenizer's pool, a
    damaged one or another trie depth, as opening it for drafting would."""
    from suffixspec.pools.store import PoolStore

    PoolStore(path, tokenizer, trie_depth(spec_config)).close()


def trie_depth(spec_config) -> int:
    """vLLM's ``suffix_decoding_max_tree_depth``, at least 2 (one token matched, one drafted)."""
    return max(int(spec_config.suffix_decoding_max_tree_depth), 2)


def build_proposer(spec_config, model_config, settings: Settings, tokenizer=None):
    """The proposer; ``tokenizer``, the engine's, checks a persistent pool
    (found from ``model_config`` when not given)."""
    from suffixspec.proposer import SuffixProposer

    depth = trie_depth(spec_config)
    if depth != spec_config.suffix_decoding_max_tree_depth:
        logger.warning("suffixspec: suffix_decoding_max_tree_depth %d raised to 2",
                       spec_config.suffix_decoding_max_tree_depth)
    max_cached = spec_config.suffix_decoding_max_cached_requests
    factor, min_prob = length_knobs(spec_config, settings.policy)
    kwargs = dict(max_depth=depth, max_spec_tokens=int(spec_config.num_speculative_tokens),
                  max_spec_factor=factor, min_token_prob=min_prob, policy=settings.policy,
                  draft_cost=(DEFAULT_DRAFT_COST if settings.draft_cost is None
                              else settings.draft_cost),
                  namespace=settings.namespace, shared_namespace=settings.shared_namespace)
    if max_cached == 0:
        return SuffixProposer(cross_pool_tokens=0, **kwargs)
    if settings.pool is None:
        return SuffixProposer(cross_pool_tokens=settings.cross_tokens,
                              cross_pool_requests=max_cached, **kwargs)
    from suffixspec.pools.persistent import PersistentPool

    if tokenizer is None:
        tokenizer = engine_tokenizer(model_config, settings)
    pool = PersistentPool(settings.pool, tokenizer=tokenizer,
                          max_depth=depth, max_tokens=settings.cross_tokens,
                          snapshot_every=settings.snapshot_every)
    return SuffixProposer(pool=pool, **kwargs)


def engine_tokenizer(model_config, settings: Settings):
    """The ``TokenizerId`` a persistent pool is checked against."""
    from suffixspec.fingerprint import tokenizer_id

    if settings.tokenizer:
        return tokenizer_id(settings.tokenizer)
    name = model_config.tokenizer
    if Path(name, "tokenizer.json").is_file():
        return tokenizer_id(name)
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name, "tokenizer.json",
                                        revision=model_config.tokenizer_revision)
    except Exception:
        cached = None
    if isinstance(cached, str):
        return tokenizer_id(cached)
    raise ValueError(f"suffixspec: no tokenizer.json found for {name!r}; set "
                     "SUFFIXSPEC_TOKENIZER to the tokenizer the pool must match")
