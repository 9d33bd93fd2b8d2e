"""What more than one kernel family shares, so that no family imports another.

lse    the log-sum-exp convention of every attention-like output: its base, and what an empty row
       (a query that sees no key) returns
"""
