// FlashAttention, step by step — harness/cli.cpp
#include "harness/cli.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <new>
#include <nlohmann/json.hpp>

#include "core/dropout.h"
#include "core/dtype.h"
#include "core/host_memory.h"
#include "core/npy.h"
#include "core/random.h"
#include "core/score_mod.h"
#include "core/varlen.h"

namespace fa {

// It reads the flag's text before CLI11 converts it, and its message replaces CLI11's range text (which
// prints the bounds of a double with 300 digits).
CLI::Validator whole_number(uint64_t lo, uint64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        uint64_t v = 0;
        const char* end = text.data() + text.size();
        const auto [stop, error] = std::from_chars(text.data(), end, v);
        if (error != std::errc() || stop != end || v > hi)  // not a number, negative, or too large
          return "must be a whole number from " + std::to_string(lo) + " to " + std::to_string(hi) + " (got " +
                 text + ")";
        if (v < lo) return "must be at least " + std::to_string(lo) + " (got " + text + ")";
        return "";
      },
      "", "whole_number");
}

// --dropout's check, on the flag's text before CLI11 converts it to a float: a value below 1 that float32
// rounds to 1 (0.999999999) would otherwise be refused as "(got 1)", a number nobody typed.
static CLI::Validator dropout_probability() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size()) return "";  // not a number: CLI11 says so
        if (!(v >= 0.0 && v < 1.0)) return "must be in [0, 1) (got " + text + ")";
        if (float(v) >= 1.0f)
          return "must be in [0, 1): " + text + " rounds to 1 in float32 (the largest usable value is " +
                 float_str(std::nextafter(1.0f, 0.0f)) + ")";
        return "";
      },
      "", "dropout_probability");
}

const char* const kExitCodes =
    "Exit codes: 0 done; 1 --check found an output outside the tolerance; 2 bad input or a file that could not "
    "be written (one line on stderr; nothing run, or no file left half-written); 3 an output is NaN or "
    "infinite (one line on stderr).";

void add_common_options(CLI::App& app, CommonOptions& o) {
  Problem& p = o.problem;
  auto dflt = [](int64_t v) { return " (default " + std::to_string(v) + ")"; };
  app.add_option("--batch", o.batch, "batch size B" + dflt(p.B));
  app.add_option("--heads", o.heads, "query heads Hq" + dflt(p.Hq));
  app.add_option("--kv-heads", o.kv_heads, "key/value heads Hkv (default: = heads; Hq % Hkv == 0 for GQA)");
  app.add_option("--seq", o.seq, "sequence length: sets both Nq and Nk (default 1024)");
  app.add_option("--seq-q", o.seq_q, "query length Nq");
  app.add_option("--seq-k", o.seq_k, "key/value length Nk");
  app.add_option("--dim", o.dim, "head dimension d" + dflt(p.d));
  app.add_flag("--causal", p.causal, "causal mask: query i sees key j iff j <= input_pos + i");
  app.add_option("--input-pos", o.input_pos,
                 "with --causal: absolute position of query 0 (default Nk - Nq, bottom-right)");
  app.add_option("--scale", o.scale, "softmax scale, positive (default 1/sqrt(d))");
  app.add_option("--dtype", o.dtype, "storage type of Q, K, V, O: bf16 | fp16 | fp32")
      ->check(CLI::IsMember({"bf16", "fp16", "fp32"}))
      ->capture_default_str();
  app.add_option("--dropout", p.dropout, "dropout probability p in [0, 1)")
      ->check(dropout_probability())
      ->capture_default_str();
  app.add_option("--seed", o.seed, "seed of the random inputs and the dropout mask" + dflt(int64_t(p.seed)))
      ->check(whole_number(0, std::numeric_limits<uint64_t>::max()));
  app.add_flag("--backward", p.backward, "also run the backward pass (stages that have one)");
  app.add_option("--variant", o.variant, "stage variant (see the stage's README)");
  app.add_option("--splits", p.splits,
                 "split-KV: the key range of each head split among this many blocks, merged at the end "
                 "(stages with a decoding path; 0 = chosen from the shape and the GPU)")
      ->capture_default_str();
  app.add_option("--cache-seqlens", o.cache_seqlens,
                 "a decoding KV cache whose sequences hold different numbers of keys: n0,n1,... (one per sequence, "
                 "each 0 .. Nk; Nk is the cache's capacity); queries sit at the end of their sequence (stages with a "
                 "KV cache: step 4's 4f)");
  app.add_option("--page-size", p.page_size,
                 "store the KV cache in pages of this many keys, found through a block table (a paged cache, as "
                 "serving engines keep it; step 4's 4f: a multiple of its key tile)")
      ->check(whole_number(1, 1 << 20));
  app.add_option("--bias", o.bias_file,
                 "add FILE (float32 .npy [B or 1, Hq or 1, Nq, Nk]) to the scores; -inf masks (stages with score "
                 "modifiers)");
  app.add_flag("--alibi", p.alibi, "ALiBi: add -slope_h * |j - (input_pos + i)|, the standard slopes of Hq heads");
  app.add_option("--alibi-slopes", o.alibi_slopes_file,
                 "with --alibi: read the slope of each query head from FILE (float32 .npy [Hq]) instead");
  app.add_option("--window", o.window,
                 "sliding window L,R: query i sees keys (input_pos + i) - L .. (input_pos + i) + R; -1 = unbounded");
  app.add_option("--softcap", o.softcap, "softcap C > 0: scores become C * tanh(s / C)");
  app.add_option("--cu-seqlens-q", o.cu_seqlens_q,
                 "a packed variable-length batch (with --cu-seqlens-k): where each sequence's queries start, "
                 "0,Lq0,Lq0+Lq1,... (Q is [total_q, Hq, d]); sequence b sees only its own keys, causal bottom-right "
                 "in them; random inputs, steps 1 and 2");
  app.add_option("--cu-seqlens-k", o.cu_seqlens_k,
                 "with --cu-seqlens-q: where each sequence's keys start, as many offsets (K, V are [total_k, Hkv, d])");
  app.add_option("--inputs", o.inputs_dir,
                 "read q.npy, k.npy, v.npy (and do.npy) float32 from DIR; they set the shape");
  app.add_option("--dump", o.dump_dir, "write o.npy, lse.npy (and dq/dk/dv, dropout_mask) to DIR");
  app.add_flag("--check", o.check, "compare with step 1 in fp64; exit 1 if the tolerance rule fails");
  app.add_flag("--bench", o.bench, "time the stage: median of warmed-up runs");
  app.add_option("--json", o.json_file, "append one JSON record per run to FILE");
  app.add_flag("--list-variants", o.list_variants,
               "print the variants (the first is the default), then the named tuning configurations; run nothing");
  app.add_option("--bench-against", o.bench_against,
                 "with --bench: also time VARIANT of this stage on the same inputs, alternating with the main run "
                 "in rounds, and record both (a same-run comparison)");
  app.add_flag("--tuned", o.tuned, "run the configuration step 6 tuned for this GPU and problem (tunes it once)");
  app.footer(kExitCodes);
}

