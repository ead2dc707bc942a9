// FlashAttention, step by step — gpu/ptx.h
// Thin wrappers over the PTX instructions the tensor-core stages use, each citing the PTX ISA section it
// follows and saying in scalar terms what it does. Only instructions that sm_90 (H100) and sm_120
// (RTX 50-series) both have: mma.sync, ldmatrix, cp.async, cp.async.bulk.tensor (TMA), mbarrier,
// named barriers and griddepcontrol. No wgmma (step 7 has its own, step7_hopper_wgmma/wgmma.cuh).
// Compiled for sm_80-89 (A100, RTX 30/40, L4: mma.sync, ldmatrix and cp.async, but no TMA, stmatrix,
// mbarrier transaction counts or griddepcontrol), the wrappers of those sm_90 instructions become a trap
// (FA_SM90_OR_TRAP): a kernel that uses them still compiles, and the host never launches it there
// (gpu/platform.h, tma_platform; step 4's sm_8x variants run 4a-4c only).
#pragma once
#include <cuda/ptx>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

// The body of a wrapper of an sm_90 instruction: itself on the host pass and on sm_90 and later, a trap below.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define FA_SM90_OR_TRAP(...) __trap()
#else
#define FA_SM90_OR_TRAP(...) __VA_ARGS__
#endif

namespace fa::ptx {

// ---- tensor cores -------------------------------------------------------------------------------
// PTX ISA, "Warp-level matrix multiply-accumulate instructions: mma", shape .m16n8k16 (bf16 / f16 inputs,
// f32 accumulators; the fragment figures for .m16n8k16 give the layouts below).
// Scalar meaning: D[16x8] = A[16x16] * B[16x8] + C[16x8], computed by the 32 threads of a warp together.
// Fragments (per thread, lane = 4 * group + t, group = lane / 4, t = lane % 4):
//   a[4] (4 x 2 halves): A[group][2t..2t+1], A[group+8][2t..], A[group][2t+8..], A[group+8][2t+8..]
//   b[2] (2 x 2 halves): B[2t..2t+1][group], B[2t+8..2t+9][group]
//   c[4]:                C[group][2t], C[group][2t+1], C[group+8][2t], C[group+8][2t+1]
template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}

// Packs two floats into one register of two 16-bit values (lo in the low half), rounding to nearest.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// ---- shared memory -> registers -----------------------------------------------------------------
// PTX ISA, "Warp-level matrix load instruction: ldmatrix" (.sync.aligned.m8n8.x4.shared.b16).
// Scalar meaning: four 8x8 matrices of 16-bit elements are read from shared memory; lanes 8k..8k+7 give
// the row addresses of matrix k (16 contiguous bytes each); afterwards thread `lane` holds, in r[k],
// elements (lane / 4, 2 * (lane % 4) .. +1) of matrix k: exactly an mma fragment.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}
// The same with each 8x8 matrix transposed on the way (".trans"): thread `lane` gets elements
// (2 * (lane % 4) .. +1, lane / 4). Used for V in O += P V, whose rows are keys, not output columns.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}

// ---- registers -> shared memory -----------------------------------------------------------------
// PTX ISA, "Warp-level matrix store instruction: stmatrix" (.sync.aligned.m8n8.x4.shared.b16, sm_90 and
// later, sm_120 included): ldmatrix_x4 backwards. Lanes 8k..8k+7 give the row addresses of matrix k;
// thread `lane` contributes, in r[k], elements (lane / 4, 2 * (lane % 4) .. +1) of matrix k, the layout of
// an mma C fragment packed to 16 bits. One instruction stores what four 32-bit stores per n8 tile would.
__device__ __forceinline__ void stmatrix_x4(uint32_t smem_addr, const uint32_t (&r)[4]) {
  FA_SM90_OR_TRAP(asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};\n"
                               :
                               : "r"(smem_addr), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
                               : "memory"));
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- global -> shared memory without registers: cp.async -----------------------------------------
// PTX ISA, "Data movement and conversion instructions: cp.async" (.cg: cached in L2 only, 16 bytes).
// Scalar meaning: copy 16 bytes from global `src` to shared `dst` in the background, without a register.
// commit_group closes the copies this thread issued since the last commit into a group; wait_group<N>
// returns once at most N of this thread's groups are still in flight (the other threads' copies need a
// __syncthreads as well).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---- fast exp2 ----------------------------------------------------------------------------------
// PTX ISA, "Floating point instructions: ex2" (.approx.ftz.f32): 2^x in one MUFU instruction; ex2(-inf) = +0.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// ---- mbarrier -----------------------------------------------------------------------------------
// PTX ISA, "Parallel synchronization and communication instructions: mbarrier": a 64-bit
// shared-memory object that counts arrivals (and, for TMA, transaction bytes) of the current phase;
// when both reach zero the phase completes and its parity flips.
// Scalar meaning of the wrappers: init sets the expected arrival count; arrive_expect_tx arrives once and
// adds `bytes` to the bytes the phase waits for; arrive counts one arrival; wait(parity) spins until the
// phase with that parity has completed.
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) { cuda::ptx::mbarrier_init(bar, count); }
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  FA_SM90_OR_TRAP(cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta,
                                                       cuda::ptx::space_shared, bar, bytes));
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) { cuda::ptx::mbarrier_arrive(bar); }
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  FA_SM90_OR_TRAP(while (!cuda::ptx::mbarrier_try_wait_parity(bar, parity)){});
}
// PTX ISA, "membar / fence" (fence.mbarrier_init.release.cluster): makes the initialised barriers
// visible to the async proxy (TMA).
__device__ __forceinline__ void fence_barrier_init() {
  FA_SM90_OR_TRAP(cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster));
}

