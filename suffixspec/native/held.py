"""``Held``: the records a proposer keeps from step to step, handed to the
per-step kernels as one object.

Numba unboxes every array argument of every call, one at a time (about
0.15 µs each here).  The calibration (3 arrays), the step's outputs (8), the
pending drafts (10) and the workspace (23) are the same arrays step after
step, so they cross the boundary once, in a StructRef that holds their plain
tuples (``layout.flat``), and each step passes it as one pointer.  A ``Held``
keeps its arrays alive; whoever replaces one of them (a record that grew)
makes a new ``Held`` (``hold``).
"""

from numba import njit, types
from numba.experimental import structref


@structref.register
class HeldType(types.StructRef):
    def preprocess_fields(self, fields):
        return tuple((name, types.unliteral(t)) for name, t in fields)


class Held(structref.StructRefProxy):
    """Python's handle on a ``HeldType``; made by ``hold`` (compiled and cached
    there, where constructing it from Python would compile in every process)."""


structref.define_proxy(Held, HeldType, ["stats", "out", "pending", "work"])


@njit(cache=True, nogil=True)
def hold(stats, out, pending, work):
    """A ``Held`` of these plain tuples (``Stats``, ``Outputs``, ``Pending``,
    ``Workspace`` flattened)."""
    return Held(stats, out, pending, work)
