// The model weft-plan plans for: a list of pipeline units (layers, or halves of transformer
// blocks) with parameter counts and optional measured times. Either a built-in preset,
// computed from the architecture's hyper-parameters, or a CSV / JSON layer file.
#ifndef WEFT_PIPE_PLANNER_MODEL_H_
#define WEFT_PIPE_PLANNER_MODEL_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/status.h"

namespace weft {
namespace planner {

// Longest layer name a layer file may give (names are printed in every plan).
constexpr size_t kMaxUnitNameBytes = 1024;

struct Unit {
  std::string name;
  double params = 0;  // parameter count (>= 0)
  // Measured forward + backward seconds per sample of the unit while trainable (>= 0).
  std::optional<double> time;
};

struct Model {
  std::string name;   // the preset name ("vit-b16") or the layer file's path
  std::string title;  // "ViT-B/16"; the path for a layer file
  std::vector<Unit> units;
  int64_t default_tokens = 0;      // tokens per sample of the preset; 0 for a layer file
  // Width of the activation between two units (tokens x hidden values per sample cross a
  // stage boundary); 0 for a layer file (boundary transfers and cache reads not costed
  // unless CostOptions::hidden is given).
  int64_t hidden = 0;
  std::vector<std::string> notes;  // how the units were counted

  int layers() const { return static_cast<int>(units.size()); }
  double total_params() const;
  // True when every unit has a time (a layer file has all times or none).
  bool has_times() const;
  std::vector<double> params() const;
  std::vector<double> times() const;  // requires has_times()
};

// Presets computed from architecture hyper-parameters (see model.cc for the counting):
// vit-b16, vit-l16, bert-base, bert-large, gpt2-small, gpt2-medium, gpt2-large, gpt2-xl.
// Units: embed, block<i>.attn and block<i>.mlp for each transformer block (via
// pipe::TransformerBlockHalves), head.
std::vector<std::string> PresetNames();
// "gpt2" is accepted for "gpt2-small". NotFound naming the presets for an unknown name.
StatusOr<Model> MakePreset(absl::string_view name);

// Layer files. `source` names the file in errors ("layers.csv: line 3: ...").
// CSV: a header line `name,params` or `name,params,time`, then one line per unit; blank
// lines are skipped; no quoting (a name may not contain a comma or a double quote).
StatusOr<Model> ParseLayerCsv(absl::string_view text, absl::string_view source);
// JSON: [{"name": "embed", "params": 742656, "time": 0.0012}, ...]; "time" is optional
// (all units or none); other keys are refused.
StatusOr<Model> ParseLayerJson(absl::string_view text, absl::string_view source);
// JSON if the first non-blank character is '[' or '{', CSV otherwise.
StatusOr<Model> ParseLayerText(absl::string_view text, absl::string_view source);
// Reads and parses a file (NotFound when it cannot be opened).
StatusOr<Model> LoadLayerFile(const std::string& path);

// 86567656 -> "86,567,656" (rounded to an integer).
std::string FormatCount(double n);

}  // namespace planner
}  // namespace weft

#endif  // WEFT_PIPE_PLANNER_MODEL_H_