std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv, const std::string& program) {
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::Success& e) {  // --help: CLI11 prints it
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: error: %s; see --help\n", program.c_str(), e.what());
    return 2;
  }
}

std::vector<std::string> flags_given(const CLI::App& app) {
  std::vector<std::string> given;
  // From the long name, not get_name(): that is "" for an option kept out of --help (the tour's).
  for (const CLI::Option* opt : app.get_options())
    if (opt->count() > 0) given.push_back(opt->get_lnames().empty() ? opt->get_name() : "--" + opt->get_lnames()[0]);
  return given;
}

void refuse_flags_beside(const CLI::App& app, const std::string& mode, const std::vector<std::string>& allowed,
                         const std::string& what_mode_does) {
  std::string ignored;
  for (const std::string& flag : flags_given(app))
    if (flag != mode && std::find(allowed.begin(), allowed.end(), flag) == allowed.end())
      ignored += (ignored.empty() ? "" : ", ") + flag;
  if (!ignored.empty()) throw std::invalid_argument(mode + " " + what_mode_does + ": drop " + ignored);
}

void check_command_line(const CLI::App& app, const CommonOptions& o) {
  if (o.list_variants) refuse_flags_beside(app, "--list-variants", {}, "prints the stage's names and runs nothing");
}

// The directory part of a path: "." for a bare file name.
static std::string directory_of(const std::string& path) {
  const std::string dir = std::filesystem::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

static bool is_directory(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Whether --json FILE can be appended to, found out without creating it: an existing file that may be
// written, or a new name in a directory that may be written.
static void check_appendable(const std::string& file) {
  struct stat st;
  if (stat(file.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) throw std::runtime_error("--json: " + file + " is a directory, not a file");
    if (access(file.c_str(), W_OK) != 0) throw std::runtime_error("--json: " + file + " is not writable");
    return;
  }
  const std::string dir = directory_of(file);
  if (!is_directory(dir)) throw std::runtime_error("--json: the directory " + dir + " of " + file + " does not exist");
  if (access(dir.c_str(), W_OK) != 0) throw std::runtime_error("--json: the directory " + dir + " is not writable");
}

void check_common_flags(const Stage& s, const CommonOptions& o) {
  auto known = [&](const std::string& v) {
    for (const auto* list : {&s.variants, &s.tuning_variants})
      if (std::find(list->begin(), list->end(), v) != list->end()) return true;
    return false;
  };
  if (!o.bench_against.empty() && !o.bench) throw std::invalid_argument("--bench-against needs --bench");
  if (o.tuned && !o.variant.empty())
    throw std::invalid_argument("--tuned picks the configuration itself: give --tuned or --variant, not both");
  for (const std::string& v : {o.variant, o.bench_against})
    if (!v.empty() && !known(v)) throw std::invalid_argument(s.name + " has no variant '" + v + "'");
  if (o.problem.backward && !s.has_backward) throw std::invalid_argument(s.name + " has no backward pass (--backward)");
  if (o.problem.splits > 0 && !s.has_splits)
    throw std::invalid_argument(s.name + " has no split-KV path (--splits): step 4's forward has");
  if ((!o.cache_seqlens.empty() || o.problem.page_size > 0) && !s.has_kv_cache)
    throw std::invalid_argument(s.name + " has no KV-cache path (--cache-seqlens, --page-size): step 4's forward has "
                                "(its split-KV kernel, 4f), and step 1 reads the lengths");
  {  // score modifiers, named as given
    std::string mods;
    for (const auto& [flag, set] : {std::pair<const char*, bool>{"--bias", !o.bias_file.empty()},
                                    {"--alibi", o.problem.alibi},
                                    {"--alibi-slopes", !o.alibi_slopes_file.empty()},
                                    {"--window", !o.window.empty()},
                                    {"--softcap", o.softcap.has_value()}})
      if (set) mods += (mods.empty() ? "" : ", ") + std::string(flag);
    if (!mods.empty() && !s.has_score_mods)  // a stage that does not declare has_score_mods (core/stage.h)
      throw std::invalid_argument(s.name + " has no score modifiers (" + mods + "): steps 1 to 6 have them "
                                  "(step 4 in its 4e and 4f configurations)");
  }
  if (o.tuned && s.tuning_variants.empty())
    throw std::invalid_argument(s.name + " has no configurations to tune (--tuned)");
  if (o.tuned && !o.tuner)
    throw std::invalid_argument("--tuned needs step 6's autotuner, which this program does not link: run "
                                "step6_autotune with the same flags (it tunes step 4's forward and, with "
                                "--backward, step 5's backward)");
  // Checked before anything is read or run, so that a typo costs nothing.
  if (!o.dump_dir.empty()) {
    if (!is_directory(o.dump_dir)) throw std::runtime_error("--dump: " + o.dump_dir + " is not an existing directory");
    if (access(o.dump_dir.c_str(), W_OK) != 0) throw std::runtime_error("--dump: " + o.dump_dir + " is not writable");
  }
  if (!o.json_file.empty()) check_appendable(o.json_file);
}

// The position of element `flat` of a tensor of this shape, as "[0, 3, 17, 5]".
static std::string index_str(const std::vector<int64_t>& shape, size_t flat) {
  std::vector<int64_t> index(shape.size());
  for (size_t k = shape.size(); k-- > 0;) {
    index[k] = int64_t(flat % size_t(shape[k]));
    flat /= size_t(shape[k]);
  }
  return shape_str(index);
}

// Reads DIR/name as an input: four dimensions, every value finite, and still finite once rounded to the
// problem's dtype (a float above 65504 is inf in fp16). A NaN or infinity would flow through every stage and
// the reference alike, and the check would have nothing to compare. Returns the values rounded.
static Tensor load_input(const std::string& dir, const std::string& name, DType dtype) {
  const std::string path = dir + "/" + name;
  Tensor t = read_npy(path);
  if (t.shape.size() != 4)
    throw std::runtime_error(path + ": expected 4 dimensions [B, H, N, d], got " + shape_str(t.shape));
  for (size_t k = 0; k < t.size(); ++k) {
    const float x = t.data[k];
    if (!std::isfinite(x))
      throw std::invalid_argument(path + ": element " + index_str(t.shape, k) + " is " +
                                  (std::isnan(x) ? "NaN" : x > 0 ? "inf" : "-inf") + "; inputs must be finite");
    t.data[k] = round_to(dtype, x);
    if (!std::isfinite(t.data[k])) {
      char value[32];
      std::snprintf(value, sizeof value, "%g", double(x));
      throw std::invalid_argument(path + ": element " + index_str(t.shape, k) + " = " + value + " is beyond " +
                                  dtype_name(dtype) + "'s range (it would round to " + (x > 0 ? "inf" : "-inf") + ")");
    }
  }
  return t;
}

// Reads --bias FILE: float32 [B or 1, Hq or 1, Nq, Nk] for the resolved problem p; -inf is allowed (it
// masks the key), NaN and +inf are not. Kept in float32, not rounded to the dtype: a bias is a score term.
static Tensor load_bias(const std::string& path, const Problem& p) {
  Tensor t = read_npy(path);
  const std::vector<int64_t>& s = t.shape;
  const bool fits = s.size() == 4 && (s[0] == p.B || s[0] == 1) && (s[1] == p.Hq || s[1] == 1) && s[2] == p.Nq &&
                    s[3] == p.Nk;
  // A dimension the bias may broadcast over reads "4 or 1"; one that is already 1 reads "1".
  auto or_one = [](int64_t n) { return std::to_string(n) + (n == 1 ? "" : " or 1"); };
  if (!fits)
    throw std::invalid_argument("--bias: " + path + " has shape " + shape_str(s) + "; this problem needs [" +
                                or_one(p.B) + ", " + or_one(p.Hq) + ", " + std::to_string(p.Nq) + ", " +
                                std::to_string(p.Nk) + "]");
  for (size_t k = 0; k < t.size(); ++k)
    if (std::isnan(t.data[k]) || t.data[k] == std::numeric_limits<float>::infinity())
      throw std::invalid_argument("--bias: " + path + ": element " + index_str(s, k) + " is " +
                                  (std::isnan(t.data[k]) ? "NaN" : "inf") + "; a bias must be finite or -inf");
  return t;
}

// Reads --alibi-slopes FILE: float32 [Hq], every slope finite (FlashAttention's alibi_slopes of shape
// (nheads,); a negative slope is allowed: it rewards distance, which is the caller's business).
static Tensor load_slopes(const std::string& path, const Problem& p) {
  Tensor t = read_npy(path);
  if (t.shape != std::vector<int64_t>{p.Hq})
    throw std::invalid_argument("--alibi-slopes: " + path + " has shape " + shape_str(t.shape) +
                                "; this problem needs [" + std::to_string(p.Hq) + "] (one slope per query head)");
  for (size_t k = 0; k < t.size(); ++k)
    if (!std::isfinite(t.data[k]))
      throw std::invalid_argument("--alibi-slopes: " + path + ": slope " + std::to_string(k) + " is not finite");
  return t;
}

// The shape flags given beside --inputs, which the files override: "--seq, --dim", or "".
static std::string shape_flags_given(const CommonOptions& o) {
  const std::pair<const char*, bool> flags[] = {
      {"--batch", o.batch.has_value()}, {"--heads", o.heads.has_value()}, {"--kv-heads", o.kv_heads.has_value()},
      {"--seq", o.seq.has_value()},     {"--seq-q", o.seq_q.has_value()}, {"--seq-k", o.seq_k.has_value()},
      {"--dim", o.dim.has_value()}};
  std::string given;
  for (const auto& [flag, set] : flags)
    if (set) given += (given.empty() ? "" : ", ") + std::string(flag);
  return given;
}

// The problem's dtype, seed, window, softcap and cache lengths from the flags (prepare_inputs and run_varlen).
static void resolve_dtype_and_modifiers(CommonOptions& o) {
  Problem& p = o.problem;
  p.dtype = parse_dtype(o.dtype);
  p.seed = o.seed.value_or(p.seed);
  if (!o.window.empty()) {  // "L,R", each a whole number >= -1
    const std::string& w = o.window;
    const size_t comma = w.find(',');
    int64_t lr[2] = {0, 0};
    bool ok = comma != std::string::npos;
    for (int k = 0; ok && k < 2; ++k) {
      const char* first = w.data() + (k == 0 ? 0 : comma + 1);
      const char* last = w.data() + (k == 0 ? comma : w.size());
      const auto [stop, error] = std::from_chars(first, last, lr[k]);
      ok = error == std::errc() && stop == last && first != last;
    }
    if (!ok) throw std::invalid_argument("--window: expected L,R, two whole numbers (-1: unbounded), got '" + w + "'");
    p.window_left = lr[0];
    p.window_right = lr[1];
  }
  if (!o.cache_seqlens.empty()) {  // their count and range are Problem::validate's
    const std::vector<int32_t> lens = parse_whole_numbers(o.cache_seqlens, "--cache-seqlens", "lengths", "64,5,0");
    p.cache_seqlens.assign(lens.begin(), lens.end());
  }
  if (o.softcap) {  // 0 would mean "no cap" inside a Problem; on the command line, no cap is no --softcap
    if (!(*o.softcap > 0.0f && std::isfinite(*o.softcap)))
      throw std::invalid_argument("--softcap: the cap must be a positive finite number (got " + float_str(*o.softcap) +
                                  "); for no cap, drop --softcap");
    p.softcap = *o.softcap;
  }
}

Inputs prepare_inputs(CommonOptions& o, const BeforeInputs& before_inputs) {
  Problem& p = o.problem;
  resolve_dtype_and_modifiers(o);
  if (o.input_pos && !p.causal && !p.has_window() && !p.alibi)
    throw std::invalid_argument("--input-pos places the causal mask (and the window and ALiBi's diagonal): add "
                                "--causal, or drop --input-pos");
  Inputs in;
  if (!o.inputs_dir.empty()) {
    if (const std::string given = shape_flags_given(o); !given.empty())
      throw std::invalid_argument("the shape comes from the files in --inputs: drop " + given);
    if (o.seed && p.dropout == 0)
      throw std::invalid_argument("--seed seeds the random inputs and the dropout mask: with --inputs and no "
                                  "--dropout it has nothing to seed; drop --seed");
    in.q = load_input(o.inputs_dir, "q.npy", p.dtype);
    in.k = load_input(o.inputs_dir, "k.npy", p.dtype);
    in.v = load_input(o.inputs_dir, "v.npy", p.dtype);
    if (in.k.shape != in.v.shape)
      throw std::invalid_argument("k.npy " + shape_str(in.k.shape) + " and v.npy " + shape_str(in.v.shape) +
                                  " must have the same shape");
    if (in.q.shape[0] != in.k.shape[0] || in.q.shape[3] != in.k.shape[3])
      throw std::invalid_argument("q.npy " + shape_str(in.q.shape) + " and k.npy " + shape_str(in.k.shape) +
                                  " must agree in batch (dim 0) and head dim (dim 3)");
    p.B = in.q.shape[0];
    p.Hq = in.q.shape[1];
    p.Nq = in.q.shape[2];
    p.d = in.q.shape[3];
    p.Hkv = in.k.shape[1];
    p.Nk = in.k.shape[2];
    if (p.backward) {
      in.dout = load_input(o.inputs_dir, "do.npy", p.dtype);
      if (in.dout.shape != in.q.shape)
        throw std::invalid_argument("do.npy " + shape_str(in.dout.shape) + " must have q.npy's shape " +
                                    shape_str(in.q.shape));
    }
    if (p.Hkv > 0 && p.Hq % p.Hkv != 0)
      throw std::invalid_argument("q.npy has " + std::to_string(p.Hq) + " heads, not a multiple of k.npy's " +
                                  std::to_string(p.Hkv));
  } else {
    if (o.seq && o.seq_q && o.seq_k)
      throw std::invalid_argument("--seq sets Nq and Nk where --seq-q or --seq-k does not: beside both, it sets "
                                  "nothing; drop --seq");
    p.B = o.batch.value_or(p.B);
    p.Hq = o.heads.value_or(p.Hq);
    p.d = o.dim.value_or(p.d);
    p.Hkv = o.kv_heads.value_or(p.Hq);
    p.Nq = o.seq_q.value_or(o.seq.value_or(1024));
    p.Nk = o.seq_k.value_or(o.seq.value_or(1024));
  }
  p.input_pos = o.input_pos.value_or(p.Nk - p.Nq);
  p.scale = o.scale.value_or(p.d > 0 ? float(1.0 / std::sqrt(double(p.d))) : 1.0f);
  p.validate();
  if (!o.bias_file.empty()) in.bias = load_bias(o.bias_file, p);
  p.bias = !o.bias_file.empty();
  if (!o.alibi_slopes_file.empty()) {
    if (!p.alibi) throw std::invalid_argument("--alibi-slopes gives ALiBi's slopes: add --alibi, or drop --alibi-slopes");
    in.alibi_slopes = load_slopes(o.alibi_slopes_file, p);
  }
  const double to_draw = o.inputs_dir.empty() ? input_elements(p) * sizeof(float) : 0.0;
  if (before_inputs) before_inputs(p, to_draw);
  if (o.inputs_dir.empty()) {
    require_host_memory(to_draw, "the random inputs");
    Tensor bias = std::move(in.bias), slopes = std::move(in.alibi_slopes);
    in = random_inputs(p);
    in.bias = std::move(bias);
    in.alibi_slopes = std::move(slopes);
  }
  return in;
}

void require_memory_for(const Stage& s, const Oracle& oracle, const Problem& p, const std::string& variant,
                        bool check, double input_bytes) {
  // A stage that does not count its own buffers holds at least its outputs; outputs() hands a copy back.
  const double run = (s.host_bytes ? s.host_bytes(p, variant) : output_elements(p) * sizeof(float)) +
                     output_elements(p) * sizeof(float);
  const double reference = check && oracle.host_bytes ? oracle.host_bytes(p) : 0.0;
  std::string parts;  // what the total is made of, when it is more than the run
  if (input_bytes > 0) parts += "the inputs " + memory_str(input_bytes) + ", ";
  if (!parts.empty() || reference > 0) parts += "the run " + memory_str(run);
  if (reference > 0) parts += ", step 1's fp64 reference " + memory_str(reference);
  const std::string what = s.name + (variant.empty() ? "" : " --variant " + variant) + " on this problem" +
                           (reference > 0 ? " with --check" : "") + (parts.empty() ? "" : " (" + parts + ")");
  require_host_memory(input_bytes + run + reference, what);
}

// ---- how long a CPU run will take ----------------------------------------------------------------

// Above this, a CPU run says how long it will take before it starts.
constexpr double kAnnounceSeconds = 5;

// The problem a CPU stage's rate is measured on: p's kind (dtype, mask, modifiers, dropout, backward) at a
// size that runs in a fraction of a second, with a few heads to keep the threads busy. No bias: the small
// problem has no bias tensor, and a bias costs one addition per score.
static Problem small_problem_like(const Problem& p) {
  Problem q = p;
  q.B = 1;
  q.Hkv = std::min<int64_t>(p.Hkv, 4);
  q.Hq = q.Hkv * std::min<int64_t>(p.group(), 4);
  q.Nq = std::min<int64_t>(p.Nq, 256);
  q.Nk = std::min<int64_t>(p.Nk, 1024);
  q.input_pos = q.Nk - q.Nq;
  q.bias = false;
  q.splits = 0;
  q.cache_seqlens.clear();  // the estimate's problem has one sequence, holding its keys
  q.page_size = 0;
  return q;
}

static double dense_work(const Problem& p) { return double(p.B) * double(p.Hq) * double(p.Nq) * double(p.Nk) * double(p.d); }

static std::string duration_str(double seconds) {
  char buf[32];
  if (seconds < 90) std::snprintf(buf, sizeof buf, "%.0f s", seconds);
  else if (seconds < 90 * 60) std::snprintf(buf, sizeof buf, "%.0f min", seconds / 60);
  else std::snprintf(buf, sizeof buf, "%.1f h", seconds / 3600);
  return buf;
}

void announce_long_cpu_run(const Stage& s, const Oracle& oracle, const Problem& p,
                           const std::vector<std::string>& variants, const CommonOptions& o) {
  if (s.gpu() || variants.empty()) return;
  const Problem q = small_problem_like(p);
  // A problem not much larger than the small one runs about as quickly as measuring it would.
  if (dense_work(p) < 16 * dense_work(q)) return;
  // How often a run does each pass: once, and with --bench a warm-up, one timed run and at least three more
  // (eval.cpp's time_runner), three rounds of them with --bench-against, for each of the two variants.
  const int bench_runs = o.bench ? 5 * (o.bench_against.empty() ? 1 : 6) : 0;
  const double fwd_runs = 1 + bench_runs + (o.bench && p.backward ? bench_runs / 5 : 0);
  const double bwd_runs = p.backward ? 1 + bench_runs : 0;
  using clock = std::chrono::steady_clock;
  auto seconds_since = [](clock::time_point t0) { return std::chrono::duration<double>(clock::now() - t0).count(); };
  const Inputs in = random_inputs(q);
  // The stage's time scales with its FLOPs (a stage that skips masked tiles skips them in both); step 1's
  // fp64 reference materialises every score, so its time scales with the dense work.
  const double flop_ratio = p.flops_forward() / q.flops_forward(), dense_ratio = dense_work(p) / dense_work(q);
  double run_s = 0, check_s = 0;
  for (const std::string& v : variants) {
    const auto runner = s.make(q, in, v);
    auto t0 = clock::now();
    runner->run();
    run_s += fwd_runs * seconds_since(t0) * flop_ratio;
    if (p.backward) {
      t0 = clock::now();
      runner->run_backward();
      run_s += bwd_runs * seconds_since(t0) * flop_ratio;
    }
    if (o.check) {
      t0 = clock::now();
      (void)oracle.exact(q, in);
      (void)oracle.naive_low_precision(q, in);
      check_s += seconds_since(t0) * dense_ratio;
    }
  }
  if (run_s + check_s <= kAnnounceSeconds) return;
  const double flops = fwd_runs * p.flops_forward() + bwd_runs * p.flops_backward();
  char rate[64];
  std::snprintf(rate, sizeof rate, "%.1f GFLOP/s", double(variants.size()) * flops / run_s * 1e-9);
  const std::string who = s.name + (variants.size() > 1 ? " (" + std::to_string(variants.size()) + " variants)"
                                                        : variants[0].empty() ? "" : " --variant " + variants[0]);
  std::printf("%s: this will take about %s on this CPU (the run %s at %s%s; measured on Nq %lld x Nk %lld of the "
              "same kind); Ctrl-C stops it\n",
              who.c_str(), duration_str(run_s + check_s).c_str(), duration_str(run_s).c_str(), rate,
              check_s > 0 ? (", step 1's fp64 check " + duration_str(check_s)).c_str() : "", (long long)q.Nq,
              (long long)q.Nk);
  std::fflush(stdout);
}

static void print_check(const CheckReport& r) {
  std::printf("  %-4s %12s %12s %12s %12s  %s\n", "out", "max_abs", "rel_l2", "naive_lowp", "tolerance", "verdict");
  for (int k = 0; k < r.n; ++k) {
    const auto& e = r.stage[k];
    std::printf("  %-4s %12.3e %12.3e %12.3e %12.3e  %s", CheckReport::name(k), e.max_abs, e.rel_l2,
                r.baseline[k].max_abs, r.verdict[k].tolerance, r.verdict[k].pass ? "pass" : "FAIL");
    if (!e.ok_shape) std::printf(" (wrong shape)");
    if (e.unwritten) std::printf(" (%zu elements unwritten: still the poison)", e.unwritten);
    if (e.nan) std::printf(" (%zu NaN computed)", e.nan);
    if (e.ref_nan) std::printf(" (%zu NaN in the fp64 reference)", e.ref_nan);
    if (e.mismatched_inf) std::printf(" (%zu infinities differ)", e.mismatched_inf);
    std::printf("\n");
  }
}

// Appends one record to --json FILE as one whole line or not at all. The line is built in memory and written
// with O_APPEND, every byte checked; when a write or the close fails (a full disk), the file is truncated
// back to its size before (or removed, if this run created it), so that a reader of the records never meets
// a half line, and the error names the file and says what was left.
static void append_json(const std::string& file, const nlohmann::json& rec) {
  const std::string line = rec.dump() + "\n";
  struct stat before;
  const bool existed = stat(file.c_str(), &before) == 0;
  const int fd = ::open(file.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) throw std::runtime_error("--json: cannot append to " + file + ": " + std::strerror(errno));
  std::string why;
  for (size_t done = 0; done < line.size() && why.empty();) {
    const ssize_t n = ::write(fd, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) why = n < 0 ? std::strerror(errno) : "the write made no progress";
    else done += size_t(n);
  }
  if (::close(fd) != 0 && why.empty()) why = std::strerror(errno);
  if (why.empty()) return;
  std::string left;  // what the failed append left of the file
  if (!existed) left = std::remove(file.c_str()) == 0 ? "no file was created" : file + " may hold a partial line";
  else if (!S_ISREG(before.st_mode)) left = "nothing to restore (not a regular file)";
  else if (::truncate(file.c_str(), before.st_size) == 0) left = file + " is as it was";
  else left = file + " may end in a partial line (" + std::strerror(errno) + ")";
  throw std::runtime_error("--json: cannot append to " + file + ": " + why + "; " + left);
}

// Does row i of head (b, h) see any key? The mask (causal, window) leaves a band of keys per row; a -inf
// bias can mask the rest. A row that sees none has LSE = -inf (and O = 0) by the convention.
static bool row_sees_a_key(const Problem& p, const Inputs& in, int64_t b, int64_t h, int64_t i) {
  int64_t lo, hi;
  ScoreMod m = score_mod_of(p);
  m.input_pos = p.kv_input_pos(b);  // a KV cache's sequence b: its own keys, its own diagonal
  visible_range(m, p.kv_len(b), i, &lo, &hi);
  if (lo > hi) return false;
  if (!p.bias || in.bias.empty()) return true;
  const std::vector<int64_t>& bs = in.bias.shape;  // [B or 1, Hq or 1, Nq, Nk]
  const float* row = in.bias.data.data() + size_t(((bs[0] == 1 ? 0 : b) * bs[1] + (bs[1] == 1 ? 0 : h)) * bs[2] + i) * size_t(bs[3]);
  for (int64_t j = lo; j <= hi; ++j)
    if (row[j] != -std::numeric_limits<float>::infinity()) return true;
  return false;
}

std::string nonfinite_outputs(const Problem& p, const Inputs& in, const Outputs& out) {
  const std::pair<const char*, const Tensor*> all[] = {{"O", &out.o},   {"LSE", &out.lse}, {"dQ", &out.dq},
                                                       {"dK", &out.dk}, {"dV", &out.dv},   {"dBias", &out.dbias}};
  const int n = p.backward ? (p.bias ? 6 : 5) : 2;
  std::string said;
  for (int k = 0; k < n; ++k) {
    const Tensor& t = *all[k].second;
    const bool lse = k == 1;
    size_t nan = 0, inf = 0, first = t.size();
    for (size_t e = 0; e < t.size(); ++e) {
      const float x = t.data[e];
      bool bad = std::isnan(x) || (std::isinf(x) && !lse);
      if (lse && std::isinf(x)) {  // -inf only where the row sees no key; +inf never
        const int64_t i = int64_t(e % size_t(p.Nq)), bh = int64_t(e / size_t(p.Nq));
        bad = x > 0 || row_sees_a_key(p, in, bh / p.Hq, bh % p.Hq, i);
      }
      if (!bad) continue;
      (std::isnan(x) ? nan : inf) += 1;
      first = std::min(first, e);
    }
    if (nan + inf == 0) continue;
    std::string counts = nan ? std::to_string(nan) + " NaN" : "";
    if (inf) counts += (nan ? " and " : "") + std::to_string(inf) + (lse ? " infinite (in rows that see keys)" : " infinite");
    said += (said.empty() ? "" : ", ") + std::string(all[k].first) + " holds " + counts + " of " +
            std::to_string(t.size()) + " (the first at " + index_str(t.shape, first) + ")";
  }
  if (said.empty()) return "";
  // The likely cause, when the inputs can make one: a score q.k beyond float32's range.
  float q_max = 0, k_max = 0;
  for (const float x : in.q.data) q_max = std::max(q_max, std::abs(x));
  for (const float x : in.k.data) k_max = std::max(k_max, std::abs(x));
  const double bound = double(p.scale) * double(q_max) * double(k_max) * double(p.d);
  char why[160] = "";
  if (bound > double(std::numeric_limits<float>::max()) / 16)  // sums and exp differences overflow before the max
    std::snprintf(why, sizeof why, "; |scale * q.k| can reach %.1e here, beyond float32's %.1e: scale the inputs down",
                  bound, double(std::numeric_limits<float>::max()));
  return said + why;
}

constexpr int64_t kMaxDumpedMask = int64_t(1) << 26;

static std::vector<uint8_t> dropout_mask(const Problem& p) {
  const DropoutParams dp = make_dropout(p.dropout, p.seed);
  std::vector<uint8_t> m(size_t(p.B * p.Hq * p.Nq * p.Nk));
  size_t k = 0;
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.Hq; ++h)
      for (int64_t i = 0; i < p.Nq; ++i)
        for (int64_t j = 0; j < p.Nk; ++j) m[k++] = dropout_keep(dp, uint32_t(b), uint32_t(h), uint32_t(i), uint32_t(j));
  return m;
}

// --list-variants: the variants (--variant NAME, the first the default), then the named configurations.
static void print_variants(const Stage& s) {
  if (s.variants.empty() && s.tuning_variants.empty()) std::printf("(%s has no variants)\n", s.name.c_str());
  if (!s.variants.empty()) std::printf("variants (--variant NAME; the first is the default):\n");
  for (const std::string& v : s.variants) std::printf("  %s\n", v.c_str());
  if (!s.tuning_variants.empty()) std::printf("configurations (--variant NAME; step 6 tunes over them):\n");
  for (const std::string& v : s.tuning_variants) std::printf("  %s\n", v.c_str());
}

// What a run computed, for a run with neither --check nor --bench: each output's shape, the sum of its
// elements (a checksum: two runs that agree print the same) and its first values.
static void print_outputs(const Outputs& out, bool backward) {
  const std::pair<const char*, const Tensor*> outputs[] = {
      {"O", &out.o}, {"LSE", &out.lse}, {"dQ", &out.dq}, {"dK", &out.dk}, {"dV", &out.dv}};
  for (int k = 0; k < (backward ? 5 : 2); ++k) {
    const Tensor& t = *outputs[k].second;
    double sum = 0;
    for (const float x : t.data) sum += x;
    std::printf("  %-4s %-18s sum %14.6e   first", outputs[k].first, shape_str(t.shape).c_str(), sum);
    for (size_t i = 0; i < std::min<size_t>(4, t.size()); ++i) std::printf(" %9.5f", t.data[i]);
    std::printf("\n");
  }
  if (backward && !out.dbias.empty()) {
    double sum = 0;
    for (const float x : out.dbias.data) sum += x;
    std::printf("  %-4s %-18s sum %14.6e\n", "dBias", shape_str(out.dbias.shape).c_str(), sum);
  }
}

int run_stage(const Stage& s, const Oracle& oracle, CommonOptions& o) {
  if (o.list_variants) {
    print_variants(s);
    return 0;
  }
  check_common_flags(s, o);
  std::string variant = o.variant.empty() ? (s.variants.empty() ? "" : s.variants[0]) : o.variant;
  if (o.varlen()) return run_varlen(s, oracle, o, {variant});
  // What cannot run is refused, and a long run announced, before the inputs take their memory and time.
  Inputs in = prepare_inputs(o, [&](const Problem& p, double input_bytes) {
    if (const std::string why = s.unsupported(p, variant); !why.empty())
      throw std::invalid_argument(s.name + " cannot run this problem: " + why);
    if (s.platform)
      if (const std::string why = s.platform->unavailable_reason(); !why.empty())
        throw std::runtime_error(s.name + " needs a CUDA GPU: " + why);
    // Before tuning, which takes a while: the stages with configurations run on a GPU, and what they need of
    // the host does not depend on the configuration.
    require_memory_for(s, oracle, p, variant, o.check, input_bytes);
    announce_long_cpu_run(s, oracle, p, {variant}, o);
  });
  Problem& p = o.problem;
  if (o.tuned) variant = o.tuner(s, p);
  std::printf("%s%s%s: %s\n", s.name.c_str(), variant.empty() ? "" : " --variant ", variant.c_str(),
              p.describe().c_str());
  auto runner = s.make(p, in, variant);
  const auto start = std::chrono::steady_clock::now();
  runner->run();
  if (p.backward) runner->run_backward();
  const Outputs out = runner->outputs();
  const double run_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  const std::string nonfinite = nonfinite_outputs(p, in, out);
  if (!o.check && !o.bench) {
    print_outputs(out, p.backward);
    std::printf("  one run, not warmed up: %.3f ms\n", run_ms);
    std::printf("add --check to compare with step 1 in fp64, --bench to time warmed-up runs\n");
  }

  int rc = 0;
  nlohmann::json rec = {{"stage", s.name},     {"variant", variant},       {"B", p.B},
                        {"Hq", p.Hq},          {"Hkv", p.Hkv},             {"Nq", p.Nq},
                        {"Nk", p.Nk},          {"d", p.d},                 {"causal", p.causal},
                        {"input_pos", p.input_pos}, {"scale", p.scale},    {"dtype", dtype_name(p.dtype)},
                        {"dropout", p.dropout}, {"seed", p.seed},          {"backward", p.backward},
                        {"device", device_name(s)}, {"cuda", runtime_version(s)}, {"git", git_revision()}};
  if (s.config_of && s.platform)  // the configuration the variant ran on this GPU ("Br128-Bc128-W8-S2")
    rec["config"] = s.config_of(p, variant, s.platform->compute_capability_major());
  if (o.check) {
    const CheckReport r = check_against(oracle, p, in, out);
    std::printf("check against step 1 (fp64), rule: max_abs <= 2 * naive_lowp + 1e-5 * max(1, |ref|)\n");
    print_check(r);
    for (int k = 0; k < r.n; ++k) rec["err_" + std::string(CheckReport::name(k))] = r.stage[k].max_abs;
    rec["pass"] = r.pass;
    if (!r.pass) rc = 1;
  }
  if (o.bench) {
    const double unit = s.gpu() ? 1e12 : 1e9;
    const char* uname = s.gpu() ? "TFLOP/s" : "GFLOP/s";
    auto report = [&](const char* what, const Timing& t, nlohmann::json& into) {
      std::printf("%sforward:  %10.3f ms  %8.2f %s\n", what, t.fwd_ms, p.flops_forward() / (t.fwd_ms * 1e-3) / unit, uname);
      into["fwd_ms"] = t.fwd_ms;
      into["fwd_tflops"] = p.flops_forward() / (t.fwd_ms * 1e-3) / 1e12;
      if (!p.backward) return;
      std::printf("%sbackward: %10.3f ms  %8.2f %s\n", what, t.bwd_ms, p.flops_backward() / (t.bwd_ms * 1e-3) / unit, uname);
      into["bwd_ms"] = t.bwd_ms;
      into["bwd_tflops"] = p.flops_backward() / (t.bwd_ms * 1e-3) / 1e12;
    };
    if (o.bench_against.empty()) {
      report("", time_runner(*runner, s, p.backward), rec);
    } else {
      // The two variants on the same inputs, timed in alternating rounds (A B, B A, A B), so that clock and
      // thermal drift falls on both alike; each side's time is the median of its round medians. Only one
      // runner exists at a time: measured on the H100, where the device buffers sit changes a kernel's
      // time by up to 6% (a second runner allocated beside the first was slower running the same kernel),
      // and a runner built after the last one was freed can reuse its memory.
      runner.reset();
      constexpr int kRounds = 3;
      std::vector<double> fa, ba, fb, bb;
      auto time_one = [&](const std::string& v, std::vector<double>& f, std::vector<double>& b) {
        const auto one = s.make(p, in, v);
        const Timing t = time_runner(*one, s, p.backward);
        f.push_back(t.fwd_ms), b.push_back(t.bwd_ms);
      };
      for (int r = 0; r < kRounds; ++r) {
        if (r % 2 == 0) time_one(variant, fa, ba), time_one(o.bench_against, fb, bb);
        else time_one(o.bench_against, fb, bb), time_one(variant, fa, ba);
      }
      report("", {median(fa), median(ba), kRounds}, rec);
      nlohmann::json against = {{"variant", o.bench_against}};
      report(("against " + o.bench_against + ": ").c_str(), {median(fb), median(bb), kRounds}, against);
      rec["rounds_fwd_ms"] = fa, against["rounds_fwd_ms"] = fb;
      if (p.backward) rec["rounds_bwd_ms"] = ba, against["rounds_bwd_ms"] = bb;
      rec["against"] = against;
    }
  }
  // The score modifiers, only when on: records without them stay as they were.
  if (p.bias) rec["bias"] = o.bias_file;
  if (p.alibi) rec["alibi"] = o.alibi_slopes_file.empty() ? std::string("standard") : o.alibi_slopes_file;
  if (p.softcap > 0) rec["softcap"] = p.softcap;
  if (p.has_window()) rec["window"] = {p.window_left, p.window_right};
  if (!p.cache_seqlens.empty()) rec["cache_seqlens"] = p.cache_seqlens;
  if (p.page_size > 0) rec["page_size"] = p.page_size;
  if (!nonfinite.empty()) rec["nonfinite"] = true;
  for (const auto& [k, v] : o.record_extra) rec[k] = v;
  if (!o.dump_dir.empty()) {
    AtomicFileSet files;
    const std::string dir = o.dump_dir + "/";
    files.add_f32(dir + "o.npy", out.o);
    files.add_f32(dir + "lse.npy", out.lse);
    if (p.backward) {
      files.add_f32(dir + "dq.npy", out.dq);
      files.add_f32(dir + "dk.npy", out.dk);
      files.add_f32(dir + "dv.npy", out.dv);
      if (p.bias) files.add_f32(dir + "dbias.npy", out.dbias);
    }
    // The mask is one byte per score: written up to 2^26 of them (64 MiB), and said so when left out.
    const bool mask_fits = p.B * p.Hq * p.Nq * p.Nk <= kMaxDumpedMask;
    if (p.dropout > 0 && mask_fits) files.add_u8(dir + "dropout_mask.npy", {p.B, p.Hq, p.Nq, p.Nk}, dropout_mask(p));
    files.commit();
    std::printf("wrote %s{o,lse%s%s%s}.npy\n", dir.c_str(), p.backward ? ",dq,dk,dv" : "",
                p.backward && p.bias ? ",dbias" : "",
                p.dropout > 0 && mask_fits ? ",dropout_mask" : "");
    if (p.dropout > 0 && !mask_fits)
      std::printf("dropout_mask.npy not written: B * Hq * Nq * Nk = %lld bytes > %lld\n",
                  (long long)(p.B * p.Hq * p.Nq * p.Nk), (long long)kMaxDumpedMask);
  }
  if (!o.json_file.empty()) append_json(o.json_file, rec);
  // Last, so that the dump and the record (which say so) are there to look at.
  if (!nonfinite.empty()) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: error: the outputs are not finite: %s\n", s.name.c_str(), nonfinite.c_str());
    return kExitNonFinite;
  }
  return rc;
}

