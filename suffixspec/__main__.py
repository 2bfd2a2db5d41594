"""``python -m suffixspec``: the command line (``suffixspec --help``)."""

from suffixspec.cli import main

main()
