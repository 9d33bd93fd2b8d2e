"""One module per schema revision, oldest first (0001_initial: the tables of the first release)."""
