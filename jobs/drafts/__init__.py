"""Drafts: a job's anomalies compressed (compress.py) and sent to the gateway as a client (client.py)."""
