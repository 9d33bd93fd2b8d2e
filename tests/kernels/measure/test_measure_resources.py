"""Occupancy with the SM90 limits against hand-computed values; Nsight Compute command and parsing."""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import pytest

from kernels.measure.resources import collect_ncu, ncu_command, occupancy, parse_ncu_csv, triton_resources


@pytest.mark.parametrize(
    ("regs", "smem", "warps", "blocks", "occ", "limiter"),
    [
        # 32 regs x 32 threads = 1024 per warp -> 64 warps fit -> 8 blocks of 8 warps: full occupancy.
        (32, 0, 8, 8, 1.0, "registers"),
        # 168 x 32 = 5376 = 21 x 256 -> 65536 // 5376 = 12 warps -> 3 blocks of 4 warps -> 12/64.
        (168, 0, 4, 3, 12 / 64, "registers"),
        # 255 x 32 = 8160 -> rounds up to 8192 -> 8 warps -> 1 block of 8 warps -> 8/64.
        (255, 0, 8, 1, 8 / 64, "registers"),
        # 100 KB + 1 KB reserved = 103424 B -> 233472 // 103424 = 2 blocks (registers would allow 8).
        (64, 100 * 1024, 4, 2, 8 / 64, "shared_memory"),
        # 200 B rounds to 256, + 1 KB -> 1280 B -> 182 blocks by smem; 16 regs, 1 warp -> block cap 32.
        (16, 200, 1, 32, 32 / 64, "blocks"),
        # 40 regs x 32 = 1280 -> 51 warps -> 12 blocks of 4; warps allow 16 -> 48/64.
        (40, 0, 4, 12, 48 / 64, "registers"),
        # 16 warps per block: warps allow 4 blocks; 64 regs -> 2048/warp -> 32 warps -> 2 blocks.
        (64, 0, 16, 2, 32 / 64, "registers"),
        # 24 regs, 16 warps: registers allow 85 warps -> 5 blocks; warps allow 4 -> 64/64.
        (24, 0, 16, 4, 1.0, "warps"),
    ],
)
def test_occupancy_hand_computed(
    regs: int, smem: int, warps: int, blocks: int, occ: float, limiter: str
) -> None:
    o = occupancy(regs, smem, warps)
    assert o["blocks_per_sm"] == blocks
    assert o["occupancy"] == pytest.approx(occ)
    assert o["limiter"] == limiter
    assert o["active_warps_per_sm"] == blocks * warps


def test_occupancy_rejects_unlaunchable_blocks() -> None:
    with pytest.raises(ValueError, match="registers per thread"):
        occupancy(256, 0, 4)
    with pytest.raises(ValueError, match="shared memory"):
        occupancy(32, 228 * 1024, 4)
    with pytest.raises(ValueError, match="threads per block"):
        occupancy(32, 0, 64)
    with pytest.raises(ValueError, match="registers per block"):
        occupancy(255, 0, 32)  # 8192 x 32 warps > 65536
    assert occupancy(32, 227 * 1024, 4)["blocks_per_sm"] == 1  # the largest block still fits once


def test_triton_resources_from_a_compiled_kernel_object() -> None:
    fake = SimpleNamespace(name="k", n_regs=168, n_spills=2, metadata=SimpleNamespace(shared=0, num_warps=4))
    r = triton_resources(fake)
    assert r["collected"] and r["n_spills"] == 2
    assert r["occupancy"]["blocks_per_sm"] == 3
    assert triton_resources(None)["collected"] is False


_HEADER = [
    "ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
    "Grid Size", "Device", "CC", "Section Name", "Metric Name", "Metric Unit", "Metric Value",
]  # fmt: skip
_LAUNCH = ["0", "123", "python", "h", "my_kernel", "1", "7", "(128, 1, 1)", "(132, 1, 1)", "0", "9.0", "cmd"]
_ROWS = [
    ["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum", "", "1,024"],
    ["lts__t_sector_hit_rate.pct", "%", "61.5"],
    ["sm__warps_active.avg.pct_of_peak_sustained_active", "%", "47.25"],
]
NCU_CSV = "\n".join(
    ["==PROF== Connected to process 123", '==PROF== Profiling "my_kernel": 100% - 1 pass']
    + [",".join(f'"{v}"' for v in row) for row in [_HEADER] + [_LAUNCH + r for r in _ROWS]]
)


def test_ncu_command_and_csv_parsing() -> None:
    cmd = ncu_command(["python", "run.py"], kernel_name="my_kernel", launch_skip=3)
    assert cmd[0] == "ncu" and "--csv" in cmd and cmd[-2:] == ["python", "run.py"]
    assert "regex:my_kernel" in cmd and "lts__t_sector_hit_rate.pct" in cmd[cmd.index("--metrics") + 1]
    parsed = parse_ncu_csv(NCU_CSV)
    assert parsed["collected"] is True
    assert parsed["l2_hit_rate_pct"] == pytest.approx(61.5)
    assert parsed["smem_bank_conflicts_ld"] == 1024
    assert parsed["achieved_occupancy_pct"] == pytest.approx(47.25)
    assert parsed["kernels"] == ["my_kernel"]
    assert parse_ncu_csv("==PROF== nothing")["collected"] is False


def test_ncu_not_collected_says_why() -> None:
    off = collect_ncu(["python", "x.py"], enabled=False)
    assert off == {"collected": False, "reason": "not requested (measure policy ncu: false)"}
    if shutil.which("ncu") is None:
        missing = collect_ncu(["python", "x.py"], enabled=True)
        assert missing["collected"] is False and "PATH" in missing["reason"]


def test_register_file_is_split_over_four_sub_partitions():
    # 80 regs x 32 threads = 2560 per warp: 16384 // 2560 = 6 warps per sub-partition, 24 per SM
    # (65536 // 2560 = 25 would overcount one-warp blocks)
    assert occupancy(80, 0, 1)["blocks_per_sm"] == 24
    assert occupancy(96, 0, 1)["blocks_per_sm"] == 20
