"""Brute-force reference for the suffix index: every answer by scanning."""

from __future__ import annotations

from collections import Counter


class NaiveIndex:
    def __init__(self, max_depth: int):
        self.max_depth = max_depth
        self.trees: dict[int, dict[int, list[int]]] = {}

    def occurrences(self, tree: int, x: list[int]) -> list[tuple[int, int]]:
        """(seq, start) of every occurrence of ``x`` (``len(x) <= max_depth``)."""
        if len(x) > self.max_depth:
            return []
        out = []
        for s, toks in self.trees[tree].items():
            n = len(x)
            for i in range(len(toks) - n + 1):
                if toks[i:i + n] == x:
                    out.append((s, i))
        return out

    def count(self, tree: int, x: list[int]) -> int:
        if not x:
            return sum(len(t) for t in self.trees[tree].values())
        return len(self.occurrences(tree, x))

    def continuations(self, tree: int, x: list[int]) -> Counter:
        if len(x) >= self.max_depth:
            return Counter()
        seqs = self.trees[tree]
        return Counter(seqs[s][i + len(x)] for s, i in self.occurrences(tree, x)
                       if i + len(x) < len(seqs[s])) if x else Counter(
            t for toks in seqs.values() for t in toks)

    def longest_match(self, tree: int, ctx: list[int], need_continuation: bool,
                      max_len: int) -> int:
        best = -1
        for n in range(0, min(len(ctx), max_len) + 1):
            x = ctx[len(ctx) - n:]
            if need_continuation:
                ok = bool(self.continuations(tree, x))
            else:
                ok = n == 0 or self.count(tree, x) > 0
            if ok:
                best = n
            else:
                break
        return best

    def tree_candidates(self, tree: int, x: list[int], min_prob: float, limit: int):
        """Every continuation path from ``x`` with probability >= min_prob.

        Returns {path tuple: prob}.  ``limit`` caps the path length.
        """
        out = {}
        frontier = [((), 1.0)]
        while frontier:
            path, prob = frontier.pop()
            if len(path) >= limit:
                continue
            ctx = x + list(path)
            conts = self.continuations(tree, ctx)
            total = self.count(tree, ctx)
            for tok, c in conts.items():
                p = prob * c / total
                if p >= min_prob:
                    out[path + (tok,)] = p
                    frontier.append((path + (tok,), p))
        return out
