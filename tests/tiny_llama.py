"""A tiny random-weight Llama and a small BPE tokenizer, built locally.

vLLM loads the folder like any Hugging Face checkpoint.  Nothing is fetched
from a hub: the tokenizer is trained on a slice of the shared SQL trace (or on
built-in text when the trace is absent) and the weights are random.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from suffixspec.replay.traces import read_records

FALLBACK_TEXT = [
    "SELECT name, country FROM singer WHERE age > 30 ORDER BY name;",
    "SELECT count(*) FROM concert WHERE year = 2014 GROUP BY stadium_id;",
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
]


def corpus(trace: Path | None, records: int = 300) -> list[str]:
    if trace is None or not trace.is_file():
        return FALLBACK_TEXT * 50
    texts = []
    for rec in itertools.islice(read_records(trace), records):
        texts.append(rec["prompt"])
        texts.append(rec["output"])
    return texts


def build(folder: Path, trace: Path | None = None, vocab_size: int = 1024,
          hidden: int = 128, layers: int = 2, seed: int = 0) -> Path:
    """Write a tokenizer and a random Llama to ``folder``; returns it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<unk>", "<s>", "</s>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(trace), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>",
                                   bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(folder)

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=hidden,
                         intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=hidden // 64, num_key_value_heads=1,
                         max_position_embeddings=2048, bos_token_id=1, eos_token_id=2,
                         tie_word_embeddings=False, torch_dtype="float32")
    model = LlamaForCausalLM(config)
    model.save_pretrained(folder, safe_serialization=True)
    return folder
