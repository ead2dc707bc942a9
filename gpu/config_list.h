// FlashAttention, step by step — gpu/config_list.h
// A compile-time list of kernel configurations, each selectable by name at run time, so that comparing
// tile sizes never means editing source. A configuration is a traits type with a static name() (steps 4
// and 5 define theirs); one list per stage feeds its instances (every kernel of the list is compiled),
// its names (--variant, --list-variants, step 6's tuner) and its launch shapes.
#pragma once
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "core/problem.h"
#include "gpu/gpu_types.h"

namespace fa {

template <class... Cfg>
struct ConfigList {};

// ConfigList<A..., More...>: a list extended by the configurations one head dim adds.
template <class List, class... More>
struct Append;
template <class... Cfg, class... More>
struct Append<ConfigList<Cfg...>, More...> {
  using type = ConfigList<Cfg..., More...>;
};

template <class... Cfg>
std::vector<std::string> config_names(ConfigList<Cfg...>) {
  return {Cfg::name()...};
}

// The names of the list's configurations compiled with the score modifiers (their traits' kHasMods): what
// a stage declares takes them (core/stage.h, Supports::score_mods).
template <class... Cfg>
std::vector<std::string> config_names_with_mods(ConfigList<Cfg...>) {
  std::vector<std::string> names;
  ((Cfg::kHasMods ? names.push_back(Cfg::name()) : void()), ...);
  return names;
}

// Calls f(std::type_identity<Cfg>{}) for the configuration of the list named `name`; false if none is.
template <class F, class... Cfg>
bool with_config_named(const std::string& name, ConfigList<Cfg...>, F&& f) {
  return ((name == Cfg::name() ? (f(std::type_identity<Cfg>{}), true) : false) || ...);
}

// The record (its traits' `tiles`, e.g. step 4's FwdTiles) of the configuration named `name` in the list of
// either head dim, Configs<bf16, 64 or 128>::All (a name is made from its record, so it means the same in
// both), or none where neither holds it. What a stage's launch code reads to tell a lesson, an ablation or a
// split-KV configuration from the rest: fields, not the letters of the name.
template <class List>
struct FirstConfig;
template <class C0, class... Cfg>
struct FirstConfig<ConfigList<C0, Cfg...>> {
  using type = C0;
};
template <template <typename, int> class Configs>
auto config_tiles_named(const std::string& name) {
  using Tiles = std::remove_cv_t<decltype(FirstConfig<typename Configs<__nv_bfloat16, 64>::All>::type::tiles)>;
  std::optional<Tiles> tiles;
  const auto found = [&](auto cfg) { tiles = decltype(cfg)::type::tiles; };
  if (!with_config_named(name, typename Configs<__nv_bfloat16, 64>::All{}, found))
    with_config_named(name, typename Configs<__nv_bfloat16, 128>::All{}, found);
  return tiles;
}

// Calls f(std::type_identity<Cfg>{}) with the configuration named `name` in Configs<T, D>::All, T and D
// those of p; throws std::invalid_argument ("step 5 has no config ... for d = 64") if there is none.
template <template <typename, int> class Configs, class F>
void with_problem_config(const Problem& p, const std::string& name, const std::string& stage, F&& f) {
  dispatch_dtype</*kAllowFp32=*/false>(p.dtype, [&](auto t) {
    using T = decltype(t);
    dispatch_head_dim(int(p.d), [&](auto dim) {
      constexpr int D = decltype(dim)::value;
      if (!with_config_named(name, typename Configs<T, D>::All{}, f))
        throw std::invalid_argument(stage + " has no config " + name + " for d = " + std::to_string(D));
    });
  });
}

// Is every configuration that `variant` resolves to, on the GPUs the course targets (sm_90 and sm_120:
// config_of(p, variant, cc_major)), compiled with score modifiers (its traits' kHasMods)? A name the list
// does not know counts as yes: the stage's make() reports it. What a stage's `unsupported` asks before
// accepting --bias, --alibi, --window or --softcap.
template <template <typename, int> class Configs, class ConfigOf>
bool resolves_to_mods(const Problem& p, const std::string& variant, const ConfigOf& config_of, const std::string& stage) {
  bool has_mods = true;
  for (const int cc : {9, 12})
    try {
      with_problem_config<Configs>(p, config_of(p, variant, cc), stage,
                                   [&](auto cfg) { has_mods = has_mods && decltype(cfg)::type::kHasMods; });
    } catch (const std::invalid_argument&) {
    }
  return has_mods;
}

}  // namespace fa
