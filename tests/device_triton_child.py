"""Child of ``test_device_triton``: ``interpret N`` compares the kernel with the
reference on N random cases; ``compile`` compiles it for sm_90.  Prints one
JSON line."""

from __future__ import annotations

import json
import sys

import numpy as np
import torch


def random_case(rng):
    from suffixspec.device.draft_ref import StepOutputs
    from suffixspec.device.layout import Calibration, DeviceWindows, WindowSpec
    from suffixspec.native import calibration as cal

    vocab = int(rng.integers(2, 6))
    k = int(rng.choice([1, 3, 4, 8, 16]))
    spec = WindowSpec(rows=int(rng.integers(1, 4)), width=int(rng.choice([8, 16, 32])), k=k)
    slots, b = 6, int(rng.integers(1, 5))
    dw = DeviceWindows(spec, slots)
    for s in range(slots):
        for r in range(spec.rows):
            size = int(rng.integers(0, spec.width + 1))
            head = int(rng.integers(0, size + 1)) if size else 0
            dw.tokens[s, r, :size] = torch.from_numpy(rng.integers(-1, vocab + 1, size))
            c = rng.integers(0, 5, size)
            c[:head] = 0
            dw.c[s, r, :size] = torch.from_numpy(c)
            dw.n[s, r, :size] = torch.from_numpy(c + rng.integers(0, 3, size))
            dw.meta[s, r] = torch.tensor([rng.integers(0, cal.N_SRC), rng.integers(0, 40), head,
                                          size, rng.integers(0, 40)])
    calibration = Calibration(dtype=torch.float32)
    tried = rng.integers(0, 30, cal.TABLE_ROWS)
    calibration.table[:] = torch.from_numpy(np.stack([np.floor(tried * rng.random(
        cal.TABLE_ROWS)), tried], 1).astype(np.float32))
    calibration.params[:] = torch.tensor(calibration.host_params(
        cal.new_state(0.0), float(rng.choice([0.0, 0.05, 0.3])),
        float(rng.choice([-1.0, 0.5, 2.0])), 0.0, 64))
    slot_ids = torch.from_numpy(rng.choice(slots, b, replace=False)).to(torch.int64)
    total = torch.from_numpy(rng.integers(1, 40, b)).to(torch.int64)
    tail = torch.from_numpy(rng.integers(0, vocab + 1, (b, spec.head))).to(torch.int64)
    short = total < spec.head
    for i in range(b):
        tail[i, int(total[i]):] = -2
    sampled = torch.from_numpy(rng.integers(0, 4, b)).to(torch.int64)
    recent = torch.from_numpy(rng.integers(0, cal.N_RECENT, b)).to(torch.int64)
    x = 3
    direct = (torch.from_numpy(rng.integers(-1, vocab + 1, (b, x, k))).to(torch.int64),
              torch.from_numpy(rng.integers(0, 4, (b, x, k))).to(torch.int64),
              torch.from_numpy(rng.integers(0, 6, (b, x, k))).to(torch.int64),
              torch.from_numpy(rng.integers(0, 30, (b, x))).to(torch.int64))
    direct = (direct[0], direct[1], torch.maximum(direct[1], direct[2]), direct[3])
    del short
    return (tail, total, sampled, recent, slot_ids, dw, direct, calibration, k, vocab,
            lambda: StepOutputs.empty(b, k))


def interpret(cases: int) -> dict:
    from suffixspec.device.draft_ref import fused_ref
    from suffixspec.device.draft_triton import fused_triton

    rng = np.random.default_rng(7)
    mismatches, rows = [], 0
    for case in range(cases):
        *args, fresh = random_case(rng)
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
    from suffixspec.device.draft_ref import own_history_scan
    from suffixspec.device.draft_triton import scan_triton

    for case in range(cases):
        width = int(rng.choice([8, 40, 300]))
        hist = torch.from_numpy(rng.integers(0, int(rng.integers(1, 4)), (5, width))).to(
            torch.int32)
        slots = torch.from_numpy(rng.choice(5, 3, replace=False)).to(torch.int64)
        total = torch.from_numpy(rng.integers(1, width + 1, 3)).to(torch.int64)
        depth = int(rng.integers(1, 9))
        want = own_history_scan(hist[slots], total, depth)
        got = scan_triton(hist, total, slots, depth, block=16)
        if not all(torch.equal(a, b) for a, b in zip(want, got)):
            mismatches.append({"case": case, "field": "scan", "want": [w.tolist() for w in want],
                               "got": [g.tolist() for g in got]})
    return {"cases": cases, "rows": rows, "mismatches": mismatches}


def compile_sm90() -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from suffixspec.device import draft_triton as dt
    from suffixspec.device.layout import DeviceWindows, WindowSpec

    windows = DeviceWindows(WindowSpec(), 1)
    consts = dt.constexprs(windows, 16)
    kernel = dt._fused_kernel
    names = kernel.arg_names
    types = {"tail_ptr": "*i64", "total_ptr": "*i64", "sampled_ptr": "*i64",
             "recent_ptr": "*i64", "slots_ptr": "*i64", "win_tok_ptr": "*i32",
             "win_c_ptr": "*i32", "win_n_ptr": "*i32", "win_meta_ptr": "*i32",
             "d_tok_ptr": "*i64", "d_c_ptr": "*i64", "d_n_ptr": "*i64", "d_match_ptr": "*i64",
             "d_src_ptr": "*i64", "table_ptr": "*fp32", "params_ptr": "*fp32",
             "drafts_ptr": "*i64", "conf_ptr": "*fp32", "probs_ptr": "*fp32",
             "valid_ptr": "*i32", "buckets_ptr": "*i32", "choice_ptr": "*i32",
             "match_ptr": "*i32", "last_ptr": "*i64", "vocab": "i32"}
    signature = {n: ("constexpr" if n in consts else types[n]) for n in names}
    src = ASTSource(fn=kernel, signature=signature, constexprs=consts)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32))
    scan = triton.compile(ASTSource(
        fn=dt._scan_kernel, signature={"hist_ptr": "*i32", "hist_stride": "i64",
                                       "slots_ptr": "*i64", "total_ptr": "*i64",
                                       "best_ptr": "*i64", "NB": "constexpr",
                                       "DEPTH": "constexpr", "BLOCK": "constexpr"},
        constexprs={"NB": 128, "DEPTH": 24, "BLOCK": 256}), target=GPUTarget("cuda", 90, 32))
    return {"target": "cuda:90", "cubin_bytes": len(compiled.asm["cubin"]),
            "shared_bytes": int(compiled.metadata.shared),
            "scan_cubin_bytes": len(scan.asm["cubin"]),
            "scan_shared_bytes": int(scan.metadata.shared)}


if __name__ == "__main__":
    mode = sys.argv[1]
    result = interpret(int(sys.argv[2])) if mode == "interpret" else compile_sm90()
    print(json.dumps(result))
