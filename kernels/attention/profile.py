"""The program Nsight Compute profiles for an attention trial (GPU only):

    python -m kernels.attention.profile '<shape json>' <dtype> '<config json>'

It builds the trial's inputs (seed 0) and launches the Triton backend twice: the first launch compiles,
the second is the one `ncu --launch-skip 1 --launch-count 1` measures (see case._resources).
"""

from __future__ import annotations

import json
import sys

import torch

from kernels.attention.case import DTYPES, prepare
from kernels.attention.shapes import Shape


def main(argv: list[str]) -> int:
    shape = Shape(**json.loads(argv[0]))
    dtype = DTYPES[argv[1]]
    config = json.loads(argv[2]) if len(argv) > 2 else {}
    prep = prepare(shape, "triton", config, dtype, 0, torch.device("cuda"))
    for _ in range(2):
        prep.run(None)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
