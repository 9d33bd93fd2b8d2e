"""Compiled evidence for the paged MLA decode (kernels.compiled): the split kernel's default config
compiles for sm_90a without spills at the shipped spec's shapes (jobs/specs/paged_mla.yaml: h_q 16/64/128,
s_q 1/2, pages 16-128, bf16 and both fp8 caches), at <= 240 registers with triton_decode's own launch
defaults (num_stages, maxnreg), and uses wgmma where the module docstring says the shape
allows it (a plain cache with >= 64 query rows), and a trial whose config spills is `pruned` with the
compiler's reason when compiling is asked for (TRITON_INTERPRET=0), without running. The compiles run in
a subprocess (the test session interprets Triton), as many at once as there are cores.
"""

from __future__ import annotations

import pytest

SCRIPT = """
import json
from kernels.base import TrialRequest
from kernels.compiled import evidence_of_each
from kernels.measure.policy import MeasurePolicy
from kernels.paged_mla.case import FAMILY

from jobs.spec.sweep import load_spec

# every distinct kernel shape of the shipped spec's triton trials, plus each cache at every page size
points = {(t.shape["kv_dtype"], t.shape["h_q"], t.shape["s_q"], t.shape["page_size"])
          for t in load_spec("jobs/specs/paged_mla.yaml").trials() if t.backend == "triton"}
points |= {(kv, 128, s_q, page) for kv in ("bf16", "fp8", "fp8_flashmla") for s_q in (1, 2)
           for page in (16, 32, 64, 128)}
# sm_100a (B200): the shipped spec's triton shapes plus a bf16 cache at every page size, s_q 1 and 2
sm100_points = {p for p in points if p[0] != "bf16" or p[1] != 128 or p[3] == 64}
sm100_points |= {("bf16", 128, s_q, page) for s_q in (1, 2) for page in (16, 32, 64, 128)}
# "own": sm_90a with triton_decode's own launch defaults (num_stages None: default_num_stages and
# default_maxnreg of the tiles), where the case's config fixes num_stages at 2
todo = [("sm_90a", p) for p in sorted(points)] + [("sm_100a", p) for p in sorted(sm100_points)]
todo += [("own", p) for p in sorted(points)]
shapes = [{"batch": 128, "seqlen": 16384, "dist": "fixed", "h_q": h_q, "s_q": s_q, "page_size": page,
           "kv_dtype": kv} for _target, (kv, h_q, s_q, page) in todo]
found = evidence_of_each([(FAMILY.meta_launch(shape, {"num_stages": None} if t == "own" else {}, "bfloat16",
                                              "triton"), "sm_90a" if t == "own" else t)
                          for (t, _p), shape in zip(todo, shapes)])
failed = [f for f in found if isinstance(f, str)]
assert not failed, failed[:3]
rows = [{"shape": s, "evidence": f} for (t, _p), s, f in zip(todo, shapes, found) if t == "sm_90a"]
sm100 = [{"shape": s, "evidence": f} for (t, _p), s, f in zip(todo, shapes, found) if t == "sm_100a"]
own = [{"shape": s, "evidence": f} for (t, _p), s, f in zip(todo, shapes, found) if t == "own"]
shape = {"batch": 4, "seqlen": 4096, "dist": "fixed", "h_q": 128, "s_q": 2, "page_size": 128,
         "kv_dtype": "fp8"}
policy = MeasurePolicy(warmup_ms=0, min_samples=1, max_samples=1, max_time_s=0.1, min_time_s=0, seeds=1)
# execute, not run: run() skips the triton backend on a CPU without the interpreter before execute
# could compile anything; on a GPU host run() reaches execute and the same pruning
o = FAMILY.execute(TrialRequest("paged_mla", "triton", shape, {"block_n": 64}, "bfloat16", policy))
print(json.dumps({"rows": rows, "sm100": sm100, "own": own,
                  "pruned": {"status": str(o.status), "error": o.error, "resources": o.resources,
                             "metrics": o.metrics}}))
"""


@pytest.fixture(scope="module")
def compiled(run_compiled):
    return run_compiled(SCRIPT, interpret="0")  # asked for: compile, even without a GPU


def _split(compiled, target="sm_90a", **where):
    """target "own": sm_90a at triton_decode's own launch defaults (see SCRIPT)."""
    return [
        (r["shape"], e)
        for r in compiled[{"sm_90a": "rows", "sm_100a": "sm100", "own": "own"}[target]]
        for e in r["evidence"]
        if e["kernel"] == "_split_kernel" and all(r["shape"][k] == v for k, v in where.items())
    ]


