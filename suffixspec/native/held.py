"""``Held``, ``Reading`` and ``Appending``: what a proposer passes its per-step kernels
step after step, as one object each.

Numba unboxes every array argument of every call, one at a time (about
0.15 µs each here).  The calibration (3 arrays), the step's outputs (8), the
pending drafts (10) and the workspace (23) are the same arrays step after
step, so they cross the boundary once, in a StructRef that holds their plain
tuples (``layout.flat``), and each step passes it as one pointer.  A ``Held``
keeps its arrays alive; whoever replaces one of them (a record that grew)
makes a new ``Held`` (``hold``; ``Holder`` makes one only then).  The
indexes a step reads or appends to change only when an array grows, so they
cross as one object too (``Reading``, ``Appending``).
"""

from numba import njit, types
from numba.experimental import structref


class _Fields(types.StructRef):
    def preprocess_fields(self, fields):
        return tuple((name, types.unliteral(t)) for name, t in fields)


@structref.register
class HeldType(_Fields):
    pass


class Held(structref.StructRefProxy):
    """Python's handle on a ``HeldType``; made by ``hold`` (compiled and cached
    there, where constructing it from Python would compile in every process)."""


structref.define_proxy(Held, HeldType, ["stats", "out", "pending", "work"])


@njit(cache=True, nogil=True)
def hold(stats, out, pending, work):
    """A ``Held`` of these plain tuples (``Stats``, ``Outputs``, ``Pending``,
    ``Workspace`` flattened)."""
    return Held(stats, out, pending, work)


@structref.register
class ReadingType(_Fields):
    pass


class Reading(structref.StructRefProxy):
    """What a step drafts from (``reading``): the requests' own index and its
    trees' roots, the snapshot segments' side table (``union``) and the cross
    pool's in-memory part, read-only views as plain ``Index`` tuples."""


structref.define_proxy(Reading, ReadingType, ["local", "roots", "segs", "delta"])


@njit(cache=True, nogil=True)
def reading(local, roots, segs, delta):
    """A ``Reading`` of these."""
    return Reading(local, roots, segs, delta)


@structref.register
class AppendingType(_Fields):
    pass


class Appending(structref.StructRefProxy):
    """What a step appends to (``appending``): the requests' own index and the
    cross pool's in-memory part (plain ``Index`` tuples), each with its
    progress record (``SuffixIndex.extend_args``)."""


structref.define_proxy(Appending, AppendingType,
                       ["local", "local_progress", "delta", "delta_progress"])


@njit(cache=True, nogil=True)
def appending(local, local_progress, delta, delta_progress):
    """An ``Appending`` of these."""
    return Appending(local, local_progress, delta, delta_progress)


class Holder:
    """Makes an object of its four parts (``hold``, ``reading``, ``appending``) once, and again
    only after one of the parts was replaced: a step passes the same arrays as the
    step before unless an array grew, and making one costs about 60 µs."""

    def __init__(self, make):
        self._make = make
        self._parts: tuple | None = None
        self._made = None

    def __call__(self, a, b, c, d):
        # Four identity tests spelled out: the check runs several times a step.
        p = self._parts
        if p is None or p[0] is not a or p[1] is not b or p[2] is not c or p[3] is not d:
            self._made = self._make(a, b, c, d)
            self._parts = (a, b, c, d)
        return self._made