// ---- a packed variable-length batch (core/varlen.h) ----------------------------------------------------

// "" when the packed outputs are finite (LSE may be -inf in a row that sees no key), else what is not.
static std::string varlen_nonfinite(const Problem& p, const Varlen& v, const Outputs& out) {
  const std::pair<const char*, const Tensor*> all[] = {
      {"O", &out.o}, {"LSE", &out.lse}, {"dQ", &out.dq}, {"dK", &out.dk}, {"dV", &out.dv}};
  std::string said;
  for (int k = 0; k < (p.backward ? 5 : 2); ++k) {
    const Tensor& t = *all[k].second;
    size_t bad = 0, first = t.size();
    for (size_t e = 0; e < t.size(); ++e) {
      const float x = t.data[e];
      const bool ok = std::isfinite(x) ||
                      (k == 1 && x < 0 && std::isinf(x) && !packed_row_sees_a_key(p, v, int64_t(e % size_t(v.total_q()))));
      if (!ok) ++bad, first = std::min(first, e);
    }
    if (bad)
      said += (said.empty() ? "" : ", ") + std::string(all[k].first) + " holds " + std::to_string(bad) +
              " non-finite of " + std::to_string(t.size()) + " (the first at " + index_str(t.shape, first) + ")";
  }
  return said;
}

