"""`python -m gemmgen.cli`: the gemmgen command, as the console script runs it."""

from . import main

main()
