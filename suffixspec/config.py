"""The proposer's settings, each default and range declared once.

``ProposerConfig`` is what ``SuffixProposer`` runs on; the CLI, the vLLM
plugin's settings, the arctic-compatible class and replay all build one.  No
Numba here: the vLLM plugin reads it in processes that never draft.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

#: Settings earlier versions had, and what to do instead: naming one is refused
#: with this line (``from_settings``), never silently ignored.
REMOVED = {
    "policy": "suffixspec drafts with its calibrated policy only; arctic-inference's rule "
              "is in suffixspec.compat.arctic (mode=\"arctic\")",
    "recency": "it moved drafts by at most 0.15%",
    "merge_trees": "tree drafts always merge every candidate's tree",
    "long_match_bias": "it belonged to the counts policy",
    "all_match_lengths": "every match length is always tried",
    "self_discount": "the context's own occurrence is always left out",
}

#: Seconds between a persistent pool's looks for other processes' commits.
REFRESH_INTERVAL = 1.0
#: ``refresh_interval`` of a pool whose only writer is its own proposer (learning
#: from logs, a replay): no looks for others' commits, so what it drafts never
#: rests on when one fell between two requests (a year: longer than any run).
NO_REFRESH = 365 * 24 * 3600.0
#: Where outputs go when no namespace is named.
DEFAULT_NAMESPACE = "default"
MAX_NAMESPACE = 128

#: arctic-inference's defaults for the length knobs (also vLLM's for method "suffix").
ARCTIC_SPEC_FACTOR = 1.0
ARCTIC_MIN_TOKEN_PROB = 0.1

#: Verification cost of one drafted token, as a share of a target-model step.
DEFAULT_DRAFT_COST = 0.03

#: Token budget of the cross-request pool.
DEFAULT_CROSS_POOL_TOKENS = 4_000_000

#: How far back the reference (the newest earlier occurrence of a request's
#: longest own match) is looked for, in tokens.
DEFAULT_NEWEST_WINDOW = 4096
DEFAULT_FAMILY_OUTPUTS = 2

#: Tokens of finished requests' own tries kept for a conversation's next turn.
DEFAULT_REUSE_TOKENS = 1 << 20
#: Namespaces besides the proposer's with a calibration table of their own
#: (``ProposerConfig.namespace_tables``): 1.95 MB each.
DEFAULT_NAMESPACE_TABLES = 16


def check_range(name: str, value, low: float = 0.0, high: float = float("inf"),
                allow_none: bool = False):
    """``value`` if it is a finite number in ``[low, high]`` (or None, with
    ``allow_none``), else ``ValueError`` naming ``name``.  Settings are checked
    where they are read: a negative pool budget would prune a shared pool to
    nothing at its next snapshot."""
    if value is None and allow_none:
        return value
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and low <= value <= high):
        bound = f"in [{low:g}, {high:g}]" if high < float("inf") else f">= {low:g}"
        raise ValueError(f"{name} must be a finite number {bound}"
                         f"{' (or unset)' if allow_none else ''}, got {value!r}")
    return value


def check_namespace(namespace) -> str:
    """``namespace`` if it is a valid namespace name, else ``ValueError``."""
    if not isinstance(namespace, str) or not 0 < len(namespace) <= MAX_NAMESPACE:
        raise ValueError(f"namespace must be a non-empty string of at most {MAX_NAMESPACE} "
                         f"characters, got {namespace!r}")
    try:
        namespace.encode("utf-8")  # it is stored as UTF-8
    except UnicodeEncodeError:
        raise ValueError(f"namespace must be valid text, got {namespace!r}") from None
    return namespace


@dataclass(frozen=True)
class ProposerConfig:
    """Settings of a ``SuffixProposer``; invalid values raise ``ValueError``.

    max_depth:
        Longest indexed substring, and so the longest usable context match.
    max_spec_tokens:
        Upper bound on draft length (engines may pass lower per-request limits
        to ``propose``).
    max_spec_factor, max_spec_offset:
        A draft from a ``match_len``-token match holds at most
        ``match_len * max_spec_factor + max_spec_offset`` tokens.  Unset: no
        cap (the draft cost sets the length).
    min_token_prob:
        Drafting stops before a token whose estimated probability falls
        below this.  Unset: none (the draft cost sets the bar).
    tree:
        Draft best-first token trees, merged from every candidate's (each
        match length in each pool), instead of single paths.
    draft_cost:
        Verification cost of one drafted token, as a share of a
        target-model step.
    anchors:
        Also match the start of the output against the starts of past
        outputs (see ``suffixspec.anchors``).
    newest_window:
        Give every drafted token a feature: whether it agrees with what
        followed the newest earlier occurrence of the request's longest own
        match (vLLM's drafter's rule), looked for at most this many tokens
        back, and draft that continuation too (0: not).  Calibration learns
        per workload how far each is to be trusted.
    arbitrate:
        With a reference, path drafts only: keep the policy's pick and the
        reference's draft at each step, score both once the tokens that
        followed are known, and draft the reference instead where it has
        done better at that pair of match lengths (``native.arbiter``).
        Drafting on the device (vLLM's ``method: "suffixspec"``) follows it
        unless ``SUFFIXSPEC_DEVICE_ARBITER=0`` (docs/device.md).
    family_outputs:
        A request that starts a conversation (continues no finished one)
        also indexes, in its own trie, the latest outputs of this many
        earlier requests of its *family*: requests of its namespace whose
        prompts start with the same 64 tokens (one database's schema, one
        tool list, one task).  They draft as its own history does, scored
        by the same calibration; the cross pool's counts mix every family's
        continuations (0: not; kept in memory while the cross pool is on).
    cross_pool_tokens:
        Token budget of the cross-request pool (oldest outputs are evicted
        first); 0 disables the pool, None leaves it unbounded.
    cross_pool_requests:
        Most outputs the in-memory cross-request pool keeps; None: no limit
        beyond the token budget.
    namespace:
        Where finished outputs go, and what requests draw from by default.
    shared_namespace:
        A namespace every request also draws from (None: none).
    namespace_tables:
        Most namespaces besides ``namespace`` whose requests' drafts are
        calibrated by a table of their own, learned from them alone; the
        requests of any other namespace share ``namespace``'s (0: one table
        for all).  Workloads served together accept drafts differently
        (docs/findings.md, "One server, five workloads").  Only
        ``namespace``'s table is kept in a persistent pool.
    reuse_tokens:
        Finished requests' own tries kept for the next turn of a conversation
        (the latest 64 requests, at most this many tokens in all; 0: none).
        A request whose prompt starts with a finished request's prompt and
        output takes over its trie and indexes only the tokens after them.

    Drafts are calibrated (``suffixspec.native.calibrated``): every match
    length of every pool is tried, the context's own occurrence is left out
    of the counts, and the draft with the best expected gain wins.
    """

    max_depth: int = 64
    max_spec_tokens: int = 16
    max_spec_factor: float | None = None
    max_spec_offset: float = 0.0
    min_token_prob: float | None = None
    tree: bool = False
    draft_cost: float = DEFAULT_DRAFT_COST
    anchors: bool = True
    newest_window: int = DEFAULT_NEWEST_WINDOW
    arbitrate: bool = True
    family_outputs: int = DEFAULT_FAMILY_OUTPUTS
    cross_pool_tokens: int | None = DEFAULT_CROSS_POOL_TOKENS
    cross_pool_requests: int | None = None
    namespace: str = DEFAULT_NAMESPACE
    shared_namespace: str | None = None
    reuse_tokens: int = DEFAULT_REUSE_TOKENS
    namespace_tables: int = DEFAULT_NAMESPACE_TABLES

    def __post_init__(self):
        if not 2 <= self.max_depth <= 1024:
            raise ValueError(f"max_depth must be in [2, 1024], got {self.max_depth}")
        if self.max_spec_tokens < 0:
            raise ValueError(f"max_spec_tokens must be >= 0, got {self.max_spec_tokens}")
        if self.max_spec_factor is not None and not 0 <= self.max_spec_factor < float("inf"):
            raise ValueError(f"max_spec_factor must be finite and >= 0, got "
                             f"{self.max_spec_factor}")
        if not -float("inf") < self.max_spec_offset < float("inf"):
            raise ValueError(f"max_spec_offset must be finite, got {self.max_spec_offset}")
        if self.min_token_prob is not None and not 0.0 <= self.min_token_prob <= 1.0:
            raise ValueError(f"min_token_prob must be in [0, 1], got {self.min_token_prob}")
        if not 0.0 <= self.draft_cost < 1.0:
            raise ValueError(f"draft_cost must be in [0, 1), got {self.draft_cost}")
        if self.reuse_tokens < 0:
            raise ValueError(f"reuse_tokens must be >= 0, got {self.reuse_tokens}")
        if not isinstance(self.newest_window, int) or isinstance(self.newest_window, bool):
            raise ValueError(f"newest_window must be a whole number, got {self.newest_window!r}")
        check_range("newest_window", self.newest_window, 0, 1 << 24)
        if not isinstance(self.arbitrate, bool):
            raise ValueError(f"arbitrate must be True or False, got {self.arbitrate!r}")
        if not isinstance(self.family_outputs, int) or isinstance(self.family_outputs, bool):
            raise ValueError(f"family_outputs must be a whole number, got "
                             f"{self.family_outputs!r}")
        check_range("family_outputs", self.family_outputs, 0, 64)
        check_range("cross_pool_tokens", self.cross_pool_tokens, allow_none=True)
        check_range("cross_pool_requests", self.cross_pool_requests, allow_none=True)
        if not isinstance(self.namespace_tables, int) or isinstance(self.namespace_tables, bool):
            raise ValueError(f"namespace_tables must be a whole number, got "
                             f"{self.namespace_tables!r}")
        check_range("namespace_tables", self.namespace_tables, 0, 1024)
        check_namespace(self.namespace)
        if self.shared_namespace is not None:
            check_namespace(self.shared_namespace)

    @classmethod
    def from_settings(cls, base: ProposerConfig | None = None, **settings) -> ProposerConfig:
        """``base`` (default: the defaults) with ``settings`` changed; a setting
        that does not exist, or no longer does (``REMOVED``), is one
        ``ValueError`` line."""
        known = {f.name for f in fields(cls)}
        for name in settings:
            if name in REMOVED:
                raise ValueError(f"setting {name!r} was removed in suffixspec 0.2: "
                                 f"{REMOVED[name]}")
            if name not in known:
                raise ValueError(f"unknown setting {name!r}; the settings are "
                                 f"{', '.join(sorted(known))}")
        return replace(base or cls(), **settings)

    @property
    def spec_factor(self) -> float:
        """The length cap's factor in force: -1.0 for no cap."""
        return -1.0 if self.max_spec_factor is None else float(self.max_spec_factor)

    @property
    def token_prob_floor(self) -> float:
        """The probability floor in force."""
        return 0.0 if self.min_token_prob is None else float(self.min_token_prob)

    def replace(self, **changes) -> ProposerConfig:
        return self.from_settings(self, **changes)
