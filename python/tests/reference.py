"""The tests' own attention in numpy, [B, N, H, d] as flash_attn_func: the textbook forward and backward, GQA
by repeating KV heads, causal bottom-right (query i sees key j iff j <= i + Nk - Nq), a row that sees no key
giving O = 0, LSE = -inf and zero gradients. In float64 it is the reference; in float32 the naive baseline of
the tolerance rule (core/metrics.h)."""
import numpy as np


def _probabilities(q, k, causal, scale):
    B, Nq, Hq, d = q.shape
    Nk, Hkv = k.shape[1], k.shape[2]
    kk = np.repeat(k, Hq // Hkv, axis=2)
    s = np.einsum("bihd,bjhd->bhij", q, kk) * q.dtype.type(scale)
    if causal:
        visible = np.arange(Nk)[None, :] <= np.arange(Nq)[:, None] + (Nk - Nq)
        s = np.where(visible, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    e = np.exp(s - m)
    l = e.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        lse = (np.log(l) + m)[..., 0]
    p = e / np.where(l == 0, 1, l)
    return p, lse


def forward(q, k, v, causal, scale):
    """(O [B, Nq, Hq, d], LSE [B, Hq, Nq]) in q's dtype."""
    p, lse = _probabilities(q, k, causal, scale)
    vv = np.repeat(v, q.shape[2] // v.shape[2], axis=2)
    return np.einsum("bhij,bjhd->bihd", p, vv), lse


def backward(dout, q, k, v, causal, scale):
    """(dQ, dK, dV), dK and dV summed over the query heads of each KV head."""
    B, Nq, Hq, d = q.shape
    Nk, Hkv = k.shape[1], k.shape[2]
    g = Hq // Hkv
    p, _ = _probabilities(q, k, causal, scale)
    kk, vv = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    o = np.einsum("bhij,bjhd->bihd", p, vv)
    dv = np.einsum("bhij,bihd->bjhd", p, dout)
    dp = np.einsum("bihd,bjhd->bhij", dout, vv)
    D = np.einsum("bihd,bihd->bhi", dout, o)
    ds = p * (dp - D[..., None])
    dq = np.einsum("bhij,bjhd->bihd", ds, kk) * q.dtype.type(scale)
    dk = np.einsum("bhij,bihd->bjhd", ds, q) * q.dtype.type(scale)
    return dq, dk.reshape(B, Nk, Hkv, g, d).sum(axis=3), dv.reshape(B, Nk, Hkv, g, d).sum(axis=3)


def random_inputs(shape_q, shape_kv, seed, dtype=np.float32, backward=False):
    """q, k, v (and dO) of N(0.5, 1) values rounded to float32 (so that fp64 and fp32 runs see the same
    numbers), then stored as `dtype`."""
    rng = np.random.default_rng(seed)
    draw = lambda shape: (rng.standard_normal(shape) + 0.5).astype(np.float32).astype(dtype)  # noqa: E731
    out = [draw(shape_q), draw(shape_kv), draw(shape_kv)]
    return out + [draw(shape_q)] if backward else out


def max_error(got, ref):
    """max |got - ref| over the finite entries of ref; infinities (an LSE of an unseen row) must match."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    inf = np.isinf(ref)
    assert np.array_equal(got[inf], ref[inf]), "infinities differ"
    assert not np.isnan(got).any(), "NaN in the output"
    return float(np.abs(got[~inf] - ref[~inf]).max(initial=0.0))


def tolerance(naive_error, ref):
    """The project's rule: at most 2x the naive computation's error in the same precision, + 1e-5 max(1, |ref|)."""
    ref = np.asarray(ref, np.float64)
    return 2 * naive_error + 1e-5 * max(1.0, float(np.abs(ref[np.isfinite(ref)]).max(initial=0.0)))
