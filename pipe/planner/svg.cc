#include "pipe/planner/svg.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace weft {
namespace planner {

std::string XmlEscape(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        // XML 1.0 forbids most control characters even escaped: drop them.
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r') break;
        out.push_back(c);
    }
  }
  return out;
}

namespace {

// Tableau 10: distinguishable, and readable with white text.
const char* const kStageColors[] = {"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
                                    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
constexpr int kColorCount = sizeof(kStageColors) / sizeof(kStageColors[0]);
constexpr const char* kForward = "#4e79a7";
constexpr const char* kBackward = "#f28e2b";
constexpr const char* kIdle = "#e8e8e8";
constexpr const char* kInk = "#222222";
constexpr const char* kMuted = "#666666";

constexpr double kWidth = 1000;
constexpr double kLeft = 20;
constexpr double kBarX = 190;
constexpr double kBarWidth = 540;
// The columns right of the bars.
constexpr double kPipelineX = kBarX + kBarWidth + 12;
constexpr double kSpeedupX = kPipelineX + 110;
constexpr double kNewRanksX = kSpeedupX + 56;
constexpr double kRowHeight = 22;
constexpr double kRowPitch = 30;

std::string Num(double v) { return absl::StrFormat("%.1f", v); }

class SvgWriter {
 public:
  void Rect(double x, double y, double w, double h, absl::string_view fill,
            absl::string_view extra = "") {
    absl::StrAppend(&body_, "<rect x=\"", Num(x), "\" y=\"", Num(y), "\" width=\"", Num(w),
                    "\" height=\"", Num(h), "\" fill=\"", fill, "\"", extra.empty() ? "" : " ",
                    extra, "/>\n");
  }
  void Text(double x, double y, absl::string_view text, absl::string_view style = "",
            absl::string_view anchor = "start") {
    absl::StrAppend(&body_, "<text x=\"", Num(x), "\" y=\"", Num(y), "\"",
                    anchor == "start" ? "" : absl::StrCat(" text-anchor=\"", anchor, "\""),
                    style.empty() ? "" : " ", style, ">", XmlEscape(text), "</text>\n");
  }
  void Line(double x1, double y1, double x2, double y2, absl::string_view stroke, double width,
            absl::string_view extra = "") {
    absl::StrAppend(&body_, "<line x1=\"", Num(x1), "\" y1=\"", Num(y1), "\" x2=\"", Num(x2),
                    "\" y2=\"", Num(y2), "\" stroke=\"", stroke, "\" stroke-width=\"", Num(width),
                    "\"", extra.empty() ? "" : " ", extra, "/>\n");
  }
  void Raw(absl::string_view s) { absl::StrAppend(&body_, s); }
  void Open(absl::string_view title) {
    absl::StrAppend(&body_, "<g><title>", XmlEscape(title), "</title>\n");
  }
  void Close() { body_ += "</g>\n"; }
  const std::string& body() const { return body_; }

 private:
  std::string body_;
};

std::string StageTitle(const Model& model, const EpochPlan& e, int s) {
  const StagePrediction& sp = e.prediction.stages[s];
  std::string units = sp.first >= sp.last ? "no units"
                                          : absl::StrCat("units ", sp.first, "-", sp.last - 1, " (",
                                                         model.units[sp.first].name, " .. ",
                                                         model.units[sp.last - 1].name, ")");
  return absl::StrFormat(
      "epoch %d, stage %d: %s; trainable %.2fM, frozen %.2fM parameters; %.3f ms per "
      "micro-batch",
      e.epoch, s, units, sp.trainable_params / 1e6, sp.frozen_params / 1e6,
      sp.seconds_per_micro_batch * 1e3);
}

// One epoch's bar: the units in equal widths, coloured by stage, frozen ones hatched.
void DrawPartitionRow(SvgWriter* svg, const Model& model, const EpochPlan& e, double y) {
  const int layers = model.layers();
  const double unit_w = kBarWidth / layers;
  const pipe::Plan& plan = e.plan;
  svg->Text(kLeft, y + 15, absl::StrCat("epoch ", e.epoch),
            absl::StrCat("font-weight=\"bold\" fill=\"", kInk, "\""));
  svg->Text(kLeft + 62, y + 15, absl::StrCat("frozen ", plan.frozen, "/", layers),
            absl::StrCat("fill=\"", kMuted, "\""));
  for (int s = 0; s < plan.k; ++s) {
    const int first = plan.partition.boundaries[s];
    const int last = plan.partition.boundaries[s + 1];
    const char* color = kStageColors[s % kColorCount];
    svg->Open(StageTitle(model, e, s));
    const double x0 = kBarX + first * unit_w;
    const double w = (last - first) * unit_w;
    if (last > first) {
      svg->Rect(x0, y, w, kRowHeight, color);
      const int frozen_end = std::min(last, plan.frozen);
      if (frozen_end > first) {
        const double fw = (frozen_end - first) * unit_w;
        svg->Rect(x0, y, fw, kRowHeight, "url(#frozen)");
      }
      if (unit_w >= 4) {
        for (int u = first + 1; u < last; ++u) {
          const double x = kBarX + u * unit_w;
          svg->Line(x, y + 1, x, y + kRowHeight - 1, "#ffffff", 0.6, "stroke-opacity=\"0.7\"");
        }
      }
      if (w >= 24) {
        // A pill in the stage's colour keeps the label readable over the hatching.
        svg->Rect(x0 + w / 2 - 11, y + 5, 22, 13, color, "rx=\"3\"");
        svg->Text(x0 + w / 2, y + 15, absl::StrCat("s", s),
                  "font-size=\"10\" fill=\"#ffffff\" font-weight=\"bold\"", "middle");
      }
    } else {
      // An empty stage (the greedy strategy can leave one): a red tick where it sits.
      svg->Rect(x0 - 1.5, y - 3, 3, kRowHeight + 6, "#d62728");
    }
    svg->Close();
  }
  // Stage boundaries as white gaps.
  for (int s = 1; s < plan.k; ++s) {
    const double x = kBarX + plan.partition.boundaries[s] * unit_w;
    svg->Line(x, y, x, y + kRowHeight, "#ffffff", 2.5);
  }
  // The end of the frozen prefix.
  if (plan.frozen > 0 && plan.frozen < layers) {
    const double x = kBarX + plan.frozen * unit_w;
    svg->Line(x, y - 3, x, y + kRowHeight + 3, kInk, 1.5);
  }
  svg->Rect(kBarX, y, kBarWidth, kRowHeight, "none",
            absl::StrCat("stroke=\"", kMuted, "\" stroke-width=\"0.8\""));
  std::string label = absl::StrCat("K ", plan.k, " \xC3\x97 ", plan.replicas,
                                   plan.replicas == 1 ? " replica" : " replicas");
  svg->Text(kPipelineX, y + 15, label, absl::StrCat("fill=\"", kInk, "\""));
  svg->Text(kSpeedupX, y + 15, absl::StrFormat("%.2f\xC3\x97", e.speedup),
            absl::StrCat("font-weight=\"bold\" fill=\"", kInk, "\""));
  if (!plan.newly_active.empty()) {
    std::string ranks = FormatRanks(plan.newly_active);
    if (ranks.size() > 14) ranks = absl::StrCat(ranks.substr(0, 12), "\xE2\x80\xA6");
    svg->Text(kNewRanksX, y + 15, ranks, absl::StrCat("font-size=\"11\" fill=\"", kMuted, "\""));
  }
}

// The micro-batch schedule of one epoch's pipeline, in unit-time slots. Returns the height.
StatusOr<double> DrawTimeline(SvgWriter* svg, const EpochPlan& e, pipe::ScheduleKind kind,
                              double y) {
  const int k = e.plan.k, m = e.plan.micro_batches;
  WEFT_ASSIGN_OR_RETURN(const pipe::Schedule schedule, pipe::MakeSchedule(kind, k, m));
  const int cycles = static_cast<int>(schedule.cycles.size());
  const double avail = kWidth - kBarX - kLeft;
  const double cw = std::min(20.0, avail / std::max(1, cycles));
  const double rh = k <= 16 ? 16.0 : std::max(4.0, 256.0 / k);
  svg->Text(kLeft, y + 14,
            absl::StrFormat("epoch %d: %s schedule, K %d stages, M %d micro-batches, bubble "
                            "%.1f%% of the stage-slots",
                            e.epoch, kind == pipe::ScheduleKind::kGPipe ? "GPipe" : "1F1B", k, m,
                            100 * schedule.BubbleFraction()),
            absl::StrCat("font-size=\"13\" font-weight=\"bold\" fill=\"", kInk, "\""));
  const double top = y + 24;
  for (int s = 0; s < k; ++s) {
    const double ry = top + s * rh;
    svg->Rect(kBarX, ry, cycles * cw, rh - (rh >= 8 ? 1.5 : 0.5), kIdle);
    if (rh >= 10) {
      svg->Text(kBarX - 8, ry + rh - 4, absl::StrCat("stage ", s),
                absl::StrCat("font-size=\"10\" fill=\"", kMuted, "\""), "end");
    }
  }
  if (rh < 10) {
    svg->Text(kBarX - 8, top + 9, "stage 0", absl::StrCat("font-size=\"10\" fill=\"", kMuted, "\""),
              "end");
    svg->Text(kBarX - 8, top + k * rh, absl::StrCat("stage ", k - 1),
              absl::StrCat("font-size=\"10\" fill=\"", kMuted, "\""), "end");
  }
  const bool numbers = cw >= 13 && rh >= 12;
  const double h = rh - (rh >= 8 ? 1.5 : 0.5);
  if (cw >= 5) {
    // Cells wide enough to tell apart: one per work item, numbered when they fit.
    for (int c = 0; c < cycles; ++c) {
      for (const pipe::Work& w : schedule.cycles[c]) {
        const double x = kBarX + c * cw;
        const double ry = top + w.stage * rh;
        svg->Rect(x + 0.25, ry, cw - 0.5, h, w.forward ? kForward : kBackward);
        if (numbers) {
          svg->Text(x + cw / 2, ry + h - 4, absl::StrCat(w.micro_batch),
                    "font-size=\"8\" fill=\"#ffffff\"", "middle");
        }
      }
    }
  } else {
    // Narrow cells: one rectangle per run of consecutive forwards (or backwards) of a stage,
    // which keeps a deep pipeline's file small and its picture free of moire.
    // kind[s][c]: 0 idle, 1 forward, 2 backward.
    std::vector<std::vector<char>> kind(k, std::vector<char>(cycles, 0));
    for (int c = 0; c < cycles; ++c) {
      for (const pipe::Work& w : schedule.cycles[c]) kind[w.stage][c] = w.forward ? 1 : 2;
    }
    for (int s = 0; s < k; ++s) {
      int c = 0;
      while (c < cycles) {
        if (kind[s][c] == 0) {
          ++c;
          continue;
        }
        int end = c;
        while (end + 1 < cycles && kind[s][end + 1] == kind[s][c]) ++end;
        svg->Rect(kBarX + c * cw, top + s * rh, (end - c + 1) * cw, h,
                  kind[s][c] == 1 ? kForward : kBackward);
        c = end + 1;
      }
    }
  }
  const double bottom = top + k * rh;
  svg->Text(kBarX, bottom + 14,
            absl::StrCat(cycles,
                         " clock cycles; each forward and each backward takes one; "
                         "grey = idle (the bubble)",
                         numbers ? "; numbers are micro-batches" : ""),
            absl::StrCat("font-size=\"10\" fill=\"", kMuted, "\""));
  return bottom + 24 - y;
}

}  // namespace

StatusOr<std::string> RenderSvg(const Model& model, const PlannerResult& result) {
  if (result.epochs.empty()) {
    return InvalidArgument("expected at least one planned epoch to draw, found none");
  }
  SvgWriter svg;
  const PlannerOptions& o = result.options;
  const int layers = model.layers();
  double y = 34;
  svg.Text(kLeft, y,
           absl::StrCat("weft-plan: ", model.title, " on ", o.machines, " \xC3\x97 ", o.devices,
                        " devices"),
           absl::StrCat("font-size=\"20\" font-weight=\"bold\" fill=\"", kInk, "\""));
  y += 22;
  svg.Text(
      kLeft, y,
      absl::StrFormat("%d units, %.2fM parameters; alpha %.3f, %s partition, K0 %d; "
                      "predicted %.2f\xC3\x97 over the static pipeline across %d epochs",
                      layers, model.total_params() / 1e6, o.alpha, pipe::StrategyName(o.strategy),
                      o.k0, result.overall_speedup, static_cast<int>(result.epochs.size())),
      absl::StrCat("font-size=\"13\" fill=\"", kMuted, "\""));
  y += 34;
  svg.Text(kLeft, y, "Partition over the epochs",
           absl::StrCat("font-size=\"15\" font-weight=\"bold\" fill=\"", kInk, "\""));
  const std::string small_muted = absl::StrCat("font-size=\"11\" fill=\"", kMuted, "\"");
  svg.Text(kPipelineX, y, "pipelines", small_muted);
  svg.Text(kSpeedupX, y, "speedup", small_muted);
  svg.Text(kNewRanksX, y, "new ranks", small_muted);
  y += 12;
  for (const EpochPlan& e : result.epochs) {
    DrawPartitionRow(&svg, model, e, y);
    y += kRowPitch;
  }
  svg.Text(kBarX, y + 4, absl::StrCat("unit 0: ", model.units.front().name),
           absl::StrCat("font-size=\"10\" fill=\"", kMuted, "\""));
  svg.Text(kBarX + kBarWidth, y + 4,
           absl::StrCat("unit ", layers - 1, ": ", model.units.back().name),
           absl::StrCat("font-size=\"10\" fill=\"", kMuted, "\""), "end");
  y += 22;
  // Legend.
  svg.Rect(kBarX, y, 18, 12, kStageColors[0]);
  svg.Rect(kBarX + 18, y, 18, 12, kStageColors[1]);
  svg.Text(kBarX + 42, y + 10, "trainable units, one colour per stage",
           absl::StrCat("font-size=\"11\" fill=\"", kInk, "\""));
  svg.Rect(kBarX + 270, y, 36, 12, kStageColors[0]);
  svg.Rect(kBarX + 270, y, 36, 12, "url(#frozen)");
  svg.Text(kBarX + 312, y + 10, "frozen units (forward only, or cached)",
           absl::StrCat("font-size=\"11\" fill=\"", kInk, "\""));
  svg.Line(kBarX + 540, y - 2, kBarX + 540, y + 14, kInk, 1.5);
  svg.Text(kBarX + 546, y + 10, "frozen prefix ends",
           absl::StrCat("font-size=\"11\" fill=\"", kInk, "\""));
  y += 40;

  std::vector<const EpochPlan*> shown = {&result.epochs.front()};
  if (result.epochs.size() > 1) shown.push_back(&result.epochs.back());
  svg.Text(kLeft, y, "Micro-batch schedule",
           absl::StrCat("font-size=\"15\" font-weight=\"bold\" fill=\"", kInk, "\""));
  svg.Rect(kBarX + 200, y - 10, 14, 12, kForward);
  svg.Text(kBarX + 220, y, "forward", absl::StrCat("font-size=\"11\" fill=\"", kInk, "\""));
  svg.Rect(kBarX + 280, y - 10, 14, 12, kBackward);
  svg.Text(kBarX + 300, y, "backward", absl::StrCat("font-size=\"11\" fill=\"", kInk, "\""));
  svg.Rect(kBarX + 370, y - 10, 14, 12, kIdle);
  svg.Text(kBarX + 390, y, "idle (bubble)", absl::StrCat("font-size=\"11\" fill=\"", kInk, "\""));
  y += 8;
  for (const EpochPlan* e : shown) {
    WEFT_ASSIGN_OR_RETURN(const double height, DrawTimeline(&svg, *e, o.cost.schedule, y));
    y += height + 8;
  }
  const double height = y + 10;

  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  absl::StrAppend(&out, "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"",
                  Num(kWidth), "\" height=\"", Num(height), "\" viewBox=\"0 0 ", Num(kWidth), " ",
                  Num(height),
                  "\" font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">\n");
  absl::StrAppend(&out, "<title>", XmlEscape(absl::StrCat("weft-plan: ", model.title)),
                  "</title>\n");
  out +=
      "<defs>\n"
      "<pattern id=\"frozen\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
      "patternTransform=\"rotate(45)\">\n"
      "<rect width=\"6\" height=\"6\" fill=\"#ffffff\" fill-opacity=\"0.55\"/>\n"
      "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#444444\" stroke-width=\"1.6\"/>\n"
      "</pattern>\n"
      "</defs>\n";
  absl::StrAppend(&out, "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n");
  out += svg.body();
  out += "</svg>\n";
  return out;
}

}  // namespace planner
}  // namespace weft
