"""The static resource model on hand-computed configs, pruning reasons, the config spaces."""

from __future__ import annotations

import pytest

from kernels.base import TrialRequest
from kernels.fp8_gemm import case
from kernels.fp8_gemm.resources import deepgemm_choice, deepgemm_smem, deepgemm_space, estimate, prune
from kernels.fp8_gemm.tiles import TileConfig, nearest_m, triton_port_space
from kernels.measure import MeasurePolicy


def test_hand_computed_config_on_a_deepseek_shape():
    # 64x128x128, 4 warps, 3 stages on M=4096, N=7168, K=2048
    e = estimate(TileConfig(64, 128, 128, group_m=8, num_warps=4, num_stages=3), 4096, 7168, 2048)
    # per stage: A 64*128 + B 128*128 + A scales 64*4 + B scales 1*4 = 8192 + 16384 + 256 + 4
    assert e.smem_per_stage == 24836
    assert e.smem_stage_parts == {"a": 8192, "b": 16384, "a_scales": 256, "b_scales": 4}
    # a wgmma tile (block_m >= 64): 3 buffers of the A and B tiles; the scales live in registers
    assert e.smem_pipeline == 3 * (8192 + 16384) == 73728
    assert e.smem_epilogue == 64 * 128 * 2
    assert e.smem_total == 73728 and e.fits_smem and e.smem_limit == 227 * 1024
    # 64 x 56 = 3584 tiles; 27 full waves of 132 = 3564, so 28 waves with 20 tiles in the last
    assert e.waves["tiles"] == 3584 and e.waves["waves"] == 28
    assert e.waves["last_wave_tiles"] == 20 and e.waves["last_wave_util"] == pytest.approx(20 / 132)
    # accumulator 64*128 fp32 over 128 threads = 64 regs; estimate 3.5*64 + 16 (sm_90a compiles it to 238)
    assert e.threads == 128 and e.acc_regs_per_thread == 64 and e.regs_estimate == 240
    assert not e.spill_risk and not e.pruned
    # occupancy from the measurement core: smem 73728 + 1024 per block, 3 fit in 228 KB;
    # registers 240 x 32 = 7680 per warp, 65536 // 7680 = 8 warps = 2 blocks of 4
    assert e.occupancy["blocks_per_sm"] == 2
    assert e.occupancy["blocks_by"]["shared_memory"] == 3 and e.occupancy["blocks_by"]["registers"] == 2
    assert e.waves_at_occupancy == 14  # ceil(3584 / (132 * 2))


def test_small_m_shape_is_one_partial_wave():
    e = estimate(TileConfig(64, 128, 128), 64, 2112, 7168)
    assert e.waves["tiles"] == 17 and e.waves["waves"] == 1
    assert e.waves["last_wave_util"] == pytest.approx(17 / 132)


def test_triton_epilogue_overlaps_the_pipeline():
    # 1 stage of 128x256: pipeline 16384 + 32768 = 49152 < epilogue 128*256*2 = 65536
    e = estimate(TileConfig(128, 256, 128, num_warps=8, num_stages=1), 128, 256, 128)
    assert e.smem_pipeline == 49152 and e.smem_epilogue == 65536 and e.smem_total == 65536


def test_shared_memory_pruning_reason():
    e = estimate(TileConfig(128, 256, 128, num_warps=8, num_stages=5), 4096, 7168, 2048)
    assert e.pruned and e.smem_total == 5 * 49152 == 245760
    assert e.prune_message().startswith(
        "pruned: shared memory 245760 B (5 stages of 49152 B tiles) > 232448 B (227 KB per block)"
    )
    assert e.occupancy is None


