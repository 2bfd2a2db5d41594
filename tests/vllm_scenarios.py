"""Engine runs for test_vllm_plugin.py, each in its own process.

vLLM keeps per-process state (plugins load once, the in-process engine owns
the process), so every scenario runs as

    python tests/vllm_scenarios.py SCENARIO --model DIR ... 

and prints one JSON line last on stdout.
"""

from __future__ import annotations

import json
import sys
import time

import click


def block_arctic() -> None:
    """Make ``import arctic_inference`` fail in this process."""
    sys.modules["arctic_inference"] = None  # type: ignore[assignment]


def spec_config(k: int) -> dict:
    return {"method": "suffix", "num_speculative_tokens": k,
            "suffix_decoding_max_tree_depth": 32}


def engine(model: str, spec: bool, k: int, max_model_len: int, kv_bytes: int, max_num_seqs: int,
           block_size: int | None = None, tp: int = 1):
    from vllm import LLM

    return LLM(model, dtype="float32", enforce_eager=True,
               distributed_executor_backend="uni" if tp == 1 else "mp",
               tensor_parallel_size=tp,
               max_model_len=max_model_len, max_num_seqs=max_num_seqs, seed=0,
               block_size=block_size,
               kv_cache_memory_bytes=kv_bytes, disable_log_stats=False,
               speculative_config=spec_config(k) if spec else None)


def counters(llm) -> dict:
    return {m.name: m.value for m in llm.get_metrics()
            if m.name.startswith(("vllm:spec_decode_num", "vllm:num_preemptions"))
            and hasattr(m, "value")}


def drafter_stats(llm):
    def stats(worker):
        drafter = getattr(worker.model_runner, "drafter", None)
        return drafter.stats() if hasattr(drafter, "stats") else None

    return llm.collective_rpc(stats)[0]


def drafter_ready(llm) -> bool:
    def ready(worker):
        return getattr(worker.model_runner.drafter, "proposer", None) is not None

    return llm.collective_rpc(ready)[0]


def _rank_stats(worker):
    drafter = getattr(worker.model_runner, "drafter", None)
    return drafter.stats() if hasattr(drafter, "stats") else None


def cache_module(llm) -> str | None:
    """Where the class of vLLM's own suffix proposer's cache comes from."""
    def name(worker):
        cache = getattr(getattr(worker.model_runner, "drafter", None), "suffix_cache", None)
        return None if cache is None else type(cache).__module__

    return llm.collective_rpc(name)[0]


def drafter_class(llm) -> str | None:
    def name(worker):
        drafter = getattr(worker.model_runner, "drafter", None)
        return None if drafter is None else type(drafter).__qualname__

    return llm.collective_rpc(name)[0]


def inject_faults(llm, every: int) -> None:
    """Make every ``every``-th batched propose of the suffixspec proposer raise."""
    def install(worker):
        proposer = worker.model_runner.drafter.proposer
        original = proposer.propose
        calls = [0]

        def propose(*args, **kwargs):
            calls[0] += 1
            if calls[0] % every == 0:
                raise RuntimeError("injected proposer fault")
            return original(*args, **kwargs)

        proposer.propose = propose

    llm.collective_rpc(install)


@click.group()
def main() -> None:
    pass


@main.command()
@click.option("--model", required=True)
@click.option("--prompts", "prompts_file", required=True)
@click.option("--spec/--no-spec", default=True)
@click.option("--modes", default="single,batch")
@click.option("--k", default=8)
@click.option("--max-tokens", default=48)
@click.option("--max-model-len", default=1024)
@click.option("--kv-bytes", default=64 << 20)
@click.option("--max-num-seqs", default=8)
@click.option("--block-size", type=int, default=None)
@click.option("--fault-every", default=0)
@click.option("--no-arctic", is_flag=True, help="Block arctic-inference imports.")
@click.option("--tp", default=1, help="Tensor-parallel ranks.")
@click.option("--unknown-runner", is_flag=True,
              help="Make the plugin's runner contract check fail, as on an unknown vLLM.")
@click.option("--namespaces", default="",
              help="Comma-separated names given to the prompts in turn as their "
                   "vllm_xargs suffixspec_namespace.")
