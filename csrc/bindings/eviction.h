// set_eviction_policy / eviction_policy for every class whose cache spends
// checkpoints (the two pools, the PAGE store, the coordinator's store):
// argument conversion only; the model lives in core/eviction_policy.h.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "bindings/docs.h"
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
         doc(cls, "set_eviction_policy"))
      .def_property_readonly(
          "eviction_policy", [target](T& self) { return eviction_model_dict(target(self).eviction_model()); },
          doc(cls, "eviction_policy"));
}

}  // namespace statecache::bindings