def test_register_pruning_reason_and_spill_risk():
    big = estimate(TileConfig(256, 256, 128, num_warps=4, num_stages=1), 4096, 4096, 128)
    assert big.acc_regs_per_thread == 512 and big.pruned
    assert any("estimated 1808 registers per thread" in r and "spill" in r for r in big.reasons)
    # 128x128 over 4 warps: one accumulator (128 regs) fits, the promotion's second does not: sm_90a
    # compiles it to 255 registers and 296 B of spills, so the model prunes it
    risky = estimate(TileConfig(128, 128, 128, num_warps=4, num_stages=3), 4096, 4096, 1024)
    assert risky.pruned and risky.spill_risk and risky.regs_estimate == 464
    fine = estimate(TileConfig(128, 128, 128, num_warps=8, num_stages=3), 4096, 4096, 1024)
    assert not fine.pruned and fine.regs_estimate == 240  # compiled: 226, no spills


def test_prune_splits_a_space_and_keeps_every_reason():
    space = triton_port_space()
    assert len(space) == 5 * 4 * 1 * 4 * 2 * 4
    ok, pruned = prune(space, 4096, 7168, 2048)
    assert len(ok) + len(pruned) == len(space) and ok and pruned
    assert all(p.reasons for p in pruned) and not any(o.reasons for o in ok)
    assert all(o.smem_total <= 227 * 1024 for o in ok)


def test_deepgemm_smem_and_stage_count():
    # 128x128 at K=7168: per stage 128*128*2 + 128*4 = 33280; D 32768; B scales 56*4; barriers 16/stage
    five = deepgemm_smem(128, 128, 128, 5, 7168)
    assert five == {
        "per_stage": 33280,
        "d": 32768,
        "b_scales": 224,
        "barriers": 80,
        "total": 5 * 33280 + 32768 + 224 + 80,
        "fits": True,
    }
    assert not deepgemm_smem(128, 128, 128, 6, 7168)["fits"]  # 232768 > 232448
    assert deepgemm_smem(128, 112, 128, 3, 7168)["b_scales"] == 2 * 224  # 112 straddles scale blocks
    by_tile = {(c.block_m, c.block_n): c for c in deepgemm_space(4096, 7168, 7168)}
    assert by_tile[(128, 128)].num_stages == 5
    assert all(c.num_stages >= 3 and c.block_k == 128 for c in by_tile.values())


def test_deepgemm_choice_fewest_waves_then_last_wave():
    # M=64, N=4096: block_n 32 gives 128 tiles, one wave 97% used; nothing fills 129..132 SMs; the
    # larger block_m breaks the tie between 64 and 128 (both one tile row)
    c = deepgemm_choice(64, 4096, 7168)
    assert (c.block_m, c.block_n, c.waves, c.tiles) == (128, 32, 1, 128)
    assert c.last_wave_util == pytest.approx(128 / 132)


def test_triton_port_keys_and_nearest_m():
    cfg = TileConfig(64, 128, 128, group_m=32, num_warps=4, num_stages=3)
    port = cfg.to_triton_port()
    assert port == {
        "BLOCK_SIZE_M": 64,
        "BLOCK_SIZE_N": 128,
        "BLOCK_SIZE_K": 128,
        "GROUP_SIZE_M": 32,
        "num_warps": 4,
        "num_stages": 3,
    }
    assert TileConfig.from_triton_port(port) == cfg
    assert nearest_m(["64", "128", "4096"], 100) == 128
    assert nearest_m([64, 128, 4096], 96) == 64  # tie -> the smaller
    assert nearest_m([64, 128, 4096], 100000) == 4096


def test_case_stores_a_pruned_config_with_the_model_numbers():
    config = {"block_m": 128, "block_n": 256, "block_k": 128, "group_m": 8, "num_warps": 8, "num_stages": 5}
    req = TrialRequest(
        "fp8_gemm", "triton", {"m": 64, "n": 2112, "k": 7168}, config, "float8_e4m3fn", MeasurePolicy()
    )
    o = case.FAMILY.run(req)  # never launches: the model rules it out first
    assert o.status == "pruned" and o.error.startswith("pruned: shared memory 245760 B")
    assert o.resources["model"]["pruned"] and o.resources["model"]["smem_total"] == 245760
    assert o.resources["model"]["waves"]["waves"] == 1 and not o.samples_ns
    assert o.metrics["flops"] == 2 * 64 * 2112 * 7168
