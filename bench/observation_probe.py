"""Do other conversations' prompts hold what an agent's outputs copy?  A probe.

Usage (from the repository root):

    python bench/observation_probe.py --traces ../shared/data/traces \\
        --tokenizer ../shared/tokenizers/qwen [--sessions 40] [--n 4 8]

The cross-request pool holds past outputs only.  An agent's prompts carry
tool observations (file listings, source files, test runs), and conversations
on one repository view the same files.  This bounds what indexing the other
conversations' prompts could add, with no drafter involved: over the agent
trace's first ``--sessions`` conversations in file order, an output token is
*covered* when the n tokens ending at it occur earlier in what a drafter can
already match (the request's own prompt, its output before the token, every
earlier output of the trace), and *covered only by prompts* when they do not
but occur in the new prompt text (``prompt_delta``) of an earlier turn of
another conversation.  Prints both shares of the output tokens per n;
writes nothing.
"""

from __future__ import annotations

from suffixspec.replay.traces import hf_encoder, read_records

from bench_common import TRACES, parser


def grams(seq: list[int], n: int) -> set[tuple[int, ...]]:
    """Every run of ``n`` tokens in ``seq``."""
    return {tuple(seq[i:i + n]) for i in range(len(seq) - n + 1)}


def coverage(records: list[dict], deltas: list[list[int]], outputs: list[list[int]],
             n: int) -> tuple[int, int, int]:
    """(output tokens, covered, covered only by other conversations' prompts)."""
    prompts: dict[str, set] = {}    # conversation -> runs of its prompt text so far
    past_outputs: set = set()
    total = covered = only_prompts = 0
    for rec, delta, out in zip(records, deltas, outputs):
        session = rec["session"]
        own = prompts.setdefault(session, set())
        own |= grams(delta, n)
        written: set = set()
        for i in range(n - 1, len(out)):
            run = tuple(out[i - n + 1:i + 1])
            total += 1
            if run in own or run in past_outputs or run in written:
                covered += 1
            elif any(run in ps for s, ps in prompts.items() if s != session):
                only_prompts += 1
            written.add(run)
        past_outputs |= written
    return total, covered, only_prompts


def main():
    ap = parser(__doc__)
    ap.add_argument("--sessions", type=int, default=40)
    ap.add_argument("--n", type=int, nargs="+", default=[4, 8])
    args = ap.parse_args()
    encode = hf_encoder(args.tokenizer)
    records = list(read_records(f"{args.traces}/{TRACES['agent'][0]}", max_sessions=args.sessions))
    deltas = encode([r["prompt_delta"] for r in records])
    outputs = encode([r["output"] for r in records])
    print(f"agent, first {args.sessions} conversations ({len(records)} turns)\n")
    print("| n | output tokens | covered by own context and past outputs "
          "| covered only by other conversations' prompts |")
    print("|---|---|---|---|")
    for n in args.n:
        total, covered, only = coverage(records, deltas, outputs, n)
        print(f"| {n} | {total} | {covered / total:.3f} | {only / total:.4f} |")


if __name__ == "__main__":
    main()
