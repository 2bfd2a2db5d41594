"""``python -m suffixspec.cli``: the ``suffixspec`` command."""

from suffixspec.cli import main

main()
