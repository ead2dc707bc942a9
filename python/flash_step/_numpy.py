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
