"""`python -m jobs.cli ...`: the `farm` command line."""

from jobs.cli import main

main()