@pytest.mark.slow
def test_default_configs_compile_without_spills_at_the_shipped_shapes(compiled):
    split = _split(compiled)
    assert {s["kv_dtype"] for s, _ in split} == {"bf16", "fp8", "fp8_flashmla"}
    assert {(s["h_q"], s["s_q"]) for s, _ in split} >= {(16, 1), (16, 2), (64, 2), (128, 1), (128, 2)}
    spilling = [
        (s["kv_dtype"], s["h_q"], s["s_q"], s["page_size"], e["regs"], e["stack"])
        for s, e in split
        if e["spills"]
    ]
    assert not spilling, spilling  # fp8_flashmla spilled 40-176 B at its old default (32-row tiles)
    assert all(e["shared"] <= e["smem_limit"] for _, e in split)
    # 2 stages, or 3 where the case takes triton_decode's default_num_stages (the 64 x 64 bf16 tile)
    assert all(e["num_warps"] == 8 and e["num_stages"] in (2, 3) for _, e in split)
    # the per-token fp8 cache's 32-row tiles run under default_maxnreg's cap (254-255 registers without)
    assert all(e["regs"] <= 208 for s, e in split if s["kv_dtype"] == "fp8")


@pytest.mark.slow
def test_default_configs_take_at_most_240_registers_on_sm90(compiled):
    # triton_decode's own launch defaults (default_tiles, default_num_stages, default_maxnreg): the 64 x 64
    # bf16 wgmma tile at 3 stages under a 240-register cap (255 uncapped at 2 stages; capped at 2 stages it
    # spills 24 B), the 64 x 16 / 64 x 32 tiles at 2 stages under the same cap (252 uncapped), the
    # per-token fp8 cache's 32-row tiles under a 208 cap (216-240 spill 8 B at s_q 2)
    own = _split(compiled, "own")
    covered = {(s["kv_dtype"], s["h_q"], s["s_q"], s["page_size"]) for s, _ in own}
    assert covered >= {(kv, 128, s_q, page) for kv in ("bf16", "fp8", "fp8_flashmla") for s_q in (1, 2)
                       for page in (16, 32, 64, 128)}  # fmt: skip
    assert covered >= {("bf16", 16, 1, 64), ("bf16", 64, 2, 64), ("fp8", 16, 2, 64)}
    over = [
        (s["kv_dtype"], s["h_q"], s["s_q"], s["page_size"], e["regs"], e["stack"])
        for s, e in own
        if e["regs"] > 240 or e["spills"]
    ]
    assert not over, over
    assert all(e["shared"] <= e["smem_limit"] for _, e in own)
    wide = [(s, e) for s, e in own if s["kv_dtype"] == "bf16" and s["h_q"] * s["s_q"] >= 64]
    assert all(e["wgmma"] and e["num_stages"] == (3 if s["page_size"] >= 64 else 2) for s, e in wide)
    assert all(e["num_warps"] == 8 and e["num_stages"] == 2 for s, e in own if (s, e) not in wide)


@pytest.mark.slow
def test_default_config_uses_wgmma_where_the_shape_allows_it(compiled):
    # a plain (bf16) cache with >= 64 query rows: 64-row tiles on the SM90 warpgroup MMAs (mma.sync before)
    wide = _split(compiled, kv_dtype="bf16")
    wide = [(s, e) for s, e in wide if s["h_q"] * s["s_q"] >= 64]
    assert {(s["h_q"], s["s_q"]) for s, _ in wide} >= {(64, 2), (128, 1), (128, 2)}
    assert all(e["wgmma"] and not e["mma_sync"] for _, e in wide), [s for s, e in wide if not e["wgmma"]]
    # documented exceptions (kernels/common/mla/decode_kernels.py, "Default tiles on sm_90a"): fewer than
    # 64 rows (wgmma's M is 64 per warpgroup) and the fp8 caches (the dequantised tile passes through
    # registers and spills beside a 64-row accumulator); they run on mma.sync
    narrow = [(s, e) for s, e in _split(compiled) if s["h_q"] * s["s_q"] < 64 or s["kv_dtype"] != "bf16"]
    assert narrow and all(e["mma_sync"] and not e["wgmma"] for _, e in narrow)


@pytest.mark.slow
def test_the_shipped_spec_runs_flashmlas_fp8_layout_at_a_clean_default(compiled):
    from jobs.spec.sweep import load_spec

    shapes = [t.shape for t in load_spec("jobs/specs/paged_mla.yaml").trials() if t.backend == "triton"]
    flashmla = {(s["h_q"], s["s_q"]) for s in shapes if s["kv_dtype"] == "fp8_flashmla"}
    assert flashmla >= {(128, 1), (128, 2)}
    split = _split(compiled, kv_dtype="fp8_flashmla")
    assert {(s["s_q"], s["page_size"]) for s, _ in split} >= {(1, 16), (1, 32), (1, 64), (1, 128), (2, 64)}
    assert not [e for _, e in split if e["spills"]]


@pytest.mark.slow
def test_a_spilling_config_is_pruned_with_the_compilers_reason(compiled):
    # fp8 cache, page 128, 64-token steps: spills on sm_90a (tens of bytes at 255 registers)
    o = compiled["pruned"]
    assert o["status"] == "pruned", o
    assert o["error"].startswith("pruned: ") and "_split_kernel" in o["error"] and "spills" in o["error"]
    check = o["resources"]["compiled_check"]
    assert check["checked"] and check["target"] == "sm_90a" and check["problems"]
    assert o["metrics"]["bytes"] > 0 and "time_ns" not in o["metrics"]  # nothing ran


