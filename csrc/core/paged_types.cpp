#include "core/paged_types.h"

#include "core/errors.h"

namespace statecache {

const char* checkpoint_state_name(CheckpointState state) {
  switch (state) {
    case CheckpointState::kCopying:
      return "COPYING";
    case CheckpointState::kReady:
      return "READY";
    case CheckpointState::kEvicting:
      return "EVICTING";
  }
  return "?";
}

CheckpointState parse_checkpoint_state(const std::string& name) {
  if (name == "COPYING") return CheckpointState::kCopying;
  if (name == "READY") return CheckpointState::kReady;
  if (name == "EVICTING") return CheckpointState::kEvicting;
  bad_argument("state", name, "must be 'COPYING', 'READY' or 'EVICTING'");
}

PagedStateCheckpointSpec::PagedStateCheckpointSpec(int64_t page_unit_bytes_, int64_t slot_bytes_,
                                                   std::string layout_id_, int64_t image_bytes_)
    : page_unit_bytes(page_unit_bytes_),
      slot_bytes(slot_bytes_),
      layout_id(std::move(layout_id_)),
      image_bytes(image_bytes_) {
  if (page_unit_bytes <= 0) bad_argument("page_unit_bytes", page_unit_bytes, "must be a positive integer");
  if (slot_bytes <= 0) bad_argument("slot_bytes", slot_bytes, "must be a positive integer");
  if (image_bytes <= 0) bad_argument("image_bytes", image_bytes, "must be a positive integer");
  if (image_bytes > slot_bytes)
    bad_argument("image_bytes", image_bytes,
                 ("exceeds the slot_bytes=" + std::to_string(slot_bytes) + " a slot holds").c_str());
  if (layout_id.empty()) bad_argument("layout_id", "''", "a PAGE checkpoint needs a non-empty layout id");
}

}  // namespace statecache
