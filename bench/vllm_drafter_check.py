"""vLLM 0.34's own GPU suffix drafter against suffixspec's model of it, draft for draft.

Usage (from the repository root, in the vLLM 0.34 venv: scripts/install_vllm034.sh):

    .venv-vllm034/bin/python bench/vllm_drafter_check.py --traces ../shared/data/traces \\
        --tokenizer ../shared/tokenizers/qwen [--requests 40]

Every GPU table of this project prices vLLM's drafter (``method: "suffix"`` on
Model Runner V2) by a model of its rule, ``suffixspec.native.vllm_suffix``
(the replay engine ``vllm-gpu``).  This holds the model to vLLM's own code:
vLLM's ``SuffixSpeculator`` (``vllm/v1/worker/gpu/spec_decode/suffix/
speculator.py``, unmodified) runs on CPU tensors with its Triton kernels
under ``TRITON_INTERPRET=1``, over vLLM's own ``RequestState``.  Two changes
are made outside its code: vLLM turns Triton off on a machine without a GPU
(``vllm.triton_utils.HAS_TRITON``), so this sets ``HAS_TRITON``, ``triton``
and ``tl`` there to the installed Triton before the speculator is imported;
and Triton's interpreter (3.9) holds a mask made of a block and a loaded
scalar (``(pos >= 1) & (num_sampled > 0)``) as int64 where its type says
int1, and then refuses it in ``tl.load``, so its masked load and store take
the mask as bool.

The first ``--requests`` records of each trace (those whose prompt and output
fit ``--max-len``) are decoded one at a time, driven by vLLM's drafts: each
step vLLM's speculator drafts ``k`` tokens, the recorded output accepts its
longest agreeing prefix within the valid tokens, and that plus one token is
emitted to both.  At each step the model drafts from the same context, with
the same corpus of finished outputs.  Reported per trace: steps, steps where
the model's valid count and valid tokens equal vLLM's, where all ``k`` slots
equal, and vLLM's mean accepted tokens per step.  Writes
``vllm_drafter.json``.
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench_common import SLICES, load_slice, parser, save_results  # noqa: E402


def vllm_suffix_speculator():
    """vLLM's ``SuffixSpeculator`` class with Triton on (its interpreter here)."""
    import triton
    import triton.language as tl

    import vllm.triton_utils as tu
    import vllm.v1.worker.gpu.buffer_utils as buffers

    tu.HAS_TRITON, tu.triton, tu.tl = True, triton, tl
    interpreter_masks_as_bool()
    buffers.is_uva_available = lambda: False  # vLLM's own fallback without pinned memory
    from vllm.v1.worker.gpu.spec_decode.suffix import speculator

    return speculator.SuffixSpeculator


def interpreter_masks_as_bool() -> None:
    """Triton's interpreter: masked loads and stores take their mask as bool."""
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder, "_masks_as_bool", False):
        return
    load, store = builder.create_masked_load, builder.create_masked_store

    def as_bool(mask):
        return interpreter.TensorHandle(mask.data.astype(bool), mask.dtype)

    builder.create_masked_load = lambda self, ptrs, mask, *a: load(self, ptrs, as_bool(mask), *a)
    builder.create_masked_store = lambda self, ptrs, value, mask, *a: store(self, ptrs, value,
                                                                          as_bool(mask), *a)
    builder._masks_as_bool = True


class Pair:
    """vLLM's speculator and the model, fed the same tokens."""

    def __init__(self, k: int, depth: int, corpus_tokens: int, max_len: int):
        from vllm.v1.worker.gpu.states import RequestState

        from suffixspec.replay.engines import VllmGpuProposer

        spec = SimpleNamespace(num_speculative_tokens=k, suffix_decoding_max_tree_depth=depth,
                               suffix_decoding_corpus_tokens=corpus_tokens,
                               suffix_decoding_max_cached_requests=-1,
                               enable_adaptive_verification=False)
        config = SimpleNamespace(speculative_config=spec,
                                 scheduler_config=SimpleNamespace(max_num_seqs=4),
                                 model_config=SimpleNamespace(max_model_len=max_len))
        cpu = torch.device("cpu")
        speculator = vllm_suffix_speculator()  # first: it sets vLLM's CPU fallbacks
        self.states = RequestState(max_num_reqs=4, max_model_len=max_len,
                                   max_num_batched_tokens=max_len, num_speculative_steps=k,
                                   vocab_size=1 << 20, device=cpu)
        self.vllm = speculator(config, cpu, self.states)
        self.model = VllmGpuProposer(k, depth, corpus_tokens, adaptive=False)
        self.k = k
        self.last_sampled = torch.zeros(4, dtype=torch.int64)

    def start(self, req: str, prompt: np.ndarray) -> None:
        self.states.add_request(req, len(prompt), prompt.tolist(), 0, 100)
        slot = self.states.req_id_to_index[req]
        self.vllm.add_request(slot)
        self.states.all_token_ids.gpu[slot, :len(prompt)] = torch.from_numpy(prompt)
        self.states.total_len.gpu[slot] = len(prompt)
        self.last_sampled[slot] = int(prompt[-1])
        self.model.start_request(req, prompt)

    def drafts(self, req: str, sampled: int) -> tuple[np.ndarray, int, np.ndarray, int]:
        """vLLM's draft (all k slots) and valid count; the model's, at the same context."""
        from suffixspec.native import vllm_suffix as gpu

        slot = self.states.req_id_to_index[req]
        batch = SimpleNamespace(num_reqs=1, idx_mapping=torch.tensor([slot], dtype=torch.int32))
        out = self.vllm.propose(batch, None, None, None, None,
                                torch.tensor([sampled], dtype=torch.int32),
                                torch.zeros(1, dtype=torch.int32), self.last_sampled, None,
                                None, None)
        theirs, valid = out[0].numpy().copy(), int(self.vllm.num_valid[0])
        m = self.model
        ours = np.empty(self.k, np.int32)
        our_valid, _, _ = gpu.propose(m.ctx.buf[req], m.ctx.len[req], m.corpus, m.table, m.depth,
                                      self.k, ours)
        return theirs, valid, ours, int(our_valid)

    def emit(self, req: str, tokens: np.ndarray) -> None:
        slot = self.states.req_id_to_index[req]
        n = int(self.states.total_len.gpu[slot])
        self.states.all_token_ids.gpu[slot, n:n + len(tokens)] = torch.from_numpy(tokens)
        self.states.total_len.gpu[slot] = n + len(tokens)
        self.last_sampled[slot] = int(tokens[-1])
        self.model.extend(req, tokens)

    def finish(self, req: str) -> None:
        self.vllm.on_requests_finished([req])
        self.states.remove_request(req)
        self.model.finish_request(req)


