"""flash_step._lib: libflash_step.so through ctypes: finding it, its structs (capi/flash_step.h), and calls
that raise FlashStepError with the library's own message."""
import ctypes
import os

# capi/flash_step.h's enums
OK, INVALID_ARGUMENT, UNKNOWN_STAGE, UNSUPPORTED, UNAVAILABLE, OUT_OF_MEMORY, RUNTIME_ERROR = range(7)
STATUS_NAMES = ["FS_OK", "FS_INVALID_ARGUMENT", "FS_UNKNOWN_STAGE", "FS_UNSUPPORTED", "FS_UNAVAILABLE",
                "FS_OUT_OF_MEMORY", "FS_RUNTIME_ERROR"]
FP32, FP64, FP16, BF16 = range(4)
HOST, DEVICE = range(2)
VERSION_MAJOR = 1  # the header this package was written against: FS_VERSION_MAJOR

ENV_VAR = "FLASH_STEP_LIBRARY"
LIBRARY_NAME = "libflash_step.so"


class FlashStepError(RuntimeError):
    """A call of libflash_step.so failed: `status` is its fs_status (an int), `status_name` its name, and the
    message the library's fs_last_error()."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.status_name = STATUS_NAMES[status] if 0 <= status < len(STATUS_NAMES) else str(status)


class Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("ndim", ctypes.c_int32),
                ("size", ctypes.c_int64 * 4), ("stride", ctypes.c_int64 * 4)]


class Options(ctypes.Structure):
    _fields_ = [("causal", ctypes.c_int32), ("softmax_scale", ctypes.c_double), ("dtype", ctypes.c_int),
                ("memory", ctypes.c_int), ("stage", ctypes.c_char_p), ("variant", ctypes.c_char_p)]


def repo_root():
    """The checkout this package sits in (python/flash_step/ -> the root), not resolving links: the build
    folder next to it is the one the caller sees."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def library_path():
    """Where libflash_step.so is: $FLASH_STEP_LIBRARY, else build/libflash_step.so of this checkout."""
    path = os.environ.get(ENV_VAR)
    if path:
        if not os.path.isfile(path):
            raise FlashStepError(INVALID_ARGUMENT, f"{ENV_VAR}={path}: no such file")
        return path
    path = os.path.join(repo_root(), "build", LIBRARY_NAME)
    if not os.path.isfile(path):
        raise FlashStepError(UNAVAILABLE, f"{LIBRARY_NAME} not found at {path}: build it (./run.sh build) or set "
                                          f"{ENV_VAR} to its path")
    return path


_lib = None


def lib():
    """The loaded library (once), its calls typed."""
    global _lib
    if _lib is not None:
        return _lib
    path = library_path()
    try:
        so = ctypes.CDLL(path)
    except OSError as e:
        raise FlashStepError(UNAVAILABLE, f"{path} could not be loaded: {e}") from None
    T, O, i32 = ctypes.POINTER(Tensor), ctypes.POINTER(Options), ctypes.c_int32
    so.fs_version.restype = i32
    so.fs_version.argtypes = []
    so.fs_last_error.restype = ctypes.c_char_p
    so.fs_last_error.argtypes = []
    so.fs_forward.restype = ctypes.c_int
    so.fs_forward.argtypes = [O, T, T, T, T, T]
    i32p = ctypes.POINTER(ctypes.c_int32)
    so.fs_forward_kvcache.restype = ctypes.c_int
    so.fs_forward_kvcache.argtypes = [O, T, T, T, i32p, i32p, i32, T, T]
    so.fs_forward_varlen.restype = ctypes.c_int
    so.fs_forward_varlen.argtypes = [O, T, T, T, i32p, i32p, i32, T, T]
    so.fs_backward_varlen.restype = ctypes.c_int
    so.fs_backward_varlen.argtypes = [O, T, T, T, i32p, i32p, i32, T, T, T, T, T, T]
    so.fs_backward.restype = ctypes.c_int
    so.fs_backward.argtypes = [O, T, T, T, T, T, T, T, T, T]
    so.fs_resolve.restype = ctypes.c_int
    so.fs_resolve.argtypes = [O, T, T, i32, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_char_p)]
    so.fs_stage_count.restype = i32
    so.fs_stage_count.argtypes = []
    so.fs_stage_name.restype = ctypes.c_char_p
    so.fs_stage_name.argtypes = [i32]
    so.fs_stage_memory.restype = ctypes.c_int
    so.fs_stage_memory.argtypes = [i32]
    so.fs_gpu_unavailable_reason.restype = ctypes.c_char_p
    so.fs_gpu_unavailable_reason.argtypes = []
    if hasattr(so, "fs_last_call_copied"):  # version 1.2
        so.fs_last_call_copied.restype = i32
        so.fs_last_call_copied.argtypes = []
    major = so.fs_version() // 1000
    if major != VERSION_MAJOR:
        raise FlashStepError(UNAVAILABLE, f"{path} has interface version {so.fs_version()}, this package needs "
                                          f"{VERSION_MAJOR}.x: rebuild the library or use its own python/")
    _lib = so
    return so


