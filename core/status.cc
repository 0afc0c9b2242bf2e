#include "core/status.h"

namespace weft {

Status Annotate(const Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

}  // namespace weft
