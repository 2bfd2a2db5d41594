"""Every vLLM name the plugin rebinds besides the drafter class, in one idiom.

What a model runner tells suffixspec besides ``propose``: on the V1 runner its
requests' states, which requests it dropped, and its shutdown; on Model
Runner V2 which requests it lets go (before their slots are freed) and which
request takes a slot.  Each wrapper calls the original, tells the drafter or
speculator when the runner holds one of suffixspec's, and marks itself so a
second install changes nothing.
"""

from __future__ import annotations

import sys

_MRV2_RUNNER = "vllm.v1.worker.gpu.model_runner"


def install_runner_hooks(runner_cls, drafter_cls) -> None:
    """Tell the drafter what the runner knows of its requests.

    Before each step's state update the drafter gets the runner's request
    states (their sampling params say where each output must end).
    ``_on_request_state_removed`` runs for finished and aborted requests only;
    a preempted request keeps its state in the runner and is not reported.
    Only runners whose drafter is a ``drafter_cls`` are told.
    """
    _wrap(runner_cls, drafter_cls, "_update_states",
          lambda runner, drafter, scheduler_output: drafter.see_requests(runner.requests),
          before=True)
    _wrap(runner_cls, drafter_cls, "_on_request_state_removed",
          lambda runner, drafter, req_id, req_state: drafter.request_removed(req_id))
    _wrap(runner_cls, drafter_cls, "shutdown", lambda runner, drafter: drafter.close(), before=True)


def install_mrv2_hooks(speculator_cls) -> None:
    """Tell a Model Runner V2 speculator which requests the runner lets go,
    before their slots are freed (0.33's runner has no such call; where the
    runner makes it too, the speculator takes each request once), and close it
    at shutdown."""
    cls = getattr(sys.modules.get(_MRV2_RUNNER), "GPUModelRunner", None)
    if cls is None:
        return
    _wrap(cls, speculator_cls, "finish_requests",
          lambda runner, spec, scheduler_output: spec.on_requests_finished(
              sorted(scheduler_output.finished_req_ids)), before=True, holder="speculator")
    if hasattr(cls, "shutdown"):
        _wrap(cls, speculator_cls, "shutdown", lambda runner, spec: spec.close(), before=True,
              holder="speculator")


def watch_added_requests(req_states, added) -> None:
    """Call ``added(req_id, prompt_len, all_token_ids)`` once MRV2's
    ``RequestState.add_request`` has given a request its slot (this one
    ``RequestState`` only)."""
    original = req_states.add_request
    if getattr(original, "_suffixspec", False):
        return

    def add_request(req_id, prompt_len, all_token_ids, *args, **kwargs):
        result = original(req_id, prompt_len, all_token_ids, *args, **kwargs)
        added(req_id, prompt_len, all_token_ids)
        return result

    add_request._suffixspec = True
    req_states.add_request = add_request


def _wrap(cls, drafter_cls, name: str, notify, before: bool = False,
          holder: str = "drafter") -> None:
    original = getattr(cls, name)
    if getattr(original, "_suffixspec", False):
        return

    def wrapper(self, *args):
        drafter = getattr(self, holder, None)
        mine = isinstance(drafter, drafter_cls)
        if mine and before:
            notify(self, drafter, *args)
        result = original(self, *args)
        if mine and not before:
            notify(self, drafter, *args)
        return result

    wrapper._suffixspec = True
    wrapper.__name__ = name
    wrapper.__doc__ = original.__doc__
    setattr(cls, name, wrapper)
