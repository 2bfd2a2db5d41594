"""Random cases that hold the device kernels to their torch reference.

The tests run them under Triton's interpreter on CPU tensors; the device
check (``bench/device_check.py``) runs them on a GPU.  Cases favour what
breaks kernels: tiny vocabularies (windows overlap the context everywhere),
empty and short windows, -1 padding, rows that sampled nothing.
"""

from __future__ import annotations

import numpy as np
import torch


#: The shapes the vLLM drafter serves with (``WindowSpec``'s defaults): 8 windows
#: of 64 tokens a slot, drafts of 16, a batch of 8 rows.
SERVING = {"rows": 8, "width": 64, "k": 16, "batch": 8}


def random_case(rng, device="cpu", batch=None, shape=None):
    """One call's arguments for ``fused_ref``/``fused_triton``, less the outputs,
    and a function making fresh outputs (``batch`` rows, else 1 to 4).  ``shape``
    (``rows``, ``width``, ``k``, e.g. ``SERVING``) fixes the window sizes; else
    they are drawn small (1-3 rows of 8-32 tokens, k 1-16)."""
    from suffixspec.device.draft_ref import DIRECT_SOURCES, StepOutputs
    from suffixspec.device.layout import Calibration, DeviceWindows, WindowSpec
    from suffixspec.native import calibration as cal

    vocab = int(rng.integers(2, 6))
    if shape is None:
        k = int(rng.choice([1, 3, 4, 8, 16]))
        spec = WindowSpec(rows=int(rng.integers(1, 4)), width=int(rng.choice([8, 16, 32])), k=k)
    else:
        k = shape["k"]
        spec = WindowSpec(rows=shape["rows"], width=shape["width"], k=k)
    b = int(rng.integers(1, 5)) if batch is None else batch
    slots = b + 2
    dw = DeviceWindows(spec, slots, device)
    for s in range(slots):
        for r in range(spec.rows):
            size = int(rng.integers(0, spec.width + 1))
            head = int(rng.integers(0, size + 1)) if size else 0
            dw.tokens[s, r, :size] = torch.from_numpy(rng.integers(-1, vocab + 1, size))
            c = rng.integers(0, 5, size)
            c[:head] = 0
            dw.c[s, r, :size] = torch.from_numpy(c)
            dw.n[s, r, :size] = torch.from_numpy(c + rng.integers(0, 3, size))
            dw.meta[s, r] = torch.tensor([rng.integers(0, cal.SRC_LIVE), rng.integers(0, 40), head,
                                          size, rng.integers(0, 40)])
    calibration = Calibration(device, dtype=torch.float32, vocab=vocab)
    if rng.integers(3):  # kinds for some of the tokens, or none
        calibration.set_kinds(rng.integers(-1, cal.N_KIND, int(rng.integers(1, vocab + 2)))
                              .astype(np.int8))
    tried = rng.integers(0, 30, cal.TABLE_ROWS)
    table = np.stack([np.floor(tried * rng.random(cal.TABLE_ROWS)), tried], 1)
    # token and bigram rows' accepted may pass their "expected"
    table[cal.TOKEN_BASE:, 0] = rng.integers(0, 30, cal.TABLE_ROWS - cal.TOKEN_BASE)
    calibration.table[:table.shape[0]] = torch.from_numpy(table.astype(np.float32))
    calibration.params[:] = torch.tensor(calibration.host_params(
        cal.new_state(0.0), float(rng.choice([0.0, 0.05, 0.3])),
        float(rng.choice([-1.0, 0.5, 2.0])), 0.0, 64, bool(rng.integers(2)),
        bool(rng.integers(2))))
    calibration.prefer[:] = torch.from_numpy(
        (rng.random(calibration.prefer.shape[0]) < rng.choice([0.0, 0.5, 1.0])).astype(np.int32))
    def t(a):
        return torch.from_numpy(np.asarray(a)).to(device=device, dtype=torch.int64)

    slot_ids = t(rng.choice(slots, b, replace=False))
    total = rng.integers(1, 40, b)
    tail = rng.integers(0, vocab + 1, (b, spec.head))
    tail[np.arange(spec.head)[None, :] >= total[:, None]] = -2  # before the context's start
    x = len(DIRECT_SOURCES)
    c = rng.integers(0, 4, (b, x, k))
    direct = (t(rng.integers(-1, vocab + 1, (b, x, k))), t(c),
              t(np.maximum(c, rng.integers(0, 6, (b, x, k)))), t(rng.integers(0, 30, (b, x))))
    return (t(tail), t(total), t(rng.integers(0, 4, b)), t(rng.integers(0, cal.N_STATE, b)),
            slot_ids, dw, direct, calibration, k, vocab, lambda: StepOutputs.empty(b, k, device))


def compare_fused(rng, cases: int, device="cpu", batch=None, shape=None) -> tuple[list, int]:
    """The Triton kernel against ``fused_ref`` on ``cases`` random cases (outputs
    poisoned first; ``shape`` as in ``random_case``): the mismatching fields, and
    the rows compared."""
    from suffixspec.device.draft_ref import fused_ref
    from suffixspec.device.draft_triton import fused_triton

    mismatches, rows = [], 0
    for case in range(cases):
        *args, fresh = random_case(rng, device, batch, shape)
        want, got = fresh(), fresh()
        for o in (want, got):
            for field in o.__dataclass_fields__:
                getattr(o, field).fill_(77)  # poison
        fused_ref(*args, want)
        fused_triton(*args, got)
        rows += want.num_valid.shape[0]
        for field in want.__dataclass_fields__:
            a, b = getattr(want, field), getattr(got, field)
            same = (torch.allclose(a, b, rtol=1e-5, atol=1e-6) if a.is_floating_point()
                    else torch.equal(a, b))
            if not same:
                mismatches.append({"case": case, "field": field, "want": a.tolist(),
                                   "got": b.tolist()})
    return mismatches, rows
