// weft-plan --svg: the plan as a picture. One row per epoch: the units as a bar split into
// the K stages (a colour per stage, frozen units hatched and faded), labelled with K,
// replicas and the predicted speedup; then the micro-batch schedule (forwards, backwards
// and the bubble) of the first and the last epoch. Standalone SVG 1.1, no scripts, no
// external resources; hovering a stage shows its units and costs.
#ifndef WEFT_PIPE_PLANNER_SVG_H_
#define WEFT_PIPE_PLANNER_SVG_H_

#include <string>

#include "absl/strings/string_view.h"
#include "core/status.h"
#include "pipe/planner/model.h"
#include "pipe/planner/planner.h"

namespace weft {
namespace planner {

StatusOr<std::string> RenderSvg(const Model& model, const PlannerResult& result);

// Text escaped for XML character data and attribute values (& < > " ').
std::string XmlEscape(absl::string_view text);

}  // namespace planner
}  // namespace weft

#endif  // WEFT_PIPE_PLANNER_SVG_H_
