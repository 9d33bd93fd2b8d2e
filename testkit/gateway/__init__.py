"""The gateway's test support: the fake upstream model provider the gateway tests and benchmarks run against.

fake_upstream.py   the server (a real HTTP server on 127.0.0.1): requests counted and recorded, faults
                   queued or drawn, stats
fake_apis.py       its answers: chat, Responses, Messages, whole and streamed, tool calls included
agents.py          the model's side of an agent task: read a file through the client's tool
"""
