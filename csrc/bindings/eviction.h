// set_eviction_policy / eviction_policy for every class whose cache spends
// checkpoints (the two pools, the PAGE store, the coordinator's store):
// argument conversion only; the model lives in core/eviction_policy.h.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "core/eviction_policy.h"

namespace statecache::bindings {

namespace py = pybind11;

inline EvictionCostModel eviction_model_from(const std::string& kind, double flops_per_token,
                                             double flops_per_context_token, double checkpoint_bytes,
                                             double tokens_per_position, double weight, bool guesses_first) {
  EvictionCostModel m;
  if (kind == "lru")
    m.kind = EvictionCostModel::Kind::kLru;
  else if (kind == "cost")
    m.kind = EvictionCostModel::Kind::kCost;
  else
    throw std::invalid_argument("kind must be 'lru' or 'cost', got '" + kind + "'");
  m.flops_per_token = flops_per_token;
  m.flops_per_context_token = flops_per_context_token;
  m.checkpoint_bytes = checkpoint_bytes;
  m.tokens_per_position = tokens_per_position;
  m.weight = weight;
  m.guesses_first = guesses_first;
  return m;
}

inline py::dict eviction_model_dict(const EvictionCostModel& m) {
  py::dict d;
  d["kind"] = m.kind == EvictionCostModel::Kind::kCost ? "cost" : "lru";
  d["flops_per_token"] = m.flops_per_token;
  d["flops_per_context_token"] = m.flops_per_context_token;
  d["checkpoint_bytes"] = m.checkpoint_bytes;
  d["tokens_per_position"] = m.tokens_per_position;
  d["weight"] = m.weight;
  d["guesses_first"] = m.guesses_first;
  return d;
}

constexpr const char* kSetEvictionPolicyDoc =
    "set_eviction_policy(kind='lru', *, flops_per_token=1.0, flops_per_context_token=0.0, "
    "checkpoint_bytes=1.0, tokens_per_position=1.0, weight=1.0, guesses_first=True)\n\n"
    "Which checkpoint to spend first. 'lru' (the default, the reference's behaviour): least "
    "recently used, guesses first. 'cost': recency + weight x prefill FLOPs a hit saves per byte "
    "freed (a position of p hash blocks saves n = p x tokens_per_position tokens: "
    "n x flops_per_token + flops_per_context_token x n(n+1)/2), both min-max normalised; O(1) "
    "per operation. ValueError naming the argument, nothing changed, for a bad value.";

// `target(self)` gives the object with set_eviction_model / eviction_model.
template <class Cls, class Target>
void def_eviction_methods(Cls& cls, Target target) {
  using T = typename Cls::type;
  cls.def(
         "set_eviction_policy",
         [target](T& self, const std::string& kind, double flops_per_token, double flops_per_context_token,
                  double checkpoint_bytes, double tokens_per_position, double weight, bool guesses_first) {
           target(self).set_eviction_model(eviction_model_from(kind, flops_per_token, flops_per_context_token,
                                                               checkpoint_bytes, tokens_per_position, weight,
                                                               guesses_first));
         },
         py::arg("kind") = "lru", py::kw_only(), py::arg("flops_per_token") = 1.0,
         py::arg("flops_per_context_token") = 0.0, py::arg("checkpoint_bytes") = 1.0,
         py::arg("tokens_per_position") = 1.0, py::arg("weight") = 1.0, py::arg("guesses_first") = true,
         kSetEvictionPolicyDoc,
         "Chooses which checkpoint to spend first ('lru' or 'cost'; see ``eviction_policy``); "
         "returns None. Raises ValueError naming the argument, changing nothing, for an unknown "
         "kind or a weight that is negative or not finite.")
      .def_property_readonly(
          "eviction_policy", [target](T& self) { return eviction_model_dict(target(self).eviction_model()); },
          "The eviction setting as a dict (see set_eviction_policy).");
}

}  // namespace statecache::bindings
