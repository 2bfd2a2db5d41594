"""What the engine emits while the drafter's kernels compile, kept for the pool.

With an empty kernel cache the engine serves without drafts until the kernels
are ready (``suffixspec.kernels.BackgroundStart``).  The requests that finish
meanwhile are a fresh server's first outputs: exactly what the cross-request
pool lacks.  ``BeforeReady`` records each request's prompt and output from
the engine's batch while there is no proposer, and hands the finished ones to
the proposer once it exists, as if it had seen them finish.
"""

from __future__ import annotations

import numpy as np

#: Most tokens (prompts and outputs) kept while compiling; later requests are not kept.
MAX_TOKENS = 1 << 22


class BeforeReady:
    def __init__(self, max_tokens: int = MAX_TOKENS):
        self.max_tokens = max_tokens
        self.open: dict[str, tuple[np.ndarray, list[np.ndarray], int]] = {}  # prompt, output, seen
        self.finished: list[tuple[str, np.ndarray, np.ndarray]] = []
        self.tokens = 0  # held in ``open`` and ``finished``

    def see(self, batch, sampled_token_ids) -> None:
        """One engine step without a proposer: note what each decoding request emitted."""
        token_ids = batch.token_ids_cpu
        for i, req in enumerate(batch.req_ids[:len(sampled_token_ids)]):
            if not sampled_token_ids[i]:
                continue  # still prefilling
            total = int(batch.num_tokens_no_spec[i])
            entry = self.open.get(req)
            if entry is not None and entry[2] > total:  # tokens were taken back: start over
                self._forget(req)
                entry = None
            if entry is None:
                if self.tokens + total > self.max_tokens:
                    continue
                n_prompt = int(batch.num_prompt_tokens[i])
                entry = (token_ids[i, :n_prompt].copy(), [], n_prompt)
                self.tokens += n_prompt
            prompt, output, seen = entry
            if total > seen:
                output.append(token_ids[i, seen:total].copy())
                self.tokens += total - seen
            self.open[req] = (prompt, output, total)

    def removed(self, req: str) -> None:
        """The engine dropped ``req``: its output is final."""
        entry = self.open.pop(req, None)
        if entry is None:
            return
        prompt, output, _ = entry
        out = np.concatenate(output) if output else np.empty(0, np.int32)
        self.finished.append((req, prompt, out))

    def hand_over(self, proposer) -> int:
        """Give the finished requests to ``proposer``; returns how many.

        Requests still running are left to the drafter, which indexes them
        from the engine's batch at their next step.
        """
        done = self.finished
        for req, prompt, output in done:
            proposer.start_request(req, prompt)
            if output.shape[0]:
                proposer.extend(req, output)
            proposer.finish_request(req)
        self.finished, self.open, self.tokens = [], {}, 0
        return len(done)

    def _forget(self, req: str) -> None:
        prompt, output, _ = self.open.pop(req)
        self.tokens -= prompt.shape[0] + sum(o.shape[0] for o in output)
