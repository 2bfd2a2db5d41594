"""The draft a proposer returns, and the proposer contract every engine uses."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Protocol, Sequence

import numpy as np

_EMPTY_I = np.empty(0, np.int32)
_EMPTY_F = np.empty(0, np.float32)


@dataclass
class Draft:
    """Speculated tokens for one request.

    ``token_ids`` (int32) are the draft; ``parents[i]`` (int32) is the index of
    token i's parent in the draft, -1 for a first token, so a linear draft has
    ``parents == [-1, 0, 1, ...]``.  ``probs`` (float32) are the estimated
    probabilities that each token is reached and right; ``score`` is their sum
    (the expected number of accepted tokens).  ``match_len`` is how many
    context tokens matched, ``source`` the pool that drafted ("request",
    "cross" or "" for no draft).
    """

    token_ids: np.ndarray = field(default_factory=lambda: _EMPTY_I)
    parents: np.ndarray = field(default_factory=lambda: _EMPTY_I)
    probs: np.ndarray = field(default_factory=lambda: _EMPTY_F)
    score: float = 0.0
    match_len: int = 0
    source: str = ""

    def __len__(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def is_path(self) -> bool:
        """True when every token's parent is the token before it."""
        return bool(np.array_equal(self.parents, np.arange(-1, len(self) - 1)))


class Proposer(Protocol):
    """What every engine adapter and the replay harness drive.

    Call order per request: ``start_request`` once, then per engine step
    ``propose`` (batched over requests) followed by ``extend`` with the tokens
    the engine emitted, and finally ``finish_request`` (learn from the output)
    or ``abort_request`` (forget it).  A proposer may also offer
    ``extend_batch(req_ids, token_ids)``, the same as ``extend`` for every
    request of a step at once; callers use it when present.
    """

    def start_request(self, req_id: Hashable, prompt_token_ids: Sequence[int] | np.ndarray) -> None: ...

    def extend(self, req_id: Hashable, token_ids: Sequence[int] | np.ndarray) -> None: ...

    def propose(self, req_ids: Sequence[Hashable],
                max_spec_tokens: int | Sequence[int] | None = None) -> list[Draft]: ...

    def finish_request(self, req_id: Hashable) -> None: ...

    def abort_request(self, req_id: Hashable) -> None: ...
