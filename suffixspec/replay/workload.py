"""A built-in workload, so ``suffixspec replay`` runs with no downloaded data.

It imitates a SQL tool-calling agent: sessions against generated schemas, each
turn a question answered by a short thought and a JSON tool call.  Outputs
repeat within a session (same tables and columns) and across sessions (same
templates), the two kinds of reuse suffixspec exploits.  Text is tokenized as
UTF-8 bytes (token id = byte value), so no tokenizer file is needed either.
"""

from __future__ import annotations

import json
import random

import numpy as np

from suffixspec.replay.traces import Request

_NOUNS = ["customer", "order", "invoice", "product", "supplier", "employee", "region",
          "shipment", "payment", "account", "ticket", "campaign", "store", "review"]
_FIELDS = ["id", "name", "created_at", "status", "amount", "country", "price", "quantity",
           "email", "category", "score", "updated_at", "owner_id", "total"]
_AGGS = ["COUNT(*)", "SUM({c})", "AVG({c})", "MAX({c})", "MIN({c})"]
_SYSTEM = ("You are a data assistant. Answer by calling the run_sql tool with one SQLite "
           "query. Think step by step in one sentence first.\n")


def _schema(rng: random.Random):
    tables = rng.sample(_NOUNS, 3)
    cols = {t: ["id"] + rng.sample(_FIELDS[1:], 5) for t in tables}
    ddl = "".join(f"CREATE TABLE {t} ({', '.join(c + ' TEXT' for c in cs)});\n"
                  for t, cs in cols.items())
    return tables, cols, ddl


def _turn(rng: random.Random, tables, cols):
    t = rng.choice(tables)
    c = rng.choice(cols[t][1:])
    g = rng.choice([x for x in cols[t][1:] if x != c])
    agg = rng.choice(_AGGS).format(c=c)
    where = f" WHERE {g} = '{rng.choice(['open', 'closed', 'EU', 'US', 'gold'])}'"
    kind = rng.randrange(3)
    if kind == 0:
        q = f"How many {t} rows have {g} set, grouped by {c}?"
        sql = f"SELECT {c}, {agg} FROM {t} GROUP BY {c} ORDER BY 2 DESC;"
    elif kind == 1:
        q = f"What is the {agg.split('(')[0].lower()} of {c} in {t} for one {g}?"
        sql = f"SELECT {agg} FROM {t}{where};"
    else:
        u = rng.choice([x for x in tables if x != t])
        q = f"List {t} {c} with their {u} {cols[u][1]}."
        sql = (f"SELECT {t}.{c}, {u}.{cols[u][1]} FROM {t} JOIN {u} "
               f"ON {u}.id = {t}.id{where} LIMIT 20;")
    thought = f"I need the {t} table and its {c} column, so I will query {t} directly."
    call = json.dumps({"name": "run_sql", "arguments": {"query": sql}})
    return q, f"{thought}\n<tool_call>{call}</tool_call>"


def default_workload(sessions: int = 60, turns: int = 6, seed: int = 0) -> list[Request]:
    """Requests of ``sessions`` agent sessions with ``turns`` turns each."""
    rng = random.Random(seed)
    out = []
    for s in range(sessions):
        tables, cols, ddl = _schema(rng)
        history = _SYSTEM + ddl
        for k in range(turns):
            question, answer = _turn(rng, tables, cols)
            prompt = history + f"<|user|>\n{question}\n<|assistant|>\n"
            out.append(Request(f"s{s}t{k}", encode_bytes(prompt), encode_bytes(answer), f"s{s}"))
            history = prompt + answer + "\n<|tool|>\n[(42,)]\n"
    return out


def encode_bytes(text: str) -> np.ndarray:
    """UTF-8 bytes as int32 token ids."""
    return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)
