"""flash_step._torch: the torch path, imported only when a torch tensor comes (torch is never needed to
install or import the package). Two custom ops over the C interface, flash_step::attention_forward
(O and LSE) and flash_step::attention_backward (dQ, dK, dV), joined by torch.library's register_autograd:
the forward saves Q, K, V, O and the LSE, the backward passes them to fs_backward. CUDA tensors go to the
GPU stages (bf16, fp16; fp32 on step 3), CPU tensors to the CPU stages (fp32, fp64)."""
from typing import Optional, Tuple

import torch

from . import _lib

if not hasattr(torch, "library") or not hasattr(torch.library, "custom_op"):
    raise ImportError(f"flash_step's torch path needs torch.library.custom_op (torch >= 2.4); this is torch "
                      f"{torch.__version__}")

_DTYPES = {torch.float32: _lib.FP32, torch.float64: _lib.FP64, torch.float16: _lib.FP16, torch.bfloat16: _lib.BF16}


def _code(t, name):
    if t.dtype not in _DTYPES:
        raise TypeError(f"{name} is {t.dtype}: flash_step takes float32, float64 (CPU), bfloat16, float16 (CUDA)")
    return _DTYPES[t.dtype]


def _view(t):
    return _lib.tensor(t.data_ptr(), t.shape, t.stride())


def _lse_dtype(t):
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _options(q, causal, scale, stage, variant):
    memory = _lib.DEVICE if q.is_cuda else _lib.HOST
    return _lib.options(_code(q, "q"), memory, causal, scale if scale else None, stage, variant)


class _on_device:
    """For a CUDA tensor: its device current, and the call ordered with the tensor's current stream. The
    library runs on the legacy default stream (the zero-copy path queues its kernels there; the copy path
    returns when its outputs are written): on torch's default stream nothing needs to wait; on another stream,
    the library's stream waits for it before, and it for the library's stream after."""

    def __init__(self, t):
        self.t = t
        self.guard = torch.cuda.device(t.device) if t.is_cuda else None
        self.stream = None

    def __enter__(self):
        if self.guard is not None:
            self.guard.__enter__()
            stream = torch.cuda.current_stream(self.t.device)
            if stream.cuda_stream != 0:
                self.stream = stream
                torch.cuda.default_stream(self.t.device).wait_stream(stream)

    def __exit__(self, *exc):
        if self.guard is not None:
            if self.stream is not None:
                self.stream.wait_stream(torch.cuda.default_stream(self.t.device))
            self.guard.__exit__(*exc)


def _lse_empty(q, B, Hq, Nq):
    """The LSE [B, Hq, Nq] laid out [Hq, B, Nq]: the packed layout the zero-copy path writes in place."""
    return torch.empty_strided((B, Hq, Nq), (Nq, B * Nq, 1), dtype=_lse_dtype(q), device=q.device)


def _dense(t):
    """A CUDA tensor as the zero-copy path reads it: contiguous (a copy on the device where it is not, as
    FlashAttention's own wrapper makes it; the C interface would copy it through the host)."""
    return t.contiguous() if t.is_cuda else t


def _same_kind(tensors, names):
    for t, n in zip(tensors, names):
        if t.device != tensors[0].device:
            raise ValueError(f"{n} is on {t.device}, {names[0]} on {tensors[0].device}")
        if t.dtype != tensors[0].dtype:
            raise TypeError(f"{n} is {t.dtype}, {names[0]} {tensors[0].dtype}: give them one dtype")
        if t.dim() != 4:
            raise ValueError(f"{n} has shape {tuple(t.shape)}: attention takes [B, N, H, d]")


def _forward(q, k, v, causal, scale, stage, variant):
    """O and the LSE through fs_forward: the body of the forward op and of the eager path (_Attention)."""
    _same_kind([q, k, v], ["q", "k", "v"])
    q, k, v = _dense(q), _dense(k), _dense(v)
    B, Nq, Hq, d = q.shape
    o = torch.empty((B, Nq, Hq, d), dtype=q.dtype, device=q.device)
    lse = _lse_empty(q, B, Hq, Nq)
    with _on_device(q):
        _lib.forward(_options(q, causal, scale, stage, variant), _view(q), _view(k), _view(v), _view(o), _view(lse))
    return o, lse


def _backward_impl(dout, q, k, v, o, lse, causal, scale, stage, variant):
    """dQ, dK, dV through fs_backward: the body of the backward op and of the eager path's backward."""
    _same_kind([q, k, v, o, dout], ["q", "k", "v", "o", "dout"])
    q, k, v, o, dout = (_dense(x) for x in (q, k, v, o, dout))
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    with _on_device(q):
        _lib.backward(_options(q, causal, scale, stage, variant), _view(q), _view(k), _view(v), _view(o),
                      _view(lse), _view(dout), _view(dq), _view(dk), _view(dv))
    return dq, dk, dv


