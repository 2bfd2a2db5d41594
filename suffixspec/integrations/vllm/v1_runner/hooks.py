"""The V1 runner's methods the plugin wraps (vLLM <= 0.33), in one idiom.

What the V1 model runner tells suffixspec besides ``propose``: its requests'
states, which requests it dropped, and its shutdown.  Each wrapper calls the
original with whatever it was given, tells the drafter when the runner
holds one of suffixspec's, and marks itself so a second install changes
nothing.  vLLM 0.34's Model Runner V2 has hooks of its own for all of this
(``BaseSpeculator.add_request``, ``on_requests_finished``...): nothing is
wrapped there.
"""

from __future__ import annotations


def install_runner_hooks(runner_cls, drafter_cls) -> None:
    """Tell the drafter what the runner knows of its requests.

    Before each step's state update the drafter gets the runner's request
    states (their sampling params say where each output must end).
    ``_on_request_state_removed`` runs for finished and aborted requests only;
    a preempted request keeps its state in the runner and is not reported.
    Only runners whose drafter is a ``drafter_cls`` are told.
    """
    _wrap(runner_cls, drafter_cls, "_update_states",
          lambda runner, drafter, scheduler_output, *_, **__: drafter.see_requests(
              runner.requests), before=True)
    _wrap(runner_cls, drafter_cls, "_on_request_state_removed",
          lambda runner, drafter, req_id, *_, **__: drafter.request_removed(req_id))
    _wrap(runner_cls, drafter_cls, "shutdown", lambda runner, drafter, *_, **__: drafter.close(),
          before=True)


def _wrap(cls, drafter_cls, name: str, notify, before: bool = False) -> None:
    original = getattr(cls, name)
    if getattr(original, "_suffixspec", False):
        return

    def wrapper(self, *args, **kwargs):
        drafter = getattr(self, "drafter", None)
        mine = isinstance(drafter, drafter_cls)
        if mine and before:
            notify(self, drafter, *args, **kwargs)
        result = original(self, *args, **kwargs)
        if mine and not before:
            notify(self, drafter, *args, **kwargs)
        return result

    wrapper._suffixspec = True
    wrapper.__name__ = name
    wrapper.__doc__ = original.__doc__
    setattr(cls, name, wrapper)
