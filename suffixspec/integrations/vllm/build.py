"""The proposer an engine drafts with, from vLLM's config and suffixspec's settings.

Both ways suffixspec serves vLLM build their proposer here: the device
speculator of ``method: "suffixspec"`` (vLLM >= 0.34) and the V1 runner's
drafter of ``method: "suffix"`` (``v1_runner``, vLLM <= 0.33).  vLLM's own keys
(``num_speculative_tokens``, ``suffix_decoding_*``) set the drafting knobs;
``Settings`` the rest.  The engine's tokenizer is found here too: a
persistent pool is checked against it, and token kinds are read from it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from suffixspec.config import DEFAULT_DRAFT_COST, ProposerConfig
from suffixspec.integrations.vllm.settings import Settings, length_knobs

logger = logging.getLogger("vllm.suffixspec")


def proposer_config(spec_config, settings: Settings) -> tuple[ProposerConfig, bool]:
    """The proposer's settings for vLLM's speculative config, and whether the
    draft cost is measured from the engine's step times (no cost set)."""
    depth = trie_depth(spec_config)
    if depth != spec_config.suffix_decoding_max_tree_depth:
        logger.warning("suffixspec: suffix_decoding_max_tree_depth %d raised to 2",
                       spec_config.suffix_decoding_max_tree_depth)
    factor, min_prob = length_knobs(spec_config)
    measured = settings.draft_cost is None
    cached = spec_config.suffix_decoding_max_cached_requests  # 0: no pool; negative: no bound
    cross = 0 if cached == 0 else settings.cross_tokens
    config = ProposerConfig(
        max_depth=depth, max_spec_tokens=int(spec_config.num_speculative_tokens),
        max_spec_factor=factor, min_token_prob=min_prob,
        draft_cost=DEFAULT_DRAFT_COST if measured else settings.draft_cost,
        cross_pool_tokens=cross,
        cross_pool_requests=(None if settings.pool is not None or cross == 0 or cached < 0
                             else cached),
        namespace=settings.namespace, shared_namespace=settings.shared_namespace)
    return config, measured


def trie_depth(spec_config) -> int:
    """vLLM's ``suffix_decoding_max_tree_depth``, at least 2 (one token matched, one drafted)."""
    return max(int(spec_config.suffix_decoding_max_tree_depth), 2)


def build_proposer(config: ProposerConfig, settings: Settings, tokenizer=None,
                   token_kinds=None):
    """The proposer, on the persistent pool ``settings.pool`` (checked against
    ``tokenizer``, the engine's) when one is set and the cross pool is on;
    ``token_kinds`` as ``SuffixProposer`` takes them (``engine_token_kinds``)."""
    from suffixspec.proposer import SuffixProposer

    if settings.pool is None or config.cross_pool_tokens == 0:
        return SuffixProposer(config, token_kinds=token_kinds)
    from suffixspec.pools.persistent import PersistentPool

    pool = PersistentPool(settings.pool, tokenizer=tokenizer, max_depth=config.max_depth,
                          max_tokens=config.cross_pool_tokens,
                          snapshot_every=settings.snapshot_every or None,
                          refresh_interval=settings.refresh_interval)
    return SuffixProposer(config, pool=pool, token_kinds=token_kinds)


def device_proposer(config, settings: Settings, tokenizer, kinds, k: int, ranks: int):
    """The device feeder's proposer, its kernels loaded (in the worker's process,
    or in the feeder's own: ``Settings.device_feeder_process``, which unpickles
    this without torch), so that its first steps load none."""
    from suffixspec.native.warmup import DEVICE, SERVING, warmup

    proposer = build_proposer(config, settings, tokenizer, kinds)
    warmup(steps=SERVING + DEVICE)
    pool = settings.pool or ("in memory" if proposer.cross is not None else "off")
    logger.info("suffixspec drafter on the device: up to %d tokens, depth %d, cross-request "
                "pool %s%s", k, proposer.max_depth, pool, f", for {ranks} ranks" if ranks > 1 else "")
    return proposer


def tensor_parallel_group():
    """vLLM's tensor-parallel group when it has more than one rank, else None."""
    try:
        from vllm.distributed import get_tp_group

        group = get_tp_group()
    except (ImportError, AssertionError):  # no vLLM, or no distributed environment
        return None  # (the device check builds a speculator alone)
    return group if group.world_size > 1 else None


def check_pool(path: str, tokenizer, depth: int) -> None:
    """Open the pool file and close it: refuses another tokenizer's pool, a
    damaged one or another trie depth, as opening it for drafting would."""
    from suffixspec.pools.store import PoolStore

    PoolStore.shared(path, tokenizer, depth).release()  # the handle in use, if there is one


def tokenizer_file(model_config, settings: Settings) -> str | None:
    """The engine's ``tokenizer.json`` (or its folder): ``SUFFIXSPEC_TOKENIZER``,
    else the model's, else the Hugging Face cache's; None where none is found."""
    if settings.tokenizer:
        return settings.tokenizer
    name = model_config.tokenizer
    if Path(name, "tokenizer.json").is_file():
        return name
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name, "tokenizer.json",
                                        revision=model_config.tokenizer_revision)
    except Exception:
        cached = None
    return cached if isinstance(cached, str) else None


def engine_tokenizer(model_config, settings: Settings):
    """The ``TokenizerId`` a persistent pool is checked against."""
    from suffixspec.fingerprint import tokenizer_id

    path = tokenizer_file(model_config, settings)
    if path is None:
        raise ValueError(f"suffixspec: no tokenizer.json found for {model_config.tokenizer!r}; "
                         "set SUFFIXSPEC_TOKENIZER to the tokenizer the pool must match")
    return tokenizer_id(path)


def engine_token_kinds(model_config, settings: Settings):
    """The kinds of the engine's tokens (``suffixspec.token_kinds``), or None
    with one logged line where its ``tokenizer.json`` cannot be read: the
    calibration then goes without them."""
    from suffixspec.fingerprint import load_hf_tokenizer
    from suffixspec.token_kinds import token_kinds

    try:
        path = tokenizer_file(model_config, settings)
        if path is None:
            raise ValueError("no tokenizer.json found")
        return token_kinds(load_hf_tokenizer(path))
    except Exception as exc:  # the kinds are an aid: never a reason not to serve
        logger.warning("suffixspec: no token kinds for %r (%s); drafting without them",
                       getattr(model_config, "tokenizer", None), exc)
        return None


def pool_tokenizer(model_config, settings: Settings, config: ProposerConfig):
    """The tokenizer a persistent pool is checked against, the pool opened and
    closed once: a pool that cannot serve (another tokenizer's, damaged)
    stops the engine's start now, whether or not the kernels are ready.
    None when no pool is set or the cross pool is off."""
    if settings.pool is None or config.cross_pool_tokens == 0:
        return None
    tokenizer = engine_tokenizer(model_config, settings)
    check_pool(settings.pool, tokenizer, config.max_depth)
    return tokenizer