def check(requests, k: int, depth: int, corpus_tokens: int, max_len: int, limit: int) -> dict:
    pair = Pair(k, depth, corpus_tokens, max_len)
    steps = same_valid = same_all = accepted = 0
    differ = []
    done = 0
    for r in requests:
        prompt, output = r.prompt.astype(np.int32), r.output.astype(np.int32)
        if done >= limit or len(prompt) == 0 or len(prompt) + len(output) + k + 1 > max_len:
            continue
        done += 1
        req = str(r.req_id)
        pair.start(req, prompt)
        at, sampled = 0, 1
        while at < len(output):
            theirs, valid, ours, our_valid = pair.drafts(req, sampled)
            steps += 1
            same = our_valid == valid and (ours[:valid] == theirs[:valid]).all()
            same_valid += bool(same)
            same_all += bool(same and (ours == theirs).all())
            if not same and len(differ) < 5:
                differ.append({"request": req, "at": at, "vllm": theirs[:valid].tolist(),
                               "model": ours[:our_valid].tolist()})
            want = output[at:at + valid]
            n = int(np.argmin(np.append(theirs[:len(want)] == want, False)))
            accepted += n
            emit = output[at:at + n + 1]
            pair.emit(req, emit)
            at += len(emit)
            sampled = len(emit)
        pair.finish(req)
    return {"requests": done, "steps": steps, "same_valid_tokens": same_valid,
            "same_all_slots": same_all, "share_same": round(same_valid / max(steps, 1), 4),
            "vllm_accepted_per_step": round(accepted / max(steps, 1), 3), "first_differences":
            differ}


def main():
    ap = parser(__doc__)
    ap.add_argument("--requests", type=int, default=40, help="records per trace")
    ap.add_argument("--agent-requests", type=int, default=10,
                    help="records of agent (its requests are long: over 15 minutes for 40 "
                         "under the interpreter on 2 cores)")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--depth", type=int, default=24)
    ap.add_argument("--corpus-tokens", type=int, default=1 << 16)
    ap.add_argument("--max-len", type=int, default=None,
                    help="max_model_len (default: 16,384 for agent, whose prompts are long, "
                         "2,048 for the rest: vLLM's own-history scan grows with it)")
    ap.add_argument("--only", nargs="*", choices=list(SLICES))
    args = ap.parse_args()
    from suffixspec.fingerprint import hf_encoder

    encode = hf_encoder(args.tokenizer)
    rows = []
    for name in args.only or list(SLICES):
        requests = load_slice(args.traces, name, encode, 0.05)
        max_len = args.max_len or (16384 if name == "agent" else 2048)
        limit = args.agent_requests if name == "agent" else args.requests
        got = check(requests, args.k, args.depth, args.corpus_tokens, max_len, limit)
        rows.append({"trace": name, "max_model_len": max_len, **got})
        print(name, {k: v for k, v in got.items() if k != "first_differences"}, file=sys.stderr,
              flush=True)
    lines = ["| trace | max_model_len | requests | steps | model = vLLM (valid tokens) | all k "
             "slots | vLLM accepted per step |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['trace']} | {r['max_model_len']:,} | {r['requests']} | {r['steps']:,} | "
              f"{r['same_valid_tokens']:,} "
              f"({100 * r['share_same']:.2f}%) | {r['same_all_slots']:,} | "
              f"{r['vllm_accepted_per_step']} |" for r in rows]
    lines.append(f"\nk {args.k}, depth {args.depth}, corpus {args.corpus_tokens:,} tokens; one "
                 f"request at a time, driven by vLLM's drafts.")
    save_results(args.out, "vllm_drafter", {"k": args.k, "depth": args.depth,
                                            "corpus_tokens": args.corpus_tokens, "rows": rows},
                 "\n".join(lines))


if __name__ == "__main__":
    main()
