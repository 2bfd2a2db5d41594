"""suffixspec: speculative-decoding drafts from suffix tries over past tokens.

>>> from suffixspec import SuffixProposer
>>> prop = SuffixProposer(max_spec_tokens=8)
>>> prop.start_request("r1", [5, 6, 7, 8, 5, 6])
>>> prop.propose(["r1"])[0].token_ids.tolist()
[7, 8]
"""

from suffixspec.draft import Draft, Proposer
from suffixspec.index import SuffixIndex
from suffixspec.pools import CrossPool
from suffixspec.proposer import SuffixProposer

__all__ = ["CrossPool", "Draft", "Proposer", "SuffixIndex", "SuffixProposer"]
__version__ = "0.1.0"
