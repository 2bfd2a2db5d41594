"""transformers ``generate`` drafting from a SuffixProposer, with a tiny random Llama.

Real transformers, a real (locally built) model and tokenizer.  Forward
passes are counted with a forward hook on the model.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("torch") is None:
    pytest.skip("transformers is not installed", allow_module_level=True)

import torch  # noqa: E402

from suffixspec import SuffixProposer  # noqa: E402

SQL_TRACE = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "traces" / \
    "sql_spider_bird.jsonl.gz"


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from tiny_llama import build
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = build(tmp_path_factory.mktemp("tiny-llama-hf"), SQL_TRACE)
    return AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)


def counted(model):
    """Generate through ``model`` and also return how many forward passes it took."""
    calls = [0]
    handle = model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))

    def run(ids, **kw):
        calls[0] = 0
        out = model.generate(ids, max_new_tokens=40, do_sample=False, **kw)
        return out[0].tolist(), calls[0]

    return run, handle


PROMPTS = ["SELECT name FROM singer WHERE age > 30 ORDER BY name; SELECT name FROM singer WHERE",
           "SELECT count(*) FROM concert WHERE year = 2014; SELECT count(*) FROM concert WHERE",
           "SELECT name, country FROM singer WHERE country = 'France'; SELECT name, country FROM"]


def test_greedy_outputs_are_plain_generates_with_fewer_forward_passes(llama):
    from suffixspec.integrations.transformers import use_suffixspec

    model, tok = llama
    run, handle = counted(model)
    inputs = [tok(p, return_tensors="pt").input_ids for p in PROMPTS]
    plain = [run(ids) for ids in inputs]
    use_suffixspec(model, SuffixProposer(max_depth=32, max_spec_tokens=8))
    try:
        first = [run(ids) for ids in inputs]
        second = [run(ids) for ids in inputs]  # the pool now holds the first outputs
    finally:
        handle.remove()
    assert [o for o, _ in first] == [o for o, _ in plain]
    assert [o for o, _ in second] == [o for o, _ in plain]
    passes = [sum(n for _, n in r) for r in (plain, first, second)]
    assert passes[0] == 3 * 40  # one pass per token without drafts
    assert passes[1] < passes[0] and passes[2] < passes[1], passes


def test_an_explicit_prompt_lookup_keeps_transformers_behaviour(llama):
    from suffixspec.integrations.transformers import use_suffixspec

    model, tok = llama
    prop = SuffixProposer(max_depth=32, max_spec_tokens=8)
    use_suffixspec(model, prop)
    ids = tok(PROMPTS[0], return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=10, do_sample=False, prompt_lookup_num_tokens=4)
    assert out.shape[1] == ids.shape[1] + 10
    assert prop.cross.tokens == 0 and not prop.active_requests  # not used
    out = model.generate(ids, max_new_tokens=10, do_sample=False)
    assert prop.cross.tokens > 0 and not prop.active_requests  # used, output kept


def test_batches_are_refused_in_one_line(llama):
    from suffixspec.integrations.transformers import use_suffixspec

    model, tok = llama
    prop = SuffixProposer(max_depth=32, max_spec_tokens=8)
    use_suffixspec(model, prop)
    ids = torch.cat([tok(PROMPTS[0], return_tensors="pt").input_ids] * 2)
    with pytest.raises(ValueError, match="batch_size = 1|batch size 1"):
        model.generate(ids, max_new_tokens=5, do_sample=False)
    assert not prop.active_requests
