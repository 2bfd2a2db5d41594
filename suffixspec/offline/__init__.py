"""The offline wing: pools built from logs, never by a server.

* ``ingest``: request logs (traces, OpenAI chat logs, text, exports) parsed
  and added to a pool, and ``export``;
* ``learn``: the last logged requests served against the pool the rest built,
  so the pool keeps the calibration a live server would have learned;
* ``fleet_build``: shard pools built as Ray tasks and merged with
  ``add-segment``, one ingest -> learn -> commit workflow with the CLI's.

The CLI (``suffixspec ingest``, ``export``, ``fleet-build``) is their front.
"""
