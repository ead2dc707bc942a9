// FlashAttention, step by step — stream-ordered device memory (gpu/stream_buffer.cu; gpu/cuda_util.h, StreamBuffer)
// for the zero-copy path: what one queued call needs beside the caller's tensors (a packed batch's offsets, a
// backward's D), allocated and freed in the default stream's order. The offsets travel in kernel parameters,
// kWordsPerLaunch at a time: a launch returns at once, where cudaMemcpyAsync from pageable memory may first
// wait for the stream (the CUDA runtime's "API synchronization behavior").
#include "gpu/cuda_util.h"

namespace fa {
namespace {

constexpr int kWordsPerLaunch = 960;  // 3.8 KB of parameters: under the 4 KB every architecture takes

struct Words {
  int n;
  int32_t w[kWordsPerLaunch];
};

__global__ void write_words_kernel(const __grid_constant__ Words words, int32_t* dst) {
  for (int i = threadIdx.x; i < words.n; i += blockDim.x) dst[i] = words.w[i];
}

}  // namespace

StreamBuffer::StreamBuffer(size_t bytes) {
  if (bytes > 0) CUDA_CHECK(cudaMallocAsync(&ptr_, bytes, cudaStreamLegacy));
}

StreamBuffer::StreamBuffer(const std::vector<int32_t>& words) : StreamBuffer(words.size() * sizeof(int32_t)) {
  for (size_t at = 0; at < words.size(); at += kWordsPerLaunch) {
    Words chunk{};
    chunk.n = int(std::min(words.size() - at, size_t(kWordsPerLaunch)));
    std::copy_n(words.begin() + std::ptrdiff_t(at), chunk.n, chunk.w);
    write_words_kernel<<<1, 256, 0, cudaStreamLegacy>>>(chunk, as<int32_t>() + at);
    CUDA_CHECK_LAUNCH();
  }
}

StreamBuffer::~StreamBuffer() {
  if (ptr_) cudaFreeAsync(ptr_, cudaStreamLegacy);  // a destructor cannot report; the next CUDA call's check will
}

}  // namespace fa
