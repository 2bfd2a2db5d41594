"""Fetch the published vLLM releases' Python sources that the plugin's contract
is checked against, once, so that no test downloads anything.

    python scripts/fetch_vllm_sources.py [VERSION ...]      (default: 0.33.0 0.34.0)

Each release's wheel is downloaded (``pip download --no-deps``, about 240 MB)
and only the folders the contract reads are kept, under
``bench/cache/vllm-sources/<version>/vllm/``; the wheel is then deleted.  A
release already there is skipped.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ROOT / "bench" / "cache" / "vllm-sources"
VERSIONS = ("0.33.0", "0.34.0")
#: What the contract and the tests read of a release (folders and files under ``vllm/``).
KEEP = ("v1/spec_decode/", "v1/worker/", "config/", "distributed/parallel_state.py",
        "plugins/", "utils/import_utils.py", "triton_utils/")


def fetch(version: str) -> Path:
    out = SOURCES / version
    if (out / "vllm" / "config" / "speculative.py").is_file():
        return out / "vllm"
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--only-binary", ":all:", f"vllm=={version}", "-d", tmp], check=True)
        wheel = next(Path(tmp).glob(f"vllm-{version}-*.whl"))
        with zipfile.ZipFile(wheel) as z:
            for name in z.namelist():
                rel = name.removeprefix("vllm/")
                if name.startswith("vllm/") and name.endswith(".py") and rel.startswith(KEEP):
                    z.extract(name, out)
    return out / "vllm"


def main(argv: list[str]) -> None:
    for version in argv or VERSIONS:
        print(f"vLLM {version} sources: {fetch(version)}")


if __name__ == "__main__":
    main(sys.argv[1:])
