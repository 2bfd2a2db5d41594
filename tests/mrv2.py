"""MRV2's side of a step, for the speculators' tests: requests in vLLM's own
``RequestState`` slots, tokens emitted, ``propose`` called as the runner does."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch


class Engine:
    """MRV2's side of the step: requests in RequestState slots, tokens emitted."""

    def __init__(self, speculator):
        self.spec, self.states = speculator, speculator.req_states
        self.reqs: list[str] = []
        self.sampled: dict[str, int] = {}

    def add(self, req: str, prompt: list[int]) -> None:
        self.states.add_request(req, len(prompt), prompt, 0, 100)
        slot = self.states.req_id_to_index[req]
        self.spec.add_request(slot)  # as the runner does, before the staged writes land
        self.states.all_token_ids.gpu[slot, :len(prompt)] = torch.tensor(prompt)
        self.states.total_len.gpu[slot] = len(prompt)
        self.reqs.append(req)
        self.sampled[req] = 1

    def emit(self, req: str, tokens: list[int], accepted: int | None = None) -> None:
        """``tokens`` emitted this step: ``accepted`` drafted ones and its own
        (default: all but the last were drafted)."""
        slot = self.states.req_id_to_index[req]
        n = int(self.states.total_len.gpu[slot])
        self.states.all_token_ids.gpu[slot, n:n + len(tokens)] = torch.tensor(tokens)
        self.states.total_len.gpu[slot] = n + len(tokens)
        self.sampled[req] = len(tokens) if accepted is None else accepted + 1

    def step(self):
        n = len(self.reqs)
        slots = np.array([self.states.req_id_to_index[r] for r in self.reqs], np.intp)
        batch = SimpleNamespace(req_ids=list(self.reqs), num_reqs=n,
                                idx_mapping=torch.tensor(slots, dtype=torch.int64),
                                idx_mapping_np=slots)
        sampled = torch.tensor([self.sampled[r] for r in self.reqs], dtype=torch.int32)
        rejected = torch.zeros(n, dtype=torch.int32)
        drafts = self.spec.propose(batch, None, None, None, None, sampled, rejected, None, None,
                                   None, None)
        return drafts.clone(), self.spec.draft_token_confidence_probs[:n].clone()

    def finish(self, req: str) -> None:
        self.spec.on_requests_finished([req])
        self.states.remove_request(req)
        self.reqs.remove(req)


class Tripwire:
    """Every way the worker thread could read a device value back (or wait for
    the device), made to raise there while ``armed``.

    On CPU tensors nothing is on a device, so the calls that would read one
    back on a GPU are what trips it: a value to the host (``item``,
    ``tolist``, ``numpy``, ``int()``, ``float()``, ``bool()``, ``index``), a
    copy to the host (``cpu``, ``.to("cpu")``, a ``copy_`` into a host tensor
    made during the call), data-dependent shapes (``nonzero``, one-argument
    ``torch.where``, ``masked_select``, ``unique``, boolean-mask indexing),
    comparisons answered on the host (``torch.equal``, ``allclose``) and
    waits (``synchronize``).  A host tensor is one a factory made without a
    device, while armed.
    """

    NAMES = [(torch.Tensor, "item"), (torch.Tensor, "cpu"), (torch.Tensor, "tolist"),
             (torch.Tensor, "numpy"), (torch.Tensor, "nonzero"), (torch, "nonzero"),
             (torch.Tensor, "__bool__"), (torch.Tensor, "__int__"), (torch.Tensor, "__float__"),
             (torch.Tensor, "__index__"), (torch, "masked_select"), (torch.Tensor, "unique"),
             (torch, "equal"), (torch.Tensor, "equal"), (torch, "allclose"),
             (torch.Tensor, "allclose"), (torch.cuda, "synchronize"),
             (torch.cuda.Event, "synchronize"), (torch.cuda.Stream, "synchronize")]
    FACTORIES = ("empty", "zeros", "ones", "full", "tensor", "as_tensor", "from_numpy")

    def __init__(self, monkeypatch, device=None):
        import threading
        import weakref

        self.worker = threading.current_thread()
        self.device = device
        self.hits: list[str] = []
        self.armed = False
        self._host = weakref.WeakSet()
        for owner, name in self.NAMES:
            monkeypatch.setattr(owner, name, self._wrap(getattr(owner, name), name))
        for name in self.FACTORIES:
            monkeypatch.setattr(torch, name, self._factory(getattr(torch, name)))
        getitem, to, copy_, where = (torch.Tensor.__getitem__, torch.Tensor.to,
                                     torch.Tensor.copy_, torch.where)

        def checked_getitem(tensor, index):
            indices = index if isinstance(index, tuple) else (index,)
            if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices):
                self._trip("boolean-mask indexing")
            return getitem(tensor, index)

        def checked_to(tensor, *args, **kwargs):
            if any(self._is_host(a) for a in (*args, kwargs.get("device"))):
                self._trip(".to(cpu)")
            return to(tensor, *args, **kwargs)

        def checked_copy(tensor, src, *args, **kwargs):
            base = tensor if tensor._base is None else tensor._base
            if base in self._host:
                self._trip("copy_ into a host tensor")
            return copy_(tensor, src, *args, **kwargs)

        def checked_where(condition, *args, **kwargs):
            if not args and not kwargs:
                self._trip("one-argument torch.where")
            return where(condition, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, "__getitem__", checked_getitem)
        monkeypatch.setattr(torch.Tensor, "to", checked_to)
        monkeypatch.setattr(torch.Tensor, "copy_", checked_copy)
        monkeypatch.setattr(torch, "where", checked_where)

    def _on_worker(self) -> bool:
        import threading

        return self.armed and threading.current_thread() is self.worker

    def _trip(self, what: str) -> None:
        if self._on_worker():
            self.hits.append(what)
            raise AssertionError(f"{what} in propose")

    def _is_host(self, target) -> bool:
        """``target`` names the host: "cpu", or a CPU device other than the
        speculator's own (which stands for the GPU here)."""
        if isinstance(target, str):
            return target.split(":")[0] == "cpu"
        return (isinstance(target, torch.device) and target.type == "cpu"
                and target is not self.device)

    def _wrap(self, original, name):
        def wrapper(*args, **kwargs):
            self._trip(name)
            return original(*args, **kwargs)
        return wrapper

    def _factory(self, original):
        def factory(*args, **kwargs):
            out = original(*args, **kwargs)
            device = kwargs.get("device")
            if self._on_worker() and (device is None or self._is_host(device)):
                self._host.add(out)
            return out
        return factory

    def guard(self, fn):
        """``fn`` with the wire armed while it runs."""
        def guarded(*args, **kwargs):
            self.armed = True
            try:
                return fn(*args, **kwargs)
            finally:
                self.armed = False
        return guarded

    def unguarded(self, fn):
        """``fn`` with the wire disarmed while it runs (then as it was)."""
        def unguarded(*args, **kwargs):
            armed, self.armed = self.armed, False
            try:
                return fn(*args, **kwargs)
            finally:
                self.armed = armed
        return unguarded