@click.option("--then-wait-for-drafts", default=0.0,
              help="After the modes, wait up to this many seconds for the drafter to be "
                   "ready (kernels compiling), then run the batch again as 'after_ready'.")
def generate(model, prompts_file, spec, modes, k, max_tokens, max_model_len, kv_bytes,
             max_num_seqs, block_size, fault_every, no_arctic, tp, unknown_runner,
             namespaces, then_wait_for_drafts):
    """Greedy outputs for the prompts, one at a time and/or as one batch."""
    if no_arctic:
        block_arctic()
    if unknown_runner:
        from suffixspec.integrations.vllm import contract

        contract.v1_problems = lambda root: ["GPUModelRunner is not what this test pretends"]
    from vllm import SamplingParams

    prompts = [{"prompt_token_ids": p} for p in json.load(open(prompts_file))]
    llm = engine(model, spec, k, max_model_len, kv_bytes, max_num_seqs, block_size, tp)
    if fault_every:
        inject_faults(llm, fault_every)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    if namespaces:
        names = namespaces.split(",")
        params = [SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                                 extra_args={"suffixspec_namespace": names[i % len(names)]})
                  for i in range(len(prompts))]
    result: dict = {}
    for mode in modes.split(","):
        if mode == "single":
            outs = [llm.generate([p], params[i] if isinstance(params, list) else params,
                                 use_tqdm=False)[0] for i, p in enumerate(prompts)]
        else:
            outs = llm.generate(prompts, params, use_tqdm=False)
        result[mode] = [list(o.outputs[0].token_ids) for o in outs]
    if then_wait_for_drafts:
        result["before_ready"] = {"counters": counters(llm), "drafter": drafter_stats(llm),
                                  "ready": drafter_ready(llm)}
        deadline = time.monotonic() + then_wait_for_drafts
        while not drafter_ready(llm) and time.monotonic() < deadline:
            time.sleep(1.0)
        outs = llm.generate(prompts, params, use_tqdm=False)
        result["after_ready"] = [list(o.outputs[0].token_ids) for o in outs]
    result["counters"] = counters(llm)
    result["drafter"] = drafter_stats(llm)
    result["drafter_class"] = drafter_class(llm)
    result["cache_module"] = cache_module(llm)
    if tp > 1:
        result["ranks"] = llm.collective_rpc(_rank_stats)
    print(json.dumps(result))


@main.command()
@click.option("--model", required=True)
@click.option("--prompts", "prompts_file", required=True)
@click.option("--spec/--no-spec", default=True)
@click.option("--turns", default=3)
@click.option("--stop-token", type=int, default=None, help="Outputs end at this token.")
def conversation(model, prompts_file, spec, turns, stop_token):
    """Multi-turn: each turn's prompt is the last prompt + its output + new tokens."""
    from vllm import SamplingParams

    prompts = [p[-100:] for p in json.load(open(prompts_file))[:3]]
    llm = engine(model, spec, 8, 1024, 64 << 20, 8)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True,
                            stop_token_ids=None if stop_token is None else [stop_token])
    outputs = []
    for turn in range(turns):
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        done = [list(o.outputs[0].token_ids) for o in outs]
        outputs.append(done)
        # The next turn: what was said so far, then a new message (the
        # previous prompt's first tokens stand in for it).
        prompts = [p + d + p[:12] for p, d in zip(prompts, done)]
    print(json.dumps({"turns": outputs, "counters": counters(llm),
                      "drafter": drafter_stats(llm)}))


@main.command()
@click.option("--model", required=True)
@click.option("--no-arctic", is_flag=True)
def validate(model, no_arctic):
    """Build the engine config for ``method: "suffix"``; report the proposer class."""
    if no_arctic:
        block_arctic()
    from vllm.engine.arg_utils import EngineArgs
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    out = {"ok": True, "error": None}
    try:
        EngineArgs(model=model, dtype="float32", max_model_len=512,
                   speculative_config=spec_config(4)).create_engine_config()
    except Exception as e:
        out = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    import vllm.v1.spec_decode.suffix_decoding as sd

    cls = sd.SuffixDecodingProposer
    out["proposer"] = f"{cls.__module__}.{cls.__qualname__}"
    print(json.dumps(out))


if __name__ == "__main__":
    main()