int run_varlen(const Stage& s, const Oracle& oracle, CommonOptions& o, const std::vector<std::string>& variants) {
  check_common_flags(s, o);
  if (!s.has_varlen)
    throw std::invalid_argument(s.name + " has no varlen path (--cu-seqlens-q, --cu-seqlens-k): steps 1, 2, 4, 5 and 7 have");
  if (o.cu_seqlens_q.empty() || o.cu_seqlens_k.empty())
    throw std::invalid_argument("a packed batch needs both --cu-seqlens-q and --cu-seqlens-k (as many offsets each)");
  Problem& p = o.problem;
  {  // the flags a varlen run does not take, named as given, with the reason
    const std::pair<bool, const char*> refused[] = {
        {o.batch || o.seq || o.seq_q || o.seq_k, "--batch, --seq, --seq-q and --seq-k: the lengths come from the lists"},
        {o.input_pos.has_value(), "--input-pos: causal is bottom-right in each sequence (input_pos = Lk - Lq)"},
        {!o.bias_file.empty(), "--bias: a dense [B, Hq, Nq, Nk] bias has no shape for ragged sequences (ALiBi, "
                               "--window and --softcap are taken)"},
        {p.dropout > 0, "--dropout: the mask's batch coordinate in a packed batch is not defined yet"},
        {p.splits > 0, "--splits: each sequence runs whole"},
        {!o.cache_seqlens.empty() || p.page_size > 0, "--cache-seqlens and --page-size: cu-seqlens-k gives the keys"},
        {!o.inputs_dir.empty(), "--inputs: the packed inputs are drawn at random"},
        {!o.dump_dir.empty() || !o.json_file.empty(), "--dump and --json: a packed run prints its outputs"},
        {!o.bench_against.empty() || o.tuned, "--bench-against and --tuned"}};
    for (const auto& [given, what] : refused)
      if (given) throw std::invalid_argument(std::string("a packed batch (--cu-seqlens-q/-k) does not take ") + what);
  }
  resolve_dtype_and_modifiers(o);
  const Varlen v = make_varlen(parse_cu_seqlens(o.cu_seqlens_q, "--cu-seqlens-q"),
                               parse_cu_seqlens(o.cu_seqlens_k, "--cu-seqlens-k"));
  p.B = v.batch();
  p.Hq = o.heads.value_or(p.Hq);
  p.Hkv = o.kv_heads.value_or(p.Hq);
  p.d = o.dim.value_or(p.d);
  p.Nq = v.max_seqlen_q;  // the problem as a kernel's grid would see it; each sequence has its own
  p.Nk = v.max_seqlen_k;
  p.input_pos = p.Nk - p.Nq;
  p.scale = o.scale.value_or(p.d > 0 ? float(1.0 / std::sqrt(double(p.d))) : 1.0f);
  validate_varlen_problem(p, v);
  Inputs in;
  if (!o.alibi_slopes_file.empty()) {
    if (!p.alibi) throw std::invalid_argument("--alibi-slopes gives ALiBi's slopes: add --alibi, or drop --alibi-slopes");
    in.alibi_slopes = load_slopes(o.alibi_slopes_file, p);
  }
  std::vector<std::string> run;  // of several variants, those that run the problem
  for (const std::string& variant : variants) {
    const std::string why = s.unsupported(p, variant);
    if (variants.size() > 1 && !why.empty()) continue;
    if (!why.empty()) throw std::invalid_argument(s.name + " cannot run this problem: " + why);
    run.push_back(variant);
  }
  if (run.empty()) throw std::invalid_argument(s.name + " has no variant that runs this problem");
  // The sequences run one after the other: the largest decides the working memory.
  double most = 0;
  int64_t largest = -1;
  for (int64_t b = 0; b < v.batch(); ++b)
    if (sequence_has_work(v, b) && double(v.len_q(b)) * double(v.len_k(b)) > most)
      most = double(v.len_q(b)) * double(v.len_k(b)), largest = b;
  Problem packed_size = p;  // the packed inputs and outputs, as a problem of one sequence of the totals
  packed_size.B = 1, packed_size.Nq = std::max<int64_t>(1, v.total_q()), packed_size.Nk = std::max<int64_t>(1, v.total_k());
  const double packed_bytes = (input_elements(packed_size) + 2 * output_elements(packed_size)) * sizeof(float);
  if (largest >= 0)
    for (const std::string& variant : run)
      require_memory_for(s, oracle, sequence_problem(p, v, largest), variant, o.check, packed_bytes);
  in = [&] {
    Inputs drawn = random_packed_inputs(p, v);
    drawn.alibi_slopes = std::move(in.alibi_slopes);
    return drawn;
  }();
  const Oracle packed_oracle = varlen_oracle(oracle, v);
  const double flops = varlen_flops_forward(p, v);
  int rc = 0;
  std::string nonfinite;
  // One variant: the full report. Several: one line each, as step 2's table of every variant.
  const bool table = run.size() > 1;
  const std::string one = table || run[0].empty() ? "" : " --variant " + run[0];
  std::printf("%s%s: varlen %s Hq=%lld Hkv=%lld d=%lld %s%s scale=%s%s%s%s%s\n", s.name.c_str(), one.c_str(),
              v.describe().c_str(), (long long)p.Hq, (long long)p.Hkv, (long long)p.d, dtype_name(p.dtype),
              p.causal ? " causal (bottom-right per sequence)" : "", float_str(p.scale).c_str(),
              p.has_window() ? (" window=" + std::to_string(p.window_left) + "," + std::to_string(p.window_right)).c_str() : "",
              p.alibi ? " +alibi" : "", p.softcap > 0 ? (" softcap=" + float_str(p.softcap)).c_str() : "",
              p.backward ? " +backward" : "");
  const int n = p.backward ? 5 : 2;  // O, LSE (, dQ, dK, dV)
  if (table) {
    std::printf("%-8s", "variant");
    for (int k = 0; k < n; ++k) std::printf(" %12s", ("max|" + std::string(CheckReport::name(k)) + "| err").c_str());
    std::printf(" %6s%s%s\n", "check", o.bench ? "   fwd [ms]" : "", o.bench && p.backward ? "   bwd [ms]" : "");
  }
  for (const std::string& variant : run) {
    if (table) std::printf("%-8s", variant.c_str());
    std::fflush(stdout);
    auto runner = make_varlen_runner(s, p, v, in, variant);
    const auto start = std::chrono::steady_clock::now();
    runner->run();
    if (p.backward) runner->run_backward();
    const Outputs out = runner->outputs();
    const double run_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (const std::string why = varlen_nonfinite(p, v, out); !why.empty() && nonfinite.empty())
      nonfinite = (variant.empty() ? "" : variant + ": ") + why;
    if (table) {  // the errors (or dashes), the verdict, the time
      CheckReport r;
      if (o.check) r = check_against(packed_oracle, p, in, out);
      for (int k = 0; k < n; ++k)
        if (o.check) std::printf(" %12.3e", r.stage[k].max_abs);
        else std::printf(" %12s", "-");
      std::printf(" %6s", o.check ? (r.pass ? "pass" : "FAIL") : "-");
      if (o.check && !r.pass) rc = 1;
      if (o.bench) {
        const Timing t = time_runner(*runner, s, p.backward);
        std::printf(" %10.3f", t.fwd_ms);
        if (p.backward) std::printf(" %10.3f", t.bwd_ms);
      }
      std::printf("\n");
      continue;
    }
    if (!o.check && !o.bench) {
      print_outputs(out, p.backward);
      std::printf("  one run, not warmed up: %.3f ms\n", run_ms);
    }
    if (o.check) {
      const CheckReport r = check_against(packed_oracle, p, in, out);
      std::printf("check against step 1 (fp64) run sequence by sequence, rule: max_abs <= 2 * naive_lowp + 1e-5 * "
                  "max(1, |ref|)\n");
      print_check(r);
      if (!r.pass) rc = 1;
    }
    if (o.bench) {
      const Timing t = time_runner(*runner, s, p.backward);
      const double unit = s.gpu() ? 1e12 : 1e9;
      const char* uname = s.gpu() ? "TFLOP/s" : "GFLOP/s";
      std::printf("forward:  %10.3f ms  %8.2f %s\n", t.fwd_ms, flops / (t.fwd_ms * 1e-3) / unit, uname);
      if (p.backward) std::printf("backward: %10.3f ms  %8.2f %s\n", t.bwd_ms, 2.5 * flops / (t.bwd_ms * 1e-3) / unit, uname);
    }
  }
  if (table && o.check)
    std::printf("errors against step 1 in fp64, run sequence by sequence; check: max_abs <= 2 * (step 1 in %s) + "
                "1e-5 * max(1, |ref|)\n", dtype_name(p.dtype));
  if (!o.check && !o.bench)
    std::printf("add --check to compare with step 1 in fp64 (sequence by sequence), --bench to time warmed-up runs\n");
  if (!nonfinite.empty()) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: error: the outputs are not finite: %s\n", s.name.c_str(), nonfinite.c_str());
    return kExitNonFinite;
  }
  return rc;
}

int report_error(const std::string& program) {
  std::string what;
  try {
    throw;
  } catch (const std::bad_alloc&) {
    what = "out of memory: a buffer of this run could not be allocated; a smaller problem would fit";
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
    what = "an exception of unknown type";
  }
  std::fflush(stdout);  // what the run printed so far comes first
  std::fprintf(stderr, "%s: error: %s\n", program.c_str(), what.c_str());
  return 2;
}

int stage_main(const Stage& s, const Oracle& oracle, int argc, char** argv) {
  CLI::App app{s.name + ": " + s.title};
  CommonOptions o;
  add_common_options(app, o);
  if (const std::optional<int> rc = parse_command_line(app, argc, argv, s.name)) return *rc;
  try {
    check_command_line(app, o);
    return run_stage(s, oracle, o);
  } catch (...) {
    return report_error(s.name);
  }
}

}  // namespace fa
