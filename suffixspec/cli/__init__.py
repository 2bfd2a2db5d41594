"""The ``suffixspec`` command line: thin wrappers over the library.

Data goes to stdout (JSON with ``--json``); progress bars and logs to stderr.
"""

import click

from suffixspec.cli.pool import (add_segment_cmd, export_cmd, fleet_build_cmd, forget_cmd,
                                 ingest_cmd, prune_cmd, snapshot_cmd, stats_cmd)
from suffixspec.cli.replay import replay_cmd
from suffixspec.cli.warmup import warmup_cmd


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="suffixspec")
def main():
    """Suffix-trie speculative decoding: replay traces, build and manage pools."""


for command in (replay_cmd, ingest_cmd, stats_cmd, prune_cmd, forget_cmd, export_cmd,
                snapshot_cmd, add_segment_cmd, fleet_build_cmd, warmup_cmd):
    main.add_command(command)

__all__ = ["main"]
