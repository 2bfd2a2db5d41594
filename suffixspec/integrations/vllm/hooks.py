"""What the V1 model runner tells the drafter besides ``propose``: its requests' states,
which requests it dropped, and its shutdown (wrapped runner methods)."""

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
          lambda runner, drafter, scheduler_output: drafter.see_requests(runner.requests),
          before=True)
    _wrap(runner_cls, drafter_cls, "_on_request_state_removed",
          lambda runner, drafter, req_id, req_state: drafter.request_removed(req_id))
    _wrap(runner_cls, drafter_cls, "shutdown", lambda runner, drafter: drafter.close(), before=True)


def _wrap(cls, drafter_cls, name: str, notify, before: bool = False) -> None:
    original = getattr(cls, name)
    if getattr(original, "_suffixspec", False):
        return

    def wrapper(self, *args):
        drafter = getattr(self, "drafter", None)
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
