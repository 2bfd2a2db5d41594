"""Other projects' APIs, served by suffixspec (``arctic``: arctic-inference's
suffix-decoding cache)."""
