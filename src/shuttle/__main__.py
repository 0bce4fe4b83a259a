"""``python -m shuttle``: the same as the ``shuttle`` command."""

from shuttle.cli import main

main()
