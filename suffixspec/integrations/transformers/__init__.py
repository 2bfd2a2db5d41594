"""Hugging Face transformers ``generate`` drafting from a ``SuffixProposer``.

transformers' assisted generation asks a *candidate generator* for draft
tokens at every step and verifies them with the model itself, so outputs are
those of plain ``generate``.  ``use_suffixspec(model, proposer)`` makes
``model.generate`` use a ``SuffixCandidateGenerator``: drafts come from the
proposer's pools (the request's own tokens, past outputs, a persistent pool),
and each finished ``generate`` adds its output to the cross-request pool::

    use_suffixspec(model, SuffixProposer())
    out = model.generate(input_ids, max_new_tokens=128)

It overrides ``_get_candidate_generator`` on the model object and switches
assisted generation on through ``prompt_lookup_num_tokens`` (the proposer's
``max_spec_tokens``), so it needs a transformers release with both
(tested: 5.19); greedy and sampled decoding, batch size 1 (assisted
generation's own limit).
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
import torch
from packaging.version import Version
from transformers import __version__ as transformers_version
from transformers.generation.candidate_generator import CandidateGenerator

TESTED = Version("5.0")  # oldest release with the hooks used here


class SuffixCandidateGenerator(CandidateGenerator):
    """Drafts for one ``generate`` call, from ``proposer``, as request ``req_id``."""

    def __init__(self, proposer, req_id, max_length: int, eos_token_id=None):
        self.proposer = proposer
        self.req_id = req_id
        self.max_length = max_length
        self.eos = None if eos_token_id is None else np.asarray(
            eos_token_id.cpu() if isinstance(eos_token_id, torch.Tensor) else eos_token_id
        ).reshape(-1)
        self.indexed = 0  # tokens of input_ids the proposer has seen

    def get_candidates(self, input_ids: torch.LongTensor, **kwargs):
        if input_ids.shape[0] != 1:
            raise ValueError("suffixspec drafting in generate supports batch size 1 "
                             "(as transformers' assisted generation)")
        tokens = input_ids[0].cpu().numpy()
        if self.indexed == 0:
            self.proposer.start_request(self.req_id, tokens)
        elif tokens.shape[0] > self.indexed:
            self.proposer.extend(self.req_id, tokens[self.indexed:])
        self.indexed = tokens.shape[0]
        room = self.max_length - tokens.shape[0] - 1  # the model adds one token itself
        if room <= 0:
            return input_ids, None
        draft = self.proposer.propose([self.req_id], max_spec_tokens=room)[0].token_ids
        if self.eos is not None and draft.shape[0]:
            stop = np.flatnonzero(np.isin(draft, self.eos))
            if stop.size:
                draft = draft[:stop[0]]  # never draft past the end of the output
        if draft.shape[0] == 0:
            return input_ids, None
        extra = torch.as_tensor(draft.astype(np.int64), device=input_ids.device)[None, :]
        return torch.cat([input_ids, extra], dim=1), None

    def update_candidate_strategy(self, input_ids, scores, num_matches: int) -> None:
        """Nothing to adapt here: the proposer learns from the tokens ``extend`` gets."""

    def finish(self, sequence: np.ndarray) -> None:
        """``generate`` returned ``sequence`` (prompt and output): keep the output."""
        if self.indexed == 0:
            return  # never drafted (for example max_new_tokens=1)
        if sequence.shape[0] > self.indexed:
            self.proposer.extend(self.req_id, sequence[self.indexed:])
        self.proposer.finish_request(self.req_id)


_ids = itertools.count()


def use_suffixspec(model, proposer):
    """Make ``model.generate`` draft from ``proposer``; returns ``model``.

    Calls that pass an ``assistant_model`` or their own
    ``prompt_lookup_num_tokens`` keep transformers' behaviour.
    """
    if Version(transformers_version) < TESTED:
        raise RuntimeError(f"suffixspec needs transformers >= {TESTED}, found "
                           f"{transformers_version}")
    state = getattr(model.generate, "_suffixspec", None)
    if state is not None:  # installed already: draft from this proposer from now on
        state["proposer"] = proposer
        return model
    original_generate = model.generate
    original_candidates = model._get_candidate_generator
    current: dict = {}
    state = {"proposer": proposer}

    def candidates(generation_config, input_ids, inputs_tensor, logits_processor,
                   model_kwargs, assistant_model=None, target_tokenizer=None,
                   assistant_tokenizer=None):
        if "req_id" not in current:
            return original_candidates(generation_config, input_ids, inputs_tensor,
                                       logits_processor, model_kwargs, assistant_model,
                                       target_tokenizer, assistant_tokenizer)
        gen = SuffixCandidateGenerator(state["proposer"], current["req_id"],
                                       generation_config.max_length,
                                       generation_config._eos_token_tensor)
        current["generator"] = gen
        return gen

    @functools.wraps(original_generate)
    def generate(*args, **kwargs):
        if kwargs.get("assistant_model") is not None or "prompt_lookup_num_tokens" in kwargs:
            return original_generate(*args, **kwargs)
        current.clear()
        current["req_id"] = f"transformers-{next(_ids)}"
        kwargs["prompt_lookup_num_tokens"] = max(state["proposer"].max_spec_tokens, 1)
        try:
            out = original_generate(*args, **kwargs)
        except BaseException:
            gen = current.get("generator")
            if gen is not None and gen.indexed:
                gen.proposer.abort_request(gen.req_id)
            raise
        finally:
            req = current.pop("req_id", None)
        gen = current.pop("generator", None)
        if gen is not None and req is not None:
            sequences = out if isinstance(out, torch.Tensor) else out.sequences
            gen.finish(sequences[0].cpu().numpy())
        return out

    generate._suffixspec = state
    model._get_candidate_generator = candidates
    model.generate = generate
    return model


__all__ = ["SuffixCandidateGenerator", "use_suffixspec"]
