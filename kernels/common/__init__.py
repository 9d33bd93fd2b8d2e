"""What more than one kernel family shares, so that no family imports another.

lse    the log-sum-exp convention of every attention-like output: its base, and what an empty row
       (a query that sees no key) returns
triton_attention  the Triton building blocks of attention kernels: head-dim split, tile loads, the online
       softmax, the split-KV merge and split count (attention's kernels and the paged MLA decode)
mla    the FlashMLA-style paged MLA decode: paged KV cache, layouts, reference, Triton kernels, cost and
       correctness rule (the paged_mla family, and attention's decode_step mode)
"""
