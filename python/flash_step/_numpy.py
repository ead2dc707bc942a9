"""flash_step._numpy: attention on numpy arrays, [B, N, H, d], fp32 or fp64, any strides: the CPU stages."""
from . import _lib


def _np():
    import numpy  # imported when used: the torch path does not need it
    return numpy


def _dtype_code(np, a, name):
    if a.dtype == np.float32:
        return _lib.FP32
    if a.dtype == np.float64:
        return _lib.FP64
    raise TypeError(f"{name} is {a.dtype}: numpy arrays go to the CPU stages, which take float32 or float64 "
                    f"(bf16 and fp16 are for CUDA tensors, through torch)")


def _view(np, a, name):
    """The fs_tensor of array `a`: its strides in elements (numpy's are in bytes)."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} is a {type(a).__name__}, not a numpy array (or a torch tensor)")
    strides = []
    for s in a.strides:
        if s % a.itemsize:
            raise ValueError(f"{name} has a stride of {s} bytes, not a whole number of {a.itemsize}-byte elements")
        strides.append(s // a.itemsize)
    return _lib.tensor(a.ctypes.data, a.shape, strides)


def _inputs(np, arrays, names):
    for a, n in zip(arrays, names):
        if not isinstance(a, np.ndarray):
            raise TypeError(f"{n} is a {type(a).__name__}, not a numpy array (or a torch tensor)")
        if a.ndim != 4:
            raise ValueError(f"{n} has shape {a.shape}: attention takes [B, N, H, d]")
    code = _dtype_code(np, arrays[0], names[0])
    for a, n in zip(arrays, names):
        if a.dtype != arrays[0].dtype:
            raise TypeError(f"{n} is {a.dtype}, {names[0]} {arrays[0].dtype}: give them one dtype")
    views = [_view(np, a, n) for a, n in zip(arrays, names)]
    return code, views


def attention(q, k, v, causal=False, scale=None, stage=None, variant=None, return_lse=False):
    np = _np()
    code, (qv, kv, vv) = _inputs(np, [q, k, v], ["q", "k", "v"])
    B, Nq, Hq, d = q.shape
    o = np.empty((B, Nq, Hq, d), q.dtype)
    lse = np.empty((B, Hq, Nq), np.float64 if code == _lib.FP64 else np.float32)
    opts = _lib.options(code, _lib.HOST, causal, scale, stage, variant)
    _lib.forward(opts, qv, kv, vv, _view(np, o, "o"), _view(np, lse, "lse"))
    return (o, lse) if return_lse else o


def attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=None, block_table=None, causal=True, scale=None,
                           stage=None, variant=None, return_lse=False):
    """Through the C interface like the rest: step 1 reads the cache (gathered from its pages), fp32 or fp64."""
    np = _np()
    code, (qv, kv, vv) = _inputs(np, [q, k_cache, v_cache], ["q", "k_cache", "v_cache"])
    B, Nq, Hq, d = q.shape
    o = np.empty((B, Nq, Hq, d), q.dtype)
    lse = np.empty((B, Hq, Nq), np.float64 if code == _lib.FP64 else np.float32)
    lens = None if cache_seqlens is None else np.ascontiguousarray(cache_seqlens, dtype=np.int32)
    table = None if block_table is None else np.ascontiguousarray(block_table, dtype=np.int32)
    opts = _lib.options(code, _lib.HOST, causal, scale, stage, variant)
    _lib.forward_kvcache(opts, qv, kv, vv, None if lens is None else lens.ctypes.data,
                         None if table is None else table.ctypes.data, 0 if table is None else table.shape[1],
                         _view(np, o, "o"), _view(np, lse, "lse"))
    return (o, lse) if return_lse else o


def _packed(np, arrays, names):
    """[total, H, d] arrays as [1, total, H, d] views (a batch of one: the sequences end to end)."""
    for a, n in zip(arrays, names):
        if not isinstance(a, np.ndarray) or a.ndim != 3:
            raise ValueError(f"{n} must be a [total, H, d] numpy array (the sequences end to end), got "
                             f"{getattr(a, 'shape', type(a).__name__)}")
    return _inputs(np, [a[None] for a in arrays], names)


def _offsets(np, cu, name):
    a = np.ascontiguousarray(cu, dtype=np.int32)
    if a.ndim != 1 or a.size < 2:
        raise ValueError(f"{name} must list batch + 1 offsets, from 0 (got shape {a.shape})")
    return a


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False, scale=None, stage=None, variant=None,
                     return_lse=False):
    np = _np()
    code, (qv, kv, vv) = _packed(np, [q, k, v], ["q", "k", "v"])
    cq, ck = _offsets(np, cu_seqlens_q, "cu_seqlens_q"), _offsets(np, cu_seqlens_k, "cu_seqlens_k")
    total, Hq, d = q.shape
    o = np.empty((total, Hq, d), q.dtype)
    lse = np.empty((1, Hq, total), np.float64 if code == _lib.FP64 else np.float32)
    opts = _lib.options(code, _lib.HOST, causal, scale, stage, variant)
    _lib.forward_varlen(opts, qv, kv, vv, cq.ctypes.data, ck.ctypes.data, cq.size - 1, _view(np, o[None], "o"),
                        _view(np, lse, "lse"))
    return (o, lse[0]) if return_lse else o


def attention_varlen_backward(dout, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, causal=False, scale=None,
                              stage=None, variant=None):
    np = _np()
    code, (qv, kv, vv, ov, dov) = _packed(np, [q, k, v, o, dout], ["q", "k", "v", "o", "dout"])
    cq, ck = _offsets(np, cu_seqlens_q, "cu_seqlens_q"), _offsets(np, cu_seqlens_k, "cu_seqlens_k")
    dq, dk, dv = np.empty(q.shape, q.dtype), np.empty(k.shape, k.dtype), np.empty(v.shape, v.dtype)
    lse3 = np.ascontiguousarray(lse, dtype=np.float64 if code == _lib.FP64 else np.float32)[None]
    opts = _lib.options(code, _lib.HOST, causal, scale, stage, variant)
    _lib.backward_varlen(opts, qv, kv, vv, cq.ctypes.data, ck.ctypes.data, cq.size - 1, ov, _view(np, lse3, "lse"), dov,
                         _view(np, dq[None], "dq"), _view(np, dk[None], "dk"), _view(np, dv[None], "dv"))
    return dq, dk, dv


def attention_backward(dout, q, k, v, o, lse, causal=False, scale=None, stage=None, variant=None):
    np = _np()
    code, (qv, kv, vv, ov, dov) = _inputs(np, [q, k, v, o, dout], ["q", "k", "v", "o", "dout"])
    lse_dtype = np.float64 if code == _lib.FP64 else np.float32
    if not isinstance(lse, np.ndarray) or lse.ndim != 3 or lse.dtype != lse_dtype:
        raise ValueError(f"lse must be the [B, Hq, Nq] {np.dtype(lse_dtype)} array the forward returned")
    dq, dk, dv = np.empty(q.shape, q.dtype), np.empty(k.shape, k.dtype), np.empty(v.shape, v.dtype)
    opts = _lib.options(code, _lib.HOST, causal, scale, stage, variant)
    _lib.backward(opts, qv, kv, vv, ov, _view(np, lse, "lse"), dov,
                  _view(np, dq, "dq"), _view(np, dk, "dk"), _view(np, dv, "dv"))
    return dq, dk, dv


def resolve(q, k, causal=False, scale=None, stage=None, variant=None, backward=False):
    np = _np()
    code, (qv, kv) = _inputs(np, [q, k], ["q", "k"])
    return _lib.resolve(_lib.options(code, _lib.HOST, causal, scale, stage, variant), qv, kv, backward)
