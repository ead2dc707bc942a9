// FlashAttention, step by step — gpu/config_list.h
// A compile-time list of kernel configurations, each selectable by name at run time, so that comparing
// tile sizes never means editing source. A configuration is a traits type with a static name() (steps 4
// and 5 define theirs); one list per stage feeds its instances (every kernel of the list is compiled),
// its names (--variant, --list-variants, step 6's tuner) and its launch shapes.
#pragma once
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

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

// Calls f(std::type_identity<Cfg>{}) for the configuration of the list named `name`; false if none is.
template <class F, class... Cfg>
bool with_config_named(const std::string& name, ConfigList<Cfg...>, F&& f) {
  return ((name == Cfg::name() ? (f(std::type_identity<Cfg>{}), true) : false) || ...);
}

}  // namespace fa
