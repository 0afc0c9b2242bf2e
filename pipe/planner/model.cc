#include "pipe/planner/model.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "pipe/balance/balance.h"
#include "pipe/planner/json.h"

namespace weft {
namespace planner {

std::string FormatCount(double n) {
  const bool negative = n < 0;
  const std::string digits = absl::StrCat(static_cast<int64_t>(std::llround(std::fabs(n))));
  std::string out = negative ? "-" : "";
  const int lead = static_cast<int>(digits.size()) % 3;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (static_cast<int>(i) - lead) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

double Model::total_params() const {
  double total = 0;
  for (const Unit& u : units) total += u.params;
  return total;
}

bool Model::has_times() const {
  if (units.empty()) return false;
  for (const Unit& u : units) {
    if (!u.time.has_value()) return false;
  }
  return true;
}

std::vector<double> Model::params() const {
  std::vector<double> out;
  out.reserve(units.size());
  for (const Unit& u : units) out.push_back(u.params);
  return out;
}

std::vector<double> Model::times() const {
  std::vector<double> out;
  out.reserve(units.size());
  for (const Unit& u : units) out.push_back(u.time.value_or(0));
  return out;
}

// ---- presets ---------------------------------------------------------------------------

namespace {

enum class Family { kViT, kBert, kGpt2 };

struct PresetSpec {
  const char* name;
  const char* title;
  Family family;
  int blocks;
  int64_t hidden;
  int64_t mlp;
};

// The published architectures (ViT: Dosovitskiy et al. 2021, Table 1; BERT: Devlin et al.
// 2019; GPT-2: Radford et al. 2019 with the released checkpoints' widths).
constexpr PresetSpec kPresets[] = {
    {"vit-b16", "ViT-B/16", Family::kViT, 12, 768, 3072},
    {"vit-l16", "ViT-L/16", Family::kViT, 24, 1024, 4096},
    {"bert-base", "BERT-base", Family::kBert, 12, 768, 3072},
    {"bert-large", "BERT-large", Family::kBert, 24, 1024, 4096},
    {"gpt2-small", "GPT-2 small", Family::kGpt2, 12, 768, 3072},
    {"gpt2-medium", "GPT-2 medium", Family::kGpt2, 24, 1024, 4096},
    {"gpt2-large", "GPT-2 large", Family::kGpt2, 36, 1280, 5120},
    {"gpt2-xl", "GPT-2 XL", Family::kGpt2, 48, 1600, 6400},
};

// ViT/16 at 224 x 224: 14 x 14 = 196 patches + the class token.
constexpr int64_t kVitPatch = 16;
constexpr int64_t kVitChannels = 3;
constexpr int64_t kVitTokens = (224 / kVitPatch) * (224 / kVitPatch) + 1;
constexpr int64_t kVitClasses = 1000;
// BERT (uncased WordPiece vocabulary), 512 positions, 2 token types.
constexpr int64_t kBertVocab = 30522;
constexpr int64_t kBertPositions = 512;
constexpr int64_t kBertTypes = 2;
constexpr int64_t kBertOutputs = 2;
constexpr int64_t kBertDefaultTokens = 384;  // SQuAD fine-tuning's usual sequence length
// GPT-2: byte-level BPE vocabulary, 1024 positions.
constexpr int64_t kGpt2Vocab = 50257;
constexpr int64_t kGpt2Context = 1024;

Model BuildPreset(const PresetSpec& spec) {
  const int64_t h = spec.hidden;
  const int64_t layer_norm = 2 * h;  // scale and shift
  Model model;
  model.name = spec.name;
  model.title = spec.title;
  model.hidden = h;

  double embed = 0, head = 0;
  switch (spec.family) {
    case Family::kViT: {
      const int64_t patch_projection = h * kVitChannels * kVitPatch * kVitPatch + h;
      embed = patch_projection + h /* class token */ + kVitTokens * h;
      head = layer_norm + h * kVitClasses + kVitClasses;
      model.default_tokens = kVitTokens;
      model.notes.push_back(
          absl::StrCat("embed: 16x16 patch projection (with bias) + class token + ", kVitTokens,
                       " position embeddings (224x224 images); no LayerNorm there (the blocks are "
                       "pre-norm)"));
      model.notes.push_back(
          absl::StrCat("head: final LayerNorm + ", kVitClasses, "-class linear classifier"));
      break;
    }
    case Family::kBert: {
      embed = (kBertVocab + kBertPositions + kBertTypes) * h + layer_norm;
      const int64_t pooler = h * h + h;
      const int64_t output = h * kBertOutputs + kBertOutputs;
      head = pooler + output;
      model.default_tokens = kBertDefaultTokens;
      model.notes.push_back(absl::StrCat("embed: ", kBertVocab, " token + ", kBertPositions,
                                         " position + ", kBertTypes,
                                         " type embeddings + LayerNorm"));
      model.notes.push_back(
          absl::StrCat("blocks are post-norm: each half's LayerNorm follows it (same count)"));
      model.notes.push_back(absl::StrCat(
          "head: pooler (", FormatCount(pooler), ") + a 2-way output layer (", FormatCount(output),
          "); SQuAD's span head has the same 2-way layer but no pooler (", FormatCount(pooler),
          " fewer)"));
      break;
    }
    case Family::kGpt2: {
      embed = (kGpt2Vocab + kGpt2Context) * h;
      head = layer_norm;
      model.default_tokens = kGpt2Context;
      model.notes.push_back(
          absl::StrCat("embed: ", kGpt2Vocab, " token + ", kGpt2Context, " position embeddings"));
      model.notes.push_back(absl::StrCat(
          "head: final LayerNorm only: the LM head is tied to the token embedding, so its ",
          FormatCount(static_cast<double>(kGpt2Vocab * h)), " weights are counted once, in embed"));
      break;
    }
  }

  pipe::TransformerBlockDims dims;
  dims.hidden = h;
  dims.mlp = spec.mlp;
  dims.bias = true;
  const pipe::BlockHalves halves = pipe::TransformerBlockHalves(dims);
  model.units.push_back({"embed", embed, std::nullopt});
  for (int b = 0; b < spec.blocks; ++b) {
    model.units.push_back({absl::StrCat("block", b, ".attn"), halves.attention, std::nullopt});
    model.units.push_back({absl::StrCat("block", b, ".mlp"), halves.mlp, std::nullopt});
  }
  model.units.push_back({"head", head, std::nullopt});
  model.notes.insert(
      model.notes.begin() + 1,
      absl::StrCat(spec.blocks, " blocks (hidden ", h, ", MLP ", spec.mlp,
                   "), each two units: attention half ", FormatCount(halves.attention),
                   " (LayerNorm + QKV + output projection), MLP half ", FormatCount(halves.mlp),
                   " (LayerNorm + two linear layers)"));
  return model;
}

}  // namespace

std::vector<std::string> PresetNames() {
  std::vector<std::string> names;
  for (const PresetSpec& spec : kPresets) names.push_back(spec.name);
  return names;
}

StatusOr<Model> MakePreset(absl::string_view name) {
  const std::string wanted = absl::AsciiStrToLower(name == "gpt2" ? "gpt2-small" : name);
  for (const PresetSpec& spec : kPresets) {
    if (wanted == spec.name) return BuildPreset(spec);
  }
  return absl::NotFoundError(absl::StrCat(
      "unknown model '", name, "': expected one of ", absl::StrJoin(PresetNames(), ", "),
      " (or give per-layer parameter counts with --layers FILE)"));
}

// ---- layer files -----------------------------------------------------------------------

namespace {

// A strict decimal number: all of `text` (no spaces inside, no "inf"/"nan"/hex).
bool ParseNumber(absl::string_view text, double* out) {
  if (text.empty()) return false;
  for (char c : text) {
    if (!(absl::ascii_isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == 'E' ||
          c == '+' || c == '-')) {
      return false;
    }
  }
  const std::string s(text);
  errno = 0;
  char* end = nullptr;
  const double value = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || !std::isfinite(value)) return false;
  *out = value;
  return true;
}

// The checks every layer file gets after its syntax, on top of the per-value ones.
Status CheckUnits(const Model& model, absl::string_view source) {
  if (model.units.empty()) {
    return InvalidArgument(source,
                           ": expected at least one layer, found none (a layer file "
                           "lists one unit per line or array element)");
  }
  return OkStatus();
}

}  // namespace

StatusOr<Model> ParseLayerCsv(absl::string_view text, absl::string_view source) {
  Model model;
  model.name = std::string(source);
  model.title = std::string(source);
  const std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  bool have_header = false, have_time = false;
  for (size_t i = 0; i < lines.size(); ++i) {
    const int line = static_cast<int>(i) + 1;
    absl::string_view raw = lines[i];
    if (!raw.empty() && raw.back() == '\r') raw.remove_suffix(1);
    if (i == 0 && raw.substr(0, 3) == "\xEF\xBB\xBF") raw.remove_prefix(3);
    const absl::string_view content = absl::StripAsciiWhitespace(raw);
    if (content.empty()) continue;
    std::vector<std::string> fields;
    for (absl::string_view f : absl::StrSplit(content, ',')) {
      fields.emplace_back(absl::StripAsciiWhitespace(f));
    }
    if (!have_header) {
      std::vector<std::string> lower;
      for (const std::string& f : fields) lower.push_back(absl::AsciiStrToLower(f));
      if (lower == std::vector<std::string>{"name", "params"} ||
          lower == std::vector<std::string>{"name", "params", "time"}) {
        have_header = true;
        have_time = fields.size() == 3;
        continue;
      }
      return InvalidArgument(source, ": line ", line,
                             ": expected the header line 'name,params' or "
                             "'name,params,time', found '",
                             content, "' (add the header as the first line)");
    }
    const size_t expected = have_time ? 3 : 2;
    if (fields.size() != expected) {
      return InvalidArgument(source, ": line ", line, ": expected ", expected,
                             " comma-separated fields (",
                             have_time ? "name,params,time" : "name,params",
                             ", as the header says), found ", fields.size(), ": '", content, "'");
    }
    Unit unit;
    unit.name = fields[0];
    if (unit.name.empty()) {
      return InvalidArgument(source, ": line ", line,
                             ": expected a layer name in the first field, found nothing");
    }
    if (unit.name.size() > kMaxUnitNameBytes) {
      return InvalidArgument(source, ": line ", line, ": expected a layer name of at most ",
                             kMaxUnitNameBytes, " bytes, found one of ", unit.name.size());
    }
    if (unit.name.find('"') != std::string::npos) {
      return InvalidArgument(source, ": line ", line, ": expected a name without '\"', found ",
                             unit.name, " (CSV quoting is not supported; use a JSON file)");
    }
    double params;
    if (!ParseNumber(fields[1], &params)) {
      return InvalidArgument(source, ": line ", line,
                             ": expected a number of parameters in the field params, found '",
                             fields[1], "'");
    }
    if (params < 0) {
      return InvalidArgument(source, ": line ", line,
                             ": expected params >= 0 (a parameter count), found ", fields[1]);
    }
    unit.params = params;
    if (have_time) {
      double time;
      if (!ParseNumber(fields[2], &time)) {
        return InvalidArgument(source, ": line ", line,
                               ": expected a time in seconds in the field time, found '", fields[2],
                               "' (give a time for every layer, or drop the time column)");
      }
      if (time < 0) {
        return InvalidArgument(source, ": line ", line,
                               ": expected time >= 0 (forward + backward seconds per "
                               "sample), found ",
                               fields[2]);
      }
      unit.time = time;
    }
    model.units.push_back(std::move(unit));
  }
  if (!have_header) {
    return InvalidArgument(source,
                           ": expected the header line 'name,params' or "
                           "'name,params,time', found an empty file");
  }
  WEFT_RETURN_IF_ERROR(CheckUnits(model, source));
  return model;
}

StatusOr<Model> ParseLayerJson(absl::string_view text, absl::string_view source) {
  StatusOr<JsonValue> parsed = ParseJson(text);
  if (!parsed.ok()) {
    return InvalidArgument(source, ": ", parsed.status().message(),
                           " (expected [{\"name\": \"...\", \"params\": N, \"time\": X}, ...])");
  }
  const JsonValue& root = *parsed;
  auto at = [&](const JsonValue& v) {
    return absl::StrCat(source, ": line ", v.line, ", column ", v.column, ": ");
  };
  if (root.type != JsonValue::Type::kArray) {
    return InvalidArgument(at(root),
                           "expected an array of layers [{\"name\": ..., \"params\": "
                           "...}, ...], found ",
                           JsonTypeName(root.type));
  }
  Model model;
  model.name = std::string(source);
  model.title = std::string(source);
  const JsonValue* first_time_owner = nullptr;
  const JsonValue* first_without_time = nullptr;
  for (size_t i = 0; i < root.array.size(); ++i) {
    const JsonValue& layer = root.array[i];
    if (layer.type != JsonValue::Type::kObject) {
      return InvalidArgument(at(layer), "expected layer ", i,
                             " to be an object {\"name\": ..., \"params\": ...}, found ",
                             JsonTypeName(layer.type));
    }
    for (const auto& member : layer.object) {
      if (member.first != "name" && member.first != "params" && member.first != "time") {
        return InvalidArgument(at(member.second),
                               "expected only the keys name, params and "
                               "time in layer ",
                               i, ", found \"", member.first, "\"");
      }
    }
    Unit unit;
    const JsonValue* name = layer.Find("name");
    if (name == nullptr) {
      return InvalidArgument(at(layer), "expected a \"name\" in layer ", i, ", found none");
    }
    if (name->type != JsonValue::Type::kString || name->string.empty()) {
      return InvalidArgument(
          at(*name), "expected the name of layer ", i, " to be a non-empty string, found ",
          name->type == JsonValue::Type::kString ? "an empty string" : JsonTypeName(name->type));
    }
    if (name->string.size() > kMaxUnitNameBytes) {
      return InvalidArgument(at(*name), "expected the name of layer ", i, " to be at most ",
                             kMaxUnitNameBytes, " bytes, found ", name->string.size());
    }
    unit.name = name->string;
    const JsonValue* params = layer.Find("params");
    if (params == nullptr) {
      return InvalidArgument(at(layer), "expected \"params\" (the parameter count) in layer ", i,
                             " (", unit.name, "), found none");
    }
    if (params->type != JsonValue::Type::kNumber) {
      return InvalidArgument(at(*params), "expected params of layer ", i, " (", unit.name,
                             ") to be a number, found ", JsonTypeName(params->type));
    }
    if (params->number < 0) {
      return InvalidArgument(at(*params), "expected params >= 0 for layer ", i, " (", unit.name,
                             "), found ", params->number);
    }
    unit.params = params->number;
    if (const JsonValue* time = layer.Find("time")) {
      if (time->type != JsonValue::Type::kNumber) {
        return InvalidArgument(at(*time), "expected time of layer ", i, " (", unit.name,
                               ") to be a number of seconds, found ", JsonTypeName(time->type));
      }
      if (time->number < 0) {
        return InvalidArgument(at(*time), "expected time >= 0 for layer ", i, " (", unit.name,
                               "), found ", time->number);
      }
      unit.time = time->number;
      if (first_time_owner == nullptr) first_time_owner = &layer;
    } else if (first_without_time == nullptr) {
      first_without_time = &layer;
    }
    if (first_time_owner != nullptr && first_without_time != nullptr) {
      return InvalidArgument(at(layer),
                             "expected a \"time\" for every layer or for none, "
                             "found layer ",
                             i, " (", unit.name, ") ", unit.time.has_value() ? "with" : "without",
                             " one while an earlier layer is ",
                             unit.time.has_value() ? "without" : "with",
                             " (measure all layers, or drop \"time\")");
    }
    model.units.push_back(std::move(unit));
  }
  WEFT_RETURN_IF_ERROR(CheckUnits(model, source));
  return model;
}

StatusOr<Model> ParseLayerText(absl::string_view text, absl::string_view source) {
  absl::string_view rest = text;
  if (rest.substr(0, 3) == "\xEF\xBB\xBF") rest.remove_prefix(3);
  rest = absl::StripLeadingAsciiWhitespace(rest);
  if (!rest.empty() && (rest.front() == '[' || rest.front() == '{')) {
    return ParseLayerJson(text, source);
  }
  return ParseLayerCsv(text, source);
}

StatusOr<Model> LoadLayerFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot open the layer file ", path,
                                            ": expected a readable CSV or JSON file (",
                                            std::strerror(errno), ")"));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  return ParseLayerText(buffer.str(), path);
}

}  // namespace planner
}  // namespace weft
