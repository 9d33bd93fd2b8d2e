"""Test support, kept out of the product: fakes and fault injection that only tests/ and benchmarks/
import (an import-linter contract forbids cluster, gateway, jobs, kernels and schemakit to import it).

  testkit/gateway/   the fake upstream model provider (a real HTTP server on 127.0.0.1) and its answers
  testkit/kernels/   the recording CUDA fake and the fault-injecting backends the tests register
"""