// ---- TMA: bulk tensor copies ---------------------------------------------------------------------
// PTX ISA, "Data movement and conversion instructions: prefetch" (prefetch.tensormap): brings a tensor map
// (a __grid_constant__ kernel parameter) into the cache TMA reads it from, so that the first copy that names
// it does not wait for the descriptor's fetch.
__device__ __forceinline__ void prefetch_tensormap(const void* tmap) {
  FA_SM90_OR_TRAP(asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(tmap)) : "memory"));
}
// PTX ISA, "Data movement and conversion instructions: cp.async.bulk.tensor" (global -> shared::cluster,
// tile mode, 3-D, mbarrier::complete_tx::bytes).
// Scalar meaning: copy the box of the tensor map starting at coordinates {x, y, z} (x innermost) into
// shared memory at `dst`, zero-filling what lies outside the tensor, then signal `bar` with the bytes.
__device__ __forceinline__ void tma_load_3d(void* dst, const void* tmap, int x, int y, int z, uint64_t* bar) {
  FA_SM90_OR_TRAP(const int32_t coords[3] = {x, y, z};
                  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, dst, tmap, coords, bar));
}
// The other direction (shared::cta -> global, bulk_group completion): rows outside the tensor are skipped.
__device__ __forceinline__ void tma_store_3d(const void* tmap, int x, int y, int z, const void* src) {
  FA_SM90_OR_TRAP(const int32_t coords[3] = {x, y, z};
                  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_global, cuda::ptx::space_shared, tmap, coords, src));
}
// PTX ISA, "cp.async.bulk.commit_group" and "cp.async.bulk.wait_group" (.read): wait until the stores
// issued so far have finished reading shared memory (so it may be reused or the block may exit).
__device__ __forceinline__ void tma_store_commit_and_wait() {
  FA_SM90_OR_TRAP(cuda::ptx::cp_async_bulk_commit_group(); cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{}));
}
// PTX ISA, "membar / fence" (fence.proxy.async.shared::cta): orders this thread's ordinary
// shared-memory writes before later reads of the same memory by the async proxy (a TMA store).
__device__ __forceinline__ void fence_async_shared() {
  FA_SM90_OR_TRAP(cuda::ptx::fence_proxy_async(cuda::ptx::space_shared));
}

// ---- named barriers ------------------------------------------------------------------------------
// PTX ISA, "Parallel synchronization and communication instructions: bar, barrier": barrier kId (1-15; 0 is
// __syncthreads') completes once kThreads threads have reached it. sync waits for that; arrive counts this
// thread and goes on. With a subset of the block's warps they order two groups of warps without stopping the
// rest (step 7's ping-pong: one warpgroup waits its turn, the other hands it over).
template <int kId, int kThreads>
__device__ __forceinline__ void named_barrier_sync() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
}
template <int kId, int kThreads>
__device__ __forceinline__ void named_barrier_arrive() {
  asm volatile("bar.arrive %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
}
// The same with the id in a register: one copy of the code serves warps that use different barriers. ptxas
// then counts all 16 barriers as used by the block, which matters only where blocks share an SM.
template <int kThreads>
__device__ __forceinline__ void named_barrier_sync_at(int id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
}
template <int kThreads>
__device__ __forceinline__ void named_barrier_arrive_at(int id) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
}

// ---- programmatic dependent launch --------------------------------------------------------------
// PTX ISA, "Parallel synchronization and communication instructions: griddepcontrol" (sm_90 and later).
// A kernel launched with cudaLaunchAttributeProgrammaticStreamSerialization may start while the kernel
// before it on the stream still runs: its blocks are scheduled once every block of the earlier grid has
// executed launch_dependents (or exited), and its wait_for_prerequisites blocks until the earlier grid has
// completed and its memory writes are visible. Without the attribute both are no-ops.
__device__ __forceinline__ void launch_dependents() {
  FA_SM90_OR_TRAP(asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"));
}
__device__ __forceinline__ void wait_for_prerequisites() { FA_SM90_OR_TRAP(asm volatile("griddepcontrol.wait;\n" ::: "memory")); }

}  // namespace fa::ptx
