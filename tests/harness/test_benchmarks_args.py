"""`python -m benchmarks NAME --option VALUE`: options and their values go to the benchmark named before."""

from benchmarks.__main__ import split_args


def test_options_and_their_values_follow_their_benchmark():
    names, flags = split_args(["history-noise", "--fresh", "--commits", "8", "gateway", "--redis"])
    assert names == ["history-noise", "gateway"]
    assert flags == {"history-noise": ["--fresh", "--commits", "8"], "gateway": ["--redis"]}
    assert split_args(["nope"]) == (["nope"], {})  # a name, unknown: main refuses it
    assert split_args(["spec", "validity"]) == (["spec", "validity"], {})
