"""FlashAttention, step by step — python/examples/attention_numpy.py: the C interface from numpy (the CPU
stages): causal attention with grouped-query heads, its LSE and its gradients, checked against numpy itself.
Run from the repository root after a build: /usr/bin/python3 python/examples/attention_numpy.py
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # python/: the package

import numpy as np  # noqa: E402

import flash_step  # noqa: E402

rng = np.random.default_rng(0)
B, N, Hq, Hkv, d = 2, 256, 8, 2, 64  # layout [B, N, H, d], as flash_attn_func; 4 query heads per KV head
q = rng.standard_normal((B, N, Hq, d), dtype=np.float32)
k = rng.standard_normal((B, N, Hkv, d), dtype=np.float32)
v = rng.standard_normal((B, N, Hkv, d), dtype=np.float32)

o, lse = flash_step.attention(q, k, v, causal=True, return_lse=True)
stage, variant = flash_step.resolve(q, k, causal=True)
print(f"{flash_step.library_path()} (interface {flash_step.version()}): {stage} --variant {variant}")
print(f"O {o.shape} {o.dtype}, LSE {lse.shape} {lse.dtype}")

# The same attention in numpy, fp64: K and V repeated for the query heads, the causal mask, the softmax.
kk, vv = (np.repeat(x.astype(np.float64), Hq // Hkv, axis=2) for x in (k, v))
s = np.einsum("bihd,bjhd->bhij", q.astype(np.float64), kk) / np.sqrt(d)
s = np.where(np.tril(np.ones((N, N), bool)), s, -np.inf)
p = np.exp(s - s.max(axis=-1, keepdims=True))
o_ref = np.einsum("bhij,bjhd->bihd", p / p.sum(axis=-1, keepdims=True), vv)
print(f"max |O - numpy's| = {np.abs(o - o_ref).max():.2e}")

# The backward: dQ, dK, dV from dO (here the gradient of sum(O)), the forward's O and LSE.
dq, dk, dv = flash_step.attention_backward(np.ones_like(o), q, k, v, o, lse, causal=True)
print(f"dQ {dq.shape}, dK {dk.shape}, dV {dv.shape}; sum of dV = {dv.sum():.1f} (each query row's weights sum to 1)")
assert np.abs(o - o_ref).max() < 1e-4 and abs(dv.sum() - B * N * Hq * d) < 1e-2 * B * N * Hq * d
