"""Child of ``test_device_triton``: ``interpret N`` compares the kernels with the
references on N random cases, ``serving N`` the fused kernel at serving shapes;
``compile`` compiles them for sm_90.  Prints one
JSON line."""

from __future__ import annotations

import json
import sys

import numpy as np
import torch


def interpret(cases: int) -> dict:
    from suffixspec.device.cases import compare_fused

    rng = np.random.default_rng(7)
    mismatches, rows = compare_fused(rng, cases, "cpu")
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
    from suffixspec.device.draft_ref import context_tail, suffix_scan
    from suffixspec.device.draft_triton import family_scan_triton

    for case in range(cases):
        vocab = int(rng.integers(1, 4))
        width = int(rng.choice([8, 40, 300]))
        hist = torch.from_numpy(rng.integers(0, vocab, (5, 30))).to(torch.int32)
        family = torch.from_numpy(rng.integers(-1, vocab, (5, width))).to(torch.int32)
        family_len = torch.from_numpy(rng.integers(0, width + 1, 5)).to(torch.int32)
        slots = torch.from_numpy(rng.choice(5, 3, replace=False)).to(torch.int64)
        total = torch.from_numpy(rng.integers(1, 31, 3)).to(torch.int64)
        depth = int(rng.integers(1, 9))
        want = suffix_scan(family[slots], family_len[slots],
                           context_tail(hist, total, depth, slots))
        got = family_scan_triton(family, family_len, hist, total, slots, depth, block=16)
        if not all(torch.equal(a, b) for a, b in zip(want, got)):
            mismatches.append({"case": case, "field": "family scan",
                               "want": [w.tolist() for w in want],
                               "got": [g.tolist() for g in got]})
    from suffixspec.device.corpus import DeviceCorpus
    from suffixspec.device.draft_triton import corpus_triton

    for case in range(cases):
        corpus = DeviceCorpus(int(rng.choice([16, 64, 400])))
        vocab = int(rng.integers(2, 5))
        for _ in range(int(rng.integers(0, 12))):
            corpus.ingest(torch.from_numpy(rng.integers(0, vocab, int(rng.integers(0, 30)))).to(
                torch.int32))
        ctx = torch.from_numpy(rng.integers(0, vocab, (3, 30))).to(torch.int32)
        total = torch.from_numpy(rng.integers(1, 31, 3))
        depth, k = int(rng.integers(1, 9)), int(rng.choice([1, 4, 16]))
        tail = context_tail(ctx, total, max(depth, 4))
        want = corpus.draft(tail, depth, k)
        got = corpus_triton(corpus, tail, depth, k)
        if not all(torch.equal(a, b) for a, b in zip(want, got)):
            mismatches.append({"case": case, "field": "corpus", "want": [w.tolist() for w in want],
                               "got": [g.tolist() for g in got]})
    from suffixspec.device.corpus import LiveCorpus
    from suffixspec.device.draft_triton import live_triton

    for case in range(cases):
        vocab = int(rng.integers(2, 5))
        hist = torch.from_numpy(rng.integers(0, vocab, (6, 40))).to(torch.int32)
        total = torch.from_numpy(rng.integers(1, 41, 6))
        live = LiveCorpus(6, 40, buckets=int(rng.choice([16, 1024])))
        for slot in range(6):
            live.start(slot, int(rng.integers(0, 10)))
        live.index(hist, total, torch.arange(6))
        hist[int(rng.integers(0, 6))] = int(rng.integers(0, vocab))  # a slot taken again
        total = torch.from_numpy(rng.integers(1, 41, 6))
        slots = torch.from_numpy(rng.choice(6, 3, replace=False)).to(torch.int64)
        depth, k = int(rng.integers(1, 9)), int(rng.choice([1, 4, 16]))
        tail = context_tail(hist, total[slots], max(depth, 4), slots)
        want = live.draft(hist, total, slots, tail, depth, k)
        got = live_triton(live, hist, total, slots, tail, depth, k)
        if not all(torch.equal(a, b) for a, b in zip(want, got)):
            mismatches.append({"case": case, "field": "live",
                               "want": [w.tolist() for w in want],
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
             "state_ptr": "*i64", "slots_ptr": "*i64", "win_tok_ptr": "*i32",
             "win_c_ptr": "*i32", "win_n_ptr": "*i32", "win_meta_ptr": "*i32",
             "d_tok_ptr": "*i64", "d_c_ptr": "*i64", "d_n_ptr": "*i64", "d_match_ptr": "*i64",
             "d_src_ptr": "*i64", "table_ptr": "*fp32", "params_ptr": "*fp32", "prefer_ptr": "*i32",
             "drafts_ptr": "*i64", "conf_ptr": "*fp32", "probs_ptr": "*fp32",
             "valid_ptr": "*i32", "buckets_ptr": "*i32", "choice_ptr": "*i32",
             "match_ptr": "*i32", "last_ptr": "*i64", "pair_ptr": "*i32",
             "pair_tok_ptr": "*i64", "vocab": "i32", "kinds_ptr": "*i32", "n_kinds": "i32"}
    signature = {n: ("constexpr" if n in consts else types[n]) for n in names}
    src = ASTSource(fn=kernel, signature=signature, constexprs=consts)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32))
    scan = triton.compile(ASTSource(
        fn=dt._scan_kernel, signature={"ctx_ptr": "*i32", "ctx_stride": "i64",
                                       "rows_ptr": "*i32", "rows_stride": "i64",
                                       "slots_ptr": "*i64", "total_ptr": "*i64",
                                       "len_ptr": "*i64", "best_ptr": "*i64", "NB": "constexpr",
                                       "DEPTH": "constexpr", "BLOCK": "constexpr"},
        constexprs={"NB": 128, "DEPTH": 24, "BLOCK": 256}), target=GPUTarget("cuda", 90, 32))
    corpora = [triton.compile(ASTSource(
        fn=dt._corpus_kernel, signature={
            "tail_ptr": "*i64", "tail_stride": "i64", "tokens_ptr": "*i32", "table_ptr": "*i64",
            "length_ptr": "*i64", "out_ptr": "*i64", "c_ptr": "*i64", "n_ptr": "*i64",
            "cap": "i64", "row_stride": "i64", "total_ptr": "*i64", "own_ptr": "*i64",
            "HASH_MUL": "constexpr", "NB": "constexpr", "SLOTS": "constexpr",
            "DEPTH": "constexpr", "DEPTH_PO2": "constexpr", "K": "constexpr",
            "K_PO2": "constexpr", "LIVE": "constexpr"},
        constexprs={"HASH_MUL": -7046029254386353131, "NB": 1 << 18, "SLOTS": 8, "DEPTH": 24,
                    "DEPTH_PO2": 32, "K": 16, "K_PO2": 16, "LIVE": live}),
        target=GPUTarget("cuda", 90, 32)) for live in (False, True)]
    return {"target": "cuda:90", "cubin_bytes": len(compiled.asm["cubin"]),
            "corpus_cubin_bytes": len(corpora[0].asm["cubin"]),
            "live_cubin_bytes": len(corpora[1].asm["cubin"]),
            "shared_bytes": int(compiled.metadata.shared),
            "scan_cubin_bytes": len(scan.asm["cubin"]),
            "scan_shared_bytes": int(scan.metadata.shared)}


def serving(cases: int) -> dict:
    """The fused kernel at the shapes it serves with (``cases.SERVING``)."""
    from suffixspec.device.cases import SERVING, compare_fused

    mismatches, rows = compare_fused(np.random.default_rng(11), cases, "cpu",
                                     batch=SERVING["batch"], shape=SERVING)
    return {"cases": cases, "rows": rows, "mismatches": mismatches}


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "interpret":
        result = interpret(int(sys.argv[2]))
    elif mode == "serving":
        result = serving(int(sys.argv[2]))
    else:
        result = compile_sm90()
    print(json.dumps(result))
