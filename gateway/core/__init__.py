"""The request's own data and rules, with no I/O: records, pricing, token usage, metrics."""