@torch.library.custom_op("flash_step::attention_forward", mutates_args=())
def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
                      stage: Optional[str], variant: Optional[str]) -> Tuple[torch.Tensor, torch.Tensor]:
    return _forward(q, k, v, causal, scale, stage, variant)


@attention_forward.register_fake
def _(q, k, v, causal, scale, stage, variant):
    B, Nq, Hq, d = q.shape
    return q.new_empty((B, Nq, Hq, d)), _lse_empty(q, B, Hq, Nq)


@torch.library.custom_op("flash_step::attention_backward", mutates_args=())
def attention_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                       lse: torch.Tensor, causal: bool, scale: float, stage: Optional[str],
                       variant: Optional[str]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward_impl(dout, q, k, v, o, lse, causal, scale, stage, variant)


@attention_backward.register_fake
def _(dout, q, k, v, o, lse, causal, scale, stage, variant):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, causal, scale, stage, variant = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.args = (causal, scale, stage, variant)
    ctx.mark_non_differentiable(lse)  # the LSE is returned for inspection: no gradient flows through it
    ctx.set_materialize_grads(False)  # so its gradient stays None instead of a tensor of zeros filled per step


def _backward(ctx, dout, _dlse):
    if dout is None:  # no gradient reached O (grads are not materialized: set_materialize_grads(False))
        return None, None, None, None, None, None, None
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = attention_backward(dout, q, k, v, o, lse, *ctx.args)
    return dq, dk, dv, None, None, None, None


attention_forward.register_autograd(_backward, setup_context=_setup_context)


