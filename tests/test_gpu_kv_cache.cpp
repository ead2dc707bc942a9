// FlashAttention, step by step — decoding from a KV cache against step 1 (tests/test_gpu_kv_cache.cpp).
//
// Step 4's split-KV kernel (kernel_4f_split_kv.cuh) reading a KV cache (paged_kv.h): sequences of a batch that
// hold different numbers of keys (--cache-seqlens: empty, one key, a tile's tail, the whole capacity) and K and
// V in pages found through a shuffled block table (--page-size), one at a time and together; GQA, MQA, causal
// and not, forced and chosen split counts (more splits than a short sequence has tiles), bf16 and fp16, d = 64
// and 128. O and LSE against step 1 (which reads the same lengths) under the FlashAttention rule; a paged run
// against the contiguous one, bit for bit. The host-side tests (CI) check the page table and the refusals.
#include <cstring>

#include "gpu/gpu_runner.h"
#include "gpu_grid.h"
#include "step4_fused_pipelined/configs.h"
#include "step4_fused_pipelined/paged_kv.h"

namespace fa::grid {
namespace {

struct KvCase {
  Case c;
  std::vector<int64_t> lens;  // cache_seqlens; empty: every sequence holds Nk
  int64_t page_size;          // 0: contiguous
  int64_t splits;             // 0: chosen from the shape
};

std::string kv_name(const KvCase& k) {
  std::string n = case_name(k.c) + "_page" + std::to_string(k.page_size) + "_splits" + std::to_string(k.splits);
  if (!k.lens.empty()) {
    n += "_lens";
    for (int64_t l : k.lens) n += "_" + std::to_string(l);
  }
  return n;
}

Problem kv_problem(const KvCase& k) {
  Problem p = to_problem(k.c, /*backward=*/false);
  p.cache_seqlens = k.lens;
  p.page_size = k.page_size;
  p.splits = k.splits;
  p.validate();
  return p;
}

std::vector<KvCase> cases() {
  std::vector<KvCase> out;
  // 128 and 256 are multiples of both decode configurations' key tiles (128 keys at d = 64, 64 at d = 128).
  for (int64_t d : {64, 128}) {
    //              B  Hq Hkv  Nq    Nk    d  causal input_pos   dtype        dropout     lens             page splits
    out.push_back({{3, 8, 2, 1, 1000, d, true, kDefaultPos, DType::bf16, 0.0f}, {1000, 1, 517}, 256, 0});
    out.push_back({{3, 8, 8, 4, 777, d, true, kDefaultPos, DType::bf16, 0.0f}, {0, 300, 777}, 0, 3});
    out.push_back({{2, 8, 1, 16, 1024, d, true, kDefaultPos, DType::fp16, 0.0f}, {1024, 129}, 128, 7});
    out.push_back({{4, 4, 4, 1, 2048, d, true, kDefaultPos, DType::bf16, 0.0f}, {}, 512, 0});
    out.push_back({{2, 8, 2, 16, 600, d, false, kDefaultPos, DType::bf16, 0.0f}, {600, 250}, 256, 0});
    out.push_back({{2, 8, 2, 1, 8192, d, true, kDefaultPos, DType::bf16, 0.0f}, {8192, 3000}, 256, 40});
  }
  return out;
}

class GpuKvCache : public ::testing::TestWithParam<KvCase> {};

// The outputs of step 4's "auto" on p, run twice (the second time over poisoned outputs: every element is
// written again).
Outputs run_auto(const Problem& p, const Inputs& in) {
  const Stage* s = nullptr;
  std::string variant;
  EXPECT_EQ(resolve("step4_fused_pipelined:auto", s, variant), "");
  EXPECT_EQ(refusal(*s, p, variant), "");
  EXPECT_TRUE(step4::is_split_kv(s->config_of(p, variant, grid_cc_major()))) << "a KV cache runs the split-KV kernel";
  auto runner = s->make(p, in, variant);
  runner->run();
  auto* gpu = dynamic_cast<GpuRunner*>(runner.get());
  EXPECT_NE(gpu, nullptr);
  if (gpu) gpu->poison_outputs();
  runner->run();
  return runner->outputs();
}

TEST_P(GpuKvCache, MatchesReference) {
  const KvCase& k = GetParam();
  const Problem p = kv_problem(k);
  const Stage* s = nullptr;
  std::string variant;
  if (const std::string why = resolve("step4_fused_pipelined:auto", s, variant); !why.empty()) GTEST_SKIP() << why;
  const Inputs in = random_inputs(p);
  const Outputs out = run_auto(p, in);
  expect_pass(check_against_reference(p, in, out));
  if (k.page_size == 0) return;
  // Pages change where a tile is read from, not what is computed: the contiguous cache gives the same bits.
  Problem dense = p;
  dense.page_size = 0;
  const Outputs ref = run_auto(dense, in);
  ASSERT_EQ(out.o.data.size(), ref.o.data.size());
  EXPECT_EQ(0, std::memcmp(out.o.data.data(), ref.o.data.data(), out.o.data.size() * sizeof(float))) << "O differs";
  EXPECT_EQ(0, std::memcmp(out.lse.data.data(), ref.lse.data.data(), out.lse.data.size() * sizeof(float))) << "LSE differs";
}

INSTANTIATE_TEST_SUITE_P(Step4, GpuKvCache, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<KvCase>& info) { return param_name(kv_name(info.param)); });

// ---- host-side (no GPU: they run in CI) ----

// Step 4 declares every case in "auto", and every GPU stage declares exactly what its unsupported() accepts.
TEST(GridDeclarations, KvCacheCasesAgreeWithRefusals) {
  const Stage& s = find_stage("step4_fused_pipelined");
  for (const KvCase& k : cases()) {
    const Problem p = kv_problem(k);
    EXPECT_TRUE(declares(s, p, "auto")) << kv_name(k);
    expect_declarations_agree(p, [](const Stage&) { return true; });
  }
}

// What a KV cache is refused with: a variant that is not the split-KV kernel, dropout, score modifiers; the
// other GPU stages have none (has_kv_cache), step 1 reads it dense.
TEST(KvCacheRefusals, SayWhy) {
  const Stage& s = find_stage("step4_fused_pipelined");
  Problem p = kv_problem(cases()[0]);
  EXPECT_NE(s.unsupported(p, "4d-tma").find("split-KV kernel"), std::string::npos);
  EXPECT_NE(s.unsupported(p, "sm90").find("split-KV kernel"), std::string::npos);
  Problem drop = p;
  drop.dropout = 0.1f;
  EXPECT_NE(s.unsupported(drop, "auto").find("without dropout"), std::string::npos);
  Problem capped = p;
  capped.softcap = 30.0f;
  EXPECT_NE(s.unsupported(capped, "auto").find("score modifiers"), std::string::npos);
  for (const char* other : {"step2_online_softmax", "step3_naive_kernel", "step5_backward"})
    EXPECT_FALSE(find_stage(other).has_kv_cache) << other;
  // Step 1, the oracle, reads a ragged cache dense and refuses pages (a GPU layout), as it declares.
  const Stage& oracle = find_stage("step1_cpu_reference");
  Problem ragged = p;
  ragged.page_size = 0;
  EXPECT_TRUE(declares(oracle, ragged, "") && oracle.unsupported(ragged, "").empty());
  EXPECT_FALSE(declares(oracle, p, ""));
  EXPECT_NE(oracle.unsupported(p, "").find("pages are a GPU layout"), std::string::npos);
}

// The page table: each sequence gets ceil(len / P) pages, every used page of the pool exactly once, the
// rest of its row -1; pages of one sequence are not laid out in order (shuffled).
TEST(PageTable, EveryUsedPageOnceShuffled) {
  Problem p;
  p.B = 4, p.Nk = 1000, p.page_size = 128;
  p.cache_seqlens = {1000, 0, 1, 513};
  const step4::PageTable t = step4::make_page_table(p, 7);
  EXPECT_EQ(t.pages_per_seq, 8);
  EXPECT_EQ(t.pages, 8 + 0 + 1 + 5);
  std::vector<int> seen(size_t(t.pages), 0);
  bool in_order = true;
  for (int64_t b = 0; b < p.B; ++b)
    for (int n = 0; n < t.pages_per_seq; ++n) {
      const int page = t.table[size_t(b * t.pages_per_seq + n)];
      if (n * p.page_size >= p.kv_len(b)) {
        EXPECT_EQ(page, -1) << "b " << b << " n " << n;
        continue;
      }
      ASSERT_GE(page, 0);
      ASSERT_LT(page, t.pages);
      seen[size_t(page)] += 1;
      if (n > 0 && page != t.table[size_t(b * t.pages_per_seq + n - 1)] + 1) in_order = false;
    }
  for (int c : seen) EXPECT_EQ(c, 1);
  EXPECT_FALSE(in_order);
  p.cache_seqlens = {0, 0, 0, 0};  // nothing cached: one page still backs the tensor map
  EXPECT_EQ(step4::make_page_table(p, 7).pages, 1);
}

// Problem's checks of a cache: one length per sequence, each within the capacity; a page size >= 0.
TEST(KvCacheProblem, ValidateSaysWhatIsWrong) {
  Problem p;
  p.B = 2, p.Nk = 100;
  p.cache_seqlens = {100};
  EXPECT_THROW(p.validate(), std::invalid_argument);
  p.cache_seqlens = {100, 101};
  try {
    p.validate();
    ADD_FAILURE() << "a length past the capacity passed";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("0 .. Nk = 100"), std::string::npos) << e.what();
  }
  p.cache_seqlens = {0, 100};
  EXPECT_NO_THROW(p.validate());
  EXPECT_EQ(p.kv_input_pos(0), p.input_pos - 100);
  p.page_size = -1;
  EXPECT_THROW(p.validate(), std::invalid_argument);
}

}  // namespace
}  // namespace fa::grid
