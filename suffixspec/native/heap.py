"""Max-heaps on probability over a ``Heap`` record: the frontier of tree drafts.

``heap_push``/``heap_take`` order entries as suffixspec's tree drafts do;
``std_push``/``std_pop`` work as the C++ standard library's ``push_heap`` and
``pop_heap`` (libstdc++), so that equal probabilities leave in arctic-inference's
order.  A heap of ``size`` entries uses rows ``[0, size)``; callers check the
capacity before pushing.
"""

from numba import njit


@njit(cache=True, nogil=True)
def heap_push(heap, size, prob, x, off, parent, bucket, depth):
    """Add an entry; returns the new size."""
    hp, hn, ho, hpar, hb, hd = heap
    i = size
    while i > 0:
        up = (i - 1) // 2
        if hp[up] >= prob:
            break
        hp[i] = hp[up]
        hn[i] = hn[up]
        ho[i] = ho[up]
        hpar[i] = hpar[up]
        hb[i] = hb[up]
        hd[i] = hd[up]
        i = up
    hp[i] = prob
    hn[i] = x
    ho[i] = off
    hpar[i] = parent
    hb[i] = bucket
    hd[i] = depth
    return size + 1


@njit(cache=True, nogil=True)
def heap_take(heap, size):
    """Remove the top entry: ``(prob, node, off, parent, bucket, depth, new size)``."""
    hp, hn, ho, hpar, hb, hd = heap
    top = (hp[0], hn[0], ho[0], hpar[0], hb[0], hd[0])
    size -= 1
    if size > 0:
        # Fill the hole at the top with the last entry and sift it down.
        prob = hp[size]
        x = hn[size]
        off = ho[size]
        parent = hpar[size]
        bucket = hb[size]
        depth = hd[size]
        i = 0
        while True:
            c = 2 * i + 1
            if c >= size:
                break
            if c + 1 < size and hp[c + 1] > hp[c]:
                c += 1
            if hp[c] <= prob:
                break
            hp[i] = hp[c]
            hn[i] = hn[c]
            ho[i] = ho[c]
            hpar[i] = hpar[c]
            hb[i] = hb[c]
            hd[i] = hd[c]
            i = c
        hp[i] = prob
        hn[i] = x
        ho[i] = off
        hpar[i] = parent
        hb[i] = bucket
        hd[i] = depth
    return top[0], top[1], top[2], top[3], top[4], top[5], size


@njit(cache=True, nogil=True)
def _sift_up(heap, hole, prob, x, i, parent):
    """Place an entry at ``hole`` or above it (libstdc++'s ``__push_heap``)."""
    hp, hx, hi, hpar = heap.prob, heap.node, heap.off, heap.parent
    up = (hole - 1) // 2
    while hole > 0 and hp[up] < prob:
        hp[hole] = hp[up]
        hx[hole] = hx[up]
        hi[hole] = hi[up]
        hpar[hole] = hpar[up]
        hole = up
        up = (hole - 1) // 2
    hp[hole] = prob
    hx[hole] = x
    hi[hole] = i
    hpar[hole] = parent


@njit(cache=True, nogil=True)
def std_push(heap, size, prob, x, i, parent):
    """libstdc++ ``push_heap``; returns the new size."""
    _sift_up(heap, size, prob, x, i, parent)
    return size + 1


@njit(cache=True, nogil=True)
def std_pop(heap, size):
    """libstdc++ ``pop_heap`` (the top moves out; the caller read it first)."""
    hp, hx, hi, hpar = heap.prob, heap.node, heap.off, heap.parent
    n = size - 1
    prob = hp[n]
    x = hx[n]
    i = hi[n]
    parent = hpar[n]
    hole = 0
    second = 0
    while second < (n - 1) // 2:
        second = 2 * (second + 1)
        if hp[second] < hp[second - 1]:
            second -= 1
        hp[hole] = hp[second]
        hx[hole] = hx[second]
        hi[hole] = hi[second]
        hpar[hole] = hpar[second]
        hole = second
    if (n & 1) == 0 and second == (n - 2) // 2:
        second = 2 * (second + 1)
        hp[hole] = hp[second - 1]
        hx[hole] = hx[second - 1]
        hi[hole] = hi[second - 1]
        hpar[hole] = hpar[second - 1]
        hole = second - 1
    _sift_up(heap, hole, prob, x, i, parent)  # the moved last entry
    return n