@pytest.mark.slow
def test_sm100_defaults_fit_shared_memory_without_spills_at_the_shipped_shapes(compiled):
    split = _split(compiled, "sm_100a")
    assert split and all(e["target"] == "sm_100a" for _, e in split)
    covered = {(s["kv_dtype"], s["h_q"], s["s_q"], s["page_size"]) for s, _ in split}
    assert covered >= {
        ("bf16", 16, 1, 64),
        ("bf16", 64, 2, 64),
        ("fp8", 16, 2, 64),
        ("fp8_flashmla", 128, 2, 64),
    }
    assert covered >= {(kv, 128, s_q, 64) for kv in ("bf16", "fp8", "fp8_flashmla") for s_q in (1, 2)}
    assert covered >= {("bf16", 128, s_q, page) for s_q in (1, 2) for page in (16, 32, 64, 128)}
    # the sm_90a tiles needed 352,816 B here for a bf16 cache at >= 64 rows and page >= 64 (tcgen05 keeps
    # both operands in shared memory), and spilled with both fp8 caches (8-64 B of stack at 255 registers)
    over = [(s, e["shared"]) for s, e in split if e["shared"] > e["smem_limit"]]
    assert not over, over
    spilling = [(s, e["regs"], e["stack"]) for s, e in split if e["spills"]]
    assert not spilling, spilling
    assert all(e["num_warps"] == 8 and e["num_stages"] == 2 for _, e in split)
    # 64-row bf16 tiles still reach the SM100 tensor cores
    wide = [e for s, e in split if s["kv_dtype"] == "bf16" and s["h_q"] * s["s_q"] >= 64]
    assert wide and all(e["tcgen05"] for e in wide)


def test_default_tiles_per_target():
    from kernels.common.mla.decode_kernels import default_block_m, default_block_n

    # sm_90a is the default target and keeps its tiles
    assert default_block_n(64, False, "plain", "sm_90a") == default_block_n(64, False) == 64
    assert default_block_m(128, "fp8", "sm_90a") == default_block_m(128, "fp8") == 32
    # sm_100a: bf16 steps of at most 32 tokens (shared memory), 16-row tiles for the per-token fp8 cache
    assert [default_block_n(p, False, "plain", "sm_100a") for p in (16, 32, 64, 128)] == [16, 32, 32, 32]
    assert [default_block_m(r, "plain", "sm_100a") for r in (16, 32, 64, 256)] == [16, 32, 64, 64]
    assert [default_block_m(r, "fp8", "sm_100a") for r in (16, 32, 256)] == [16, 16, 16]
    assert [default_block_n(p, True, "fp8", "sm_100a") for p in (16, 64, 128)] == [16, 32, 32]
    assert default_block_m(256, "fp8_flashmla", "sm_100a") == 16
    assert default_block_n(64, True, "fp8_flashmla", "sm_100a") == 16
    with pytest.raises(ValueError, match="unknown target 'sm_80'"):
        default_block_m(128, "plain", "sm_80")
    with pytest.raises(ValueError, match="unknown target 'sm_80'"):
        default_block_n(64, False, "plain", "sm_80")


def test_default_launch_options_per_tile_and_target():
    from kernels.common.mla.decode_kernels import default_maxnreg, default_num_stages

    # 3 stages only for the 64 x 64 bf16 wgmma tile on sm_90a; a 240 cap on every 64-row bf16 tile there
    assert [default_num_stages(64, bn, "plain", "sm_90a") for bn in (16, 32, 64)] == [2, 2, 3]
    assert default_num_stages(64, 64, "plain", "sm_100a") == default_num_stages(32, 32, "fp8", "sm_90a") == 2
    assert default_maxnreg(64, 64, "plain", "sm_90a", 3) == 240
    assert default_maxnreg(64, 64, "plain", "sm_90a", 2) is None  # capped at 2 stages it spills
    assert [default_maxnreg(64, bn, "plain", "sm_90a", 2) for bn in (16, 32)] == [240, 240]
    assert default_maxnreg(16, 16, "plain", "sm_90a", 2) is None  # mma.sync rows: never above 240
    assert [default_maxnreg(32, bn, "fp8", "sm_90a", 2) for bn in (16, 32, 64)] == [208, 208, None]
    assert default_maxnreg(32, 32, "fp8", "sm_100a", 2) is None
    assert default_maxnreg(32, 32, "fp8", "sm_90a", 2, num_warps=4) is None  # measured at 8 warps only
    assert default_maxnreg(16, 16, "fp8_flashmla", "sm_90a", 2) is None
    with pytest.raises(ValueError, match="unknown target 'sm_80'"):
        default_num_stages(64, 64, "plain", "sm_80")
