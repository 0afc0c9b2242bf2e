#include "comm/data_plane.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace weft {
namespace comm {
namespace {

std::string EventName(const char* phase, const Request& r, absl::string_view described) {
  // The op as Describe names it: "neighbor_allreduce 'g'", "unnamed allreduce #3",
  // "win_accumulate 'x'" -> NEIGHBOR_ALLREDUCE, ALLREDUCE, WIN_ACCUMULATE.
  absl::string_view op = described;
  if (absl::StartsWith(op, "unnamed ")) op.remove_prefix(8);
  op = op.substr(0, op.find(' '));
  const std::string upper = absl::AsciiStrToUpper(op);
  const absl::string_view p = phase;
  if (p == "queue") return absl::StrCat("ENQUEUE_", upper);
  if (p == "negotiate") return absl::StrCat("NEGOTIATE_", upper);
  if (p == "communicate") return absl::StrCat(r.backend, "_", upper);
  if (p == "combine") return absl::StrCat("COMBINE_", upper);
  if (p == "fuse") return "MEMCPY_IN_FUSION_BUFFER";
  return absl::AsciiStrToUpper(p);
}

}  // namespace

void TraceSpan(Timeline* timeline, const Request& r, const char* phase, int64_t start_us,
               int64_t end_us, const std::string& detail) {
  // A start of 0 was taken while the timeline was off (TraceStart): the op began before
  // timeline_start(), and its span would reach back to the clock's epoch.
  if (!timeline->enabled() || start_us == 0) return;
  const std::string described = Describe(r.desc);
  timeline->Span(described, EventName(phase, r, described), phase, start_us, end_us, detail);
}

int64_t TraceStart(const Timeline* timeline) {
  return timeline->enabled() ? Timeline::NowMicros() : 0;
}

void TraceGroup(Timeline* timeline, const Group& group, const char* phase, int64_t start_us) {
  if (!timeline->enabled() || start_us == 0) return;
  const int64_t end = Timeline::NowMicros();
  const std::string detail = group.size() > 1 ? absl::StrCat("fused x", group.size()) : "";
  for (const auto& r : group) TraceSpan(timeline, *r, phase, start_us, end, detail);
}

int64_t RowElements(absl::Span<const int64_t> shape) {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

Status CheckAllocated(const StatusOr<TensorView>& out, DType dtype, absl::Span<const int64_t> shape,
                      const Device& device) {
  if (!out.ok()) return Annotate(out.status(), "allocating the output");
  if (out->dtype() != dtype || out->shape() != shape || !out->is_contiguous() ||
      out->device() != device || (out->data() == nullptr && out->numel() > 0)) {
    return Internal("the output allocator returned ", out->ToString(), ", expected ",
                    DTypeName(dtype), ShapeToString(shape), " contiguous on ", device.ToString());
  }
  return OkStatus();
}

}  // namespace comm
}  // namespace weft