class _Attention(torch.autograd.Function):
    """The eager path: the ops' bodies under a plain autograd.Function, without the custom op's dispatch,
    checks and autograd wrapping, which at a small model's sizes cost the host more than the C calls themselves
    (docs/bench/call_overhead.py times the calls). torch.compile still sees the op (attention, below)."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, stage, variant):
        o, lse = _forward(q, k, v, causal, scale, stage, variant)
        _setup_context(ctx, (q, k, v, causal, scale, stage, variant), (o, lse))
        return o, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        if dout is None:
            return None, None, None, None, None, None, None
        q, k, v, o, lse = ctx.saved_tensors
        return (*_backward_impl(dout, q, k, v, o, lse, *ctx.args), None, None, None, None)


@torch.library.custom_op("flash_step::attention_with_kvcache", mutates_args=())
def attention_with_kvcache_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                              cache_seqlens: Optional[torch.Tensor], block_table: Optional[torch.Tensor], causal: bool,
                              scale: float, stage: Optional[str],
                              variant: Optional[str]) -> Tuple[torch.Tensor, torch.Tensor]:
    _same_kind([q, k_cache, v_cache], ["q", "k_cache", "v_cache"])
    B, Nq, Hq, d = q.shape
    o = torch.empty((B, Nq, Hq, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, Hq, Nq), dtype=_lse_dtype(q), device=q.device)
    # The lengths and the table are host arrays of int32 for the C interface.
    lens = None if cache_seqlens is None else cache_seqlens.to("cpu", torch.int32).contiguous()
    table = None if block_table is None else block_table.to("cpu", torch.int32).contiguous()
    if lens is not None and lens.shape != (B,):
        raise ValueError(f"cache_seqlens has shape {tuple(lens.shape)}: one length per sequence, ({B},)")
    if table is not None and (table.dim() != 2 or table.shape[0] != B):
        raise ValueError(f"block_table has shape {tuple(table.shape)}: [B, pages per sequence], B = {B}")
    with _on_device(q):
        _lib.forward_kvcache(_options(q, causal, scale, stage, variant), _view(q), _view(k_cache), _view(v_cache),
                             None if lens is None else lens.data_ptr(), None if table is None else table.data_ptr(),
                             0 if table is None else table.shape[1], _view(o), _view(lse))
    return o, lse


@attention_with_kvcache_op.register_fake
def _(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, stage, variant):
    B, Nq, Hq, d = q.shape
    return q.new_empty((B, Nq, Hq, d)), q.new_empty((B, Hq, Nq), dtype=_lse_dtype(q))


def attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=None, block_table=None, causal=True, scale=None,
                           stage=None, variant=None, return_lse=False):
    as_tensor = lambda x: x if x is None or isinstance(x, torch.Tensor) else torch.tensor(x, dtype=torch.int32)
    o, lse = attention_with_kvcache_op(q, k_cache, v_cache, as_tensor(cache_seqlens), as_tensor(block_table),
                                       bool(causal), float(scale or 0.0), stage, variant)
    return (o, lse) if return_lse else o


def _host_i32(x, name):
    t = torch.as_tensor(x).to("cpu", torch.int32).contiguous()
    if t.dim() != 1 or t.numel() < 2:
        raise ValueError(f"{name} must list batch + 1 offsets, from 0 (got shape {tuple(t.shape)})")
    return t


def _packed_view(t, name):
    if t.dim() != 3:
        raise ValueError(f"{name} has shape {tuple(t.shape)}: a packed batch is [total, H, d]")
    return _view(t.unsqueeze(0))


@torch.library.custom_op("flash_step::attention_varlen_forward", mutates_args=())
def attention_varlen_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                             cu_seqlens_k: torch.Tensor, causal: bool, scale: float, stage: Optional[str],
                             variant: Optional[str]) -> Tuple[torch.Tensor, torch.Tensor]:
    cq, ck = _host_i32(cu_seqlens_q, "cu_seqlens_q"), _host_i32(cu_seqlens_k, "cu_seqlens_k")
    q, k, v = _dense(q), _dense(k), _dense(v)
    total, Hq, d = q.shape
    o = torch.empty((total, Hq, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((1, Hq, total), dtype=_lse_dtype(q), device=q.device)
    with _on_device(q):
        _lib.forward_varlen(_options(q, causal, scale, stage, variant), _packed_view(q, "q"), _packed_view(k, "k"),
                            _packed_view(v, "v"), cq.data_ptr(), ck.data_ptr(), cq.numel() - 1, _packed_view(o, "o"),
                            _view(lse))
    return o, lse[0]


@attention_varlen_forward.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, stage, variant):
    total, Hq, d = q.shape
    return q.new_empty((total, Hq, d)), q.new_empty((Hq, total), dtype=_lse_dtype(q))


@torch.library.custom_op("flash_step::attention_varlen_backward", mutates_args=())
def attention_varlen_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                              lse: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, causal: bool,
                              scale: float, stage: Optional[str],
                              variant: Optional[str]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    cq, ck = _host_i32(cu_seqlens_q, "cu_seqlens_q"), _host_i32(cu_seqlens_k, "cu_seqlens_k")
    dout, q, k, v, o = (_dense(x) for x in (dout, q, k, v, o))
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    with _on_device(q):
        _lib.backward_varlen(_options(q, causal, scale, stage, variant), _packed_view(q, "q"), _packed_view(k, "k"),
                             _packed_view(v, "v"), cq.data_ptr(), ck.data_ptr(), cq.numel() - 1, _packed_view(o, "o"),
                             _view(lse.unsqueeze(0)), _packed_view(dout.contiguous(), "dout"), _packed_view(dq, "dq"),
                             _packed_view(dk, "dk"), _packed_view(dv, "dv"))
    return dq, dk, dv


@attention_varlen_backward.register_fake
def _(dout, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, causal, scale, stage, variant):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _varlen_setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, causal, scale, stage, variant = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, cu_q, cu_k)
    ctx.args = (causal, scale, stage, variant)
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)


def _varlen_backward(ctx, dout, _dlse):
    if dout is None:
        return None, None, None, None, None, None, None, None, None
    q, k, v, o, lse, cu_q, cu_k = ctx.saved_tensors
    dq, dk, dv = attention_varlen_backward(dout, q, k, v, o, lse, cu_q, cu_k, *ctx.args)
    return dq, dk, dv, None, None, None, None, None, None


attention_varlen_forward.register_autograd(_varlen_backward, setup_context=_varlen_setup_context)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False, scale=None, stage=None, variant=None,
                     return_lse=False):
    as_i32 = lambda x: x if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=torch.int32)  # noqa: E731
    o, lse = attention_varlen_forward(q, k, v, as_i32(cu_seqlens_q), as_i32(cu_seqlens_k), bool(causal),
                                      float(scale or 0.0), stage, variant)
    return (o, lse) if return_lse else o


def attention(q, k, v, causal=False, scale=None, stage=None, variant=None, return_lse=False):
    args = (q, k, v, bool(causal), float(scale or 0.0), stage, variant)
    # Traced (torch.compile): the registered op, which the compiler knows; eager: the same bodies, lighter.
    o, lse = attention_forward(*args) if torch.compiler.is_compiling() else _Attention.apply(*args)
    return (o, lse) if return_lse else o


def resolve(q, k, causal=False, scale=None, stage=None, variant=None, backward=False):
    return _lib.resolve(_options(q, causal, scale, stage, variant), _view(q), _view(k), backward)
