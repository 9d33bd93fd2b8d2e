"""The environment a worker records (cluster.environment.collect): every component a verdict compares
(jobs.judge.environment), the kernel source digest among them."""

from __future__ import annotations

from cluster.environment import clocks_policy, collect, cpu_governor
from cluster.shipping import pack_kernels, source_digest
from jobs.judge.environment import COMPONENTS, fingerprint


def test_a_worker_records_every_component_a_verdict_compares_that_its_device_has():
    env = collect(threads=1, kernels_source=source_digest())
    assert {"cpu_governor", "kernels_source", "torch", "triton", "cpu_model", "host", "gpu_count"} <= set(env)
    fp = fingerprint(env)
    if env["device_kind"] == "cpu":  # a CPU has no GPU, driver, CUDA or GPU clocks policy
        assert env["torch_threads"] == 1 and env["gpu_count"] == 0
        missing = {"gpu", "driver", "cuda", "clocks"}
    else:  # torch's threads are a CPU timing's (nvidia-smi gives the driver and clocks where it runs)
        missing = {"threads"} | {c for c in ("driver", "clocks") if c not in fp}
    missing |= set() if env["cpu_governor"] else {"governor"}  # no cpufreq in a container
    assert set(fp) == set(COMPONENTS) - missing
    assert fp["kernels"] == env["kernels_source"]


def test_the_cluster_s_own_kernels_have_the_digest_their_shipped_copy_has():
    assert source_digest() == pack_kernels().digest


def test_the_governor_and_the_clocks_policy_in_words(tmp_path):
    gov = tmp_path / "scaling_governor"
    gov.write_text("performance\n")
    assert cpu_governor(str(gov)) == "performance" and cpu_governor(str(tmp_path / "none")) is None
    assert clocks_policy("1980", "1980", "700.00") == "default clocks, power limit 700.00 W"
    assert clocks_policy("1500", "1980", None) == "application clocks 1500 MHz"
    assert clocks_policy(None, None, None) == "clocks not reported"
