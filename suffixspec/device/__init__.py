"""Drafting on the device: the host chooses candidates, the device drafts.

On a GPU server the engine's step is the critical path.  Drafting on the host
inside the step means waiting for the step to finish (the host needs the
tokens it emitted) and stalls the GPU through the host's work.  Here the work
is split:

* the host (a feeder thread, ``suffixspec.integrations.vllm.feeder``) runs the
  full calibrated policy over the request's own trie and the pools, and ships
  per request a few *candidate windows* (``native.windows``): the context's
  last tokens, then the candidate's continuation with its counts, and the
  runner-up branches at its first branch points;
* the device, every step, lines each window up with the request's true
  context (already on the device), also scans the request's own history
  (longest match, newest first), scores every candidate with the calibration
  table and the cost threshold, and writes drafts, per-slot confidences and
  valid counts, with no read back to the host (``draft_ref.draft_step``; a
  fused Triton kernel, ``draft_triton``, is held to it).

Windows are at most one step old: while the context follows a shipped path or
branch the drafts are the host policy's own; after a divergence no window
covers, the own-history scan drafts until the next windows land.

torch (and Triton) are needed only here: ``import suffixspec`` and the V1
runner's path import neither.  The GPU paths have run on an H100 in
``bench/device_check.py`` (kernels against their reference, the no-sync audit,
a synthetic MRV2 loop; ``docs/device.md``), not under vLLM; on CPU tensors the
same code runs in the tests and in replay (``suffixspec replay --engine
suffixspec-device``).  ``graphs`` replays the step as CUDA graphs.
"""
