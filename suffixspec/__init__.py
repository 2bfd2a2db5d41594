"""suffixspec: speculative-decoding drafts from suffix tries over past tokens."""
