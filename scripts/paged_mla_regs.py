"""Registers, spills and shared memory of the paged MLA split kernel for tile / launch variants, compiled
offline (kernels.compiled: no GPU needed), at shapes of jobs/specs/paged_mla.yaml.

    .venv/bin/python scripts/paged_mla_regs.py                  # the variants of issue 30's register study
    .venv/bin/python scripts/paged_mla_regs.py --json out.json  # the rows as JSON as well

Each variant is a trial shape plus a triton config (block_m, block_n, num_warps, num_stages, as a spec would
give them) and optionally `maxnreg` (Triton's NVIDIA launch option: the .maxnreg cap ptxas allocates
under; 0 for none, unset for the launch's own, kernels.common.mla.decode_kernels.default_maxnreg). The
launch is captured from the family's own meta_launch (kernels.paged_mla.case), so the tiles, split plan
and specialisation are the trial's; a maxnreg given replaces the captured one before compiling.
Besides kernels.compiled's evidence, a row gives the static count of MMA instructions in the PTX per
cached token of a step (`mma/token`: the kernel's wgmma / mma.sync / tcgen05.mma, pipeline prologue and
epilogue included, over BLOCK_N), a proxy for the tensor-core instructions a row block issues per
token, and `sass`, the kernel's static SASS instruction count (a cap that makes ptxas rematerialise
values shows there).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
from typing import Any

os.environ["TRITON_INTERPRET"] = "0"  # compile, even without a GPU (before triton's first import)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

SHAPE = {"batch": 128, "seqlen": 16384, "dist": "fixed", "h_q": 128, "s_q": 1, "page_size": 64}


def variant(target: str, kv: str, *, h_q: int = 128, s_q: int = 1, page: int = 64, maxnreg: int | None = None,
            **config: Any) -> dict[str, Any]:  # fmt: skip
    shape = {**SHAPE, "h_q": h_q, "s_q": s_q, "page_size": page, "kv_dtype": kv}
    return {"target": target, "shape": shape, "config": config, "maxnreg": maxnreg}


def study() -> list[dict[str, Any]]:
    """The variants tried for the defaults above ~240 registers on sm_90a (bf16 at >= 64 rows, fp8)."""
    out = []
    t = "sm_90a"
    for s_q in (1, 2):  # bf16, 64-row wgmma tiles; the default first
        for page in (16, 32, 64, 128):  # as the case launches them (2 stages), then triton_decode's own
            out += [variant(t, "bf16", s_q=s_q, page=page, num_stages=st) for st in (2, None)]
        out += [variant(t, "bf16", s_q=s_q, maxnreg=r) for r in (240, 232)]
        out += [variant(t, "bf16", s_q=s_q, block_n=bn) for bn in (16, 32)]
        out += [variant(t, "bf16", s_q=s_q, num_stages=st) for st in (1, 3)]
        out += [variant(t, "bf16", s_q=s_q, block_n=32, num_stages=st) for st in (1, 3)]
        out.append(variant(t, "bf16", s_q=s_q, block_n=32, maxnreg=240))
        out.append(variant(t, "bf16", s_q=s_q, num_warps=4))
        out.append(variant(t, "bf16", s_q=s_q, num_warps=4, block_n=32))
        out += [variant(t, "bf16", s_q=s_q, num_stages=st, maxnreg=240) for st in (1, 3, 4)]
        out += [variant(t, "bf16", s_q=s_q, num_stages=3, maxnreg=r) for r in (232, 224)]
        out += [variant(t, "bf16", s_q=s_q, page=128, num_stages=st, maxnreg=240) for st in (2, 3)]
        out += [variant(t, "bf16", s_q=s_q, num_stages=4)]
        out.append(variant(t, "bf16", s_q=s_q, num_warps=16))
    for s_q in (1, 2):  # fp8 with per-token scales: uncapped, then the default (32 x 32 at page 64)
        for page in (16, 32, 64, 128):
            out += [variant(t, "fp8", s_q=s_q, page=page, maxnreg=r) for r in (0, None)]
        out += [variant(t, "fp8", s_q=s_q, maxnreg=r) for r in (240, 232, 224, 216, 208, 200)]
        out += [variant(t, "fp8", s_q=s_q, page=p, maxnreg=r) for p in (16, 32, 128) for r in (240, 208)]
        out += [variant(t, "fp8", s_q=s_q, num_stages=st, maxnreg=r) for st in (1, 3) for r in (240, 232)]
        out += [variant(t, "fp8", s_q=s_q, block_n=16, maxnreg=0)]
        out += [variant(t, "fp8", s_q=s_q, block_m=16, block_n=bn) for bn in (16, 32, 64)]
        out += [variant(t, "fp8", s_q=s_q, page=page, block_m=16) for page in (16, 32, 128)]
        out += [variant(t, "fp8", s_q=s_q, num_stages=st, maxnreg=0) for st in (1, 3)]
        out += [variant(t, "fp8", s_q=s_q, num_warps=4, maxnreg=0)]
        out += [variant(t, "fp8", s_q=s_q, block_m=16, num_warps=4)]
    out.append(variant(t, "fp8", h_q=16, s_q=2, maxnreg=0))  # 32 rows: the spec's h_q 16 fp8 include
    out += [variant(t, "fp8", h_q=16, s_q=2, maxnreg=r) for r in (240, 208)]
    out.append(variant(t, "bf16", h_q=64, s_q=2, num_stages=3, maxnreg=240))
    out.append(variant(t, "fp8", h_q=16, s_q=2, block_m=16))
    out += [variant(t, "fp8_flashmla", s_q=s_q) for s_q in (1, 2)]
    out += [variant(t, "bf16", h_q=16, s_q=s_q) for s_q in (1, 2)]
    t = "sm_100a"  # the B200 defaults (none above 240 registers there), and the sm_90a fp8 tile there
    out += [variant(t, kv, s_q=s_q) for kv in ("bf16", "fp8", "fp8_flashmla") for s_q in (1, 2)]
    out += [variant(t, "fp8", s_q=s_q, page=page) for s_q in (1, 2) for page in (16, 128)]
    out.append(variant(t, "fp8", h_q=16, s_q=2))
    out += [variant(t, "fp8", s_q=s_q, block_m=32) for s_q in (1, 2)]
    return out


def _mma_count(ptx: str) -> int:
    return sum(ptx.count(op) for op in ("wgmma.mma_async.", "mma.sync.", "tcgen05.mma."))


def _sass_count(cubin: bytes) -> int:
    """Instructions in the cubin's SASS (cuobjdump -sass; Triton's own listing, asm["sass"], stops at the
    4,096th instruction)."""
    from kernels.compiled import _cuobjdump

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        dump = subprocess.run([_cuobjdump(), "-sass", f.name], capture_output=True, text=True, check=True)
    text = dump.stdout
    return len(re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s+\S", text, flags=re.MULTILINE))


def measure(v: dict[str, Any]) -> dict[str, Any]:
    from kernels.compiled import compile_launch, launches_of
    from kernels.paged_mla.case import FAMILY

    try:
        call = FAMILY.meta_launch(v["shape"], v["config"], "bfloat16", "triton")
        (launch,) = [x for x in launches_of(call, v["target"]) if x.name == "_split_kernel"]
        if v["maxnreg"] is not None:  # 0: no cap; None: the launch's own (decode_kernels.default_maxnreg)
            opts = {**dict(launch.options), "maxnreg": v["maxnreg"] or None}
            launch = dataclasses.replace(launch, options=tuple(opts.items()))
        ev, compiled = compile_launch(launch)
    except Exception as exc:  # noqa: BLE001 - reported in its row
        return {**v, "error": f"{type(exc).__name__}: {exc}"[:300]}
    consts = {launch.fn.arg_names[p[0]]: val for p, val in launch.constexprs if len(p) == 1}
    mma = _mma_count(compiled.asm["ptx"])
    sass = _sass_count(compiled.asm["cubin"])
    return {
        **v,
        "block_m": consts["BLOCK_M"],
        "block_n": consts["BLOCK_N"],
        "maxnreg": launch.option("maxnreg"),
        "evidence": ev.to_dict(),
        "mma": mma,
        "mma_per_token": mma / consts["BLOCK_N"],
        "sass": sass,
    }


def row(r: dict[str, Any]) -> str:
    s = r["shape"]
    head = f"{r['target']:7} {s['kv_dtype']:12} h{s['h_q']:<3} s{s['s_q']} p{s['page_size']:<3}"
    if "error" in r:
        return f"{head} {r['config']} maxnreg={r['maxnreg']}: {r['error']}"
    e = r["evidence"]
    mma = "wgmma" if e["wgmma"] else "tcgen05" if e["tcgen05"] else "mma.sync" if e["mma_sync"] else "-"
    return (
        f"{head} {r['block_m']:>3}x{r['block_n']:<3} w{e['num_warps']} st{e['num_stages']} "
        f"maxnreg {str(r['maxnreg'] or '-'):>3}: {e['regs']:3} regs {e['stack']:4} B stack "
        f"{e['shared']:7,} B smem  {mma:8} mma/token {r['mma_per_token']:.2f} sass {r['sass']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--processes", type=int, default=os.cpu_count())
    args = parser.parse_args()
    todo = study()
    with multiprocessing.get_context("fork").Pool(max(1, min(args.processes or 1, len(todo)))) as pool:
        rows = []
        for r in pool.imap(measure, todo):
            print(row(r), flush=True)
            rows.append(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