def check(status):
    """Raises FlashStepError with the library's message unless `status` is FS_OK."""
    if status != OK:
        raise FlashStepError(status, lib().fs_last_error().decode())


def tensor(ptr, shape, strides):
    """An fs_tensor of `shape` and `strides` (in elements) at address `ptr`."""
    t = Tensor()
    t.data = ptr
    t.ndim = len(shape)
    for i, (n, s) in enumerate(zip(shape, strides)):
        t.size[i] = int(n)
        t.stride[i] = int(s)
    return t


def options(dtype, memory, causal, scale, stage, variant):
    o = Options()
    o.causal = 1 if causal else 0
    o.softmax_scale = 0.0 if scale is None else float(scale)
    o.dtype = dtype
    o.memory = memory
    o.stage = stage.encode() if stage else None
    o.variant = variant.encode() if variant else None
    return o


def forward(opts, q, k, v, o, lse):
    check(lib().fs_forward(ctypes.byref(opts), *(ctypes.byref(t) for t in (q, k, v, o, lse))))


def forward_kvcache(opts, q, k_cache, v_cache, cache_seqlens, block_table, pages_per_seq, o, lse):
    """cache_seqlens, block_table: host int32 addresses (or None), as fs_forward_kvcache takes them."""
    i32p = ctypes.POINTER(ctypes.c_int32)
    lens = ctypes.cast(cache_seqlens, i32p) if cache_seqlens else None
    table = ctypes.cast(block_table, i32p) if block_table else None
    check(lib().fs_forward_kvcache(ctypes.byref(opts), ctypes.byref(q), ctypes.byref(k_cache), ctypes.byref(v_cache),
                                   lens, table, int(pages_per_seq), ctypes.byref(o), ctypes.byref(lse)))


def _i32(address):
    return ctypes.cast(address, ctypes.POINTER(ctypes.c_int32))


def forward_varlen(opts, q, k, v, cu_q, cu_k, batch, o, lse):
    """cu_q, cu_k: host int32 addresses of batch + 1 offsets each; q, k, v, o: [1, total, H, d] views."""
    check(lib().fs_forward_varlen(ctypes.byref(opts), ctypes.byref(q), ctypes.byref(k), ctypes.byref(v), _i32(cu_q),
                                  _i32(cu_k), int(batch), ctypes.byref(o), ctypes.byref(lse)))


def backward_varlen(opts, q, k, v, cu_q, cu_k, batch, o, lse, dout, dq, dk, dv):
    check(lib().fs_backward_varlen(ctypes.byref(opts), ctypes.byref(q), ctypes.byref(k), ctypes.byref(v), _i32(cu_q),
                                   _i32(cu_k), int(batch), *(ctypes.byref(t) for t in (o, lse, dout, dq, dk, dv))))


def backward(opts, q, k, v, o, lse, dout, dq, dk, dv):
    check(lib().fs_backward(ctypes.byref(opts), *(ctypes.byref(t) for t in (q, k, v, o, lse, dout, dq, dk, dv))))


def resolve(opts, q, k, backward):
    stage, variant = ctypes.c_char_p(), ctypes.c_char_p()
    check(lib().fs_resolve(ctypes.byref(opts), ctypes.byref(q), ctypes.byref(k), 1 if backward else 0,
                           ctypes.byref(stage), ctypes.byref(variant)))
    return stage.value.decode(), variant.value.decode()


def version():
    """The library's FS_VERSION (major * 1000 + minor)."""
    return lib().fs_version()


def stages():
    """[(name, "host" or "device")] of the library's stages, in tutorial order."""
    so = lib()
    return [(so.fs_stage_name(i).decode(), "device" if so.fs_stage_memory(i) == DEVICE else "host")
            for i in range(so.fs_stage_count())]


def last_call_copied():
    """How this thread's last successful call ran: 0 on the device tensors in place (the zero-copy path), 1
    through copies on the host, -1 on host memory (docs/interface.md, "Device memory")."""
    so = lib()
    if not hasattr(so, "fs_last_call_copied"):
        raise FlashStepError(UNAVAILABLE, f"{library_path()} predates interface version 1.2 (fs_last_call_copied)")
    return so.fs_last_call_copied()


def gpu_unavailable_reason():
    """Why the GPU stages cannot run here ("" when they can)."""
    return lib().fs_gpu_unavailable_reason().decode()
