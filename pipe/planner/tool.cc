#include "pipe/planner/tool.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <ostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "pipe/planner/svg.h"

namespace weft {
namespace planner {

std::string HelpText() {
  return R"(weft-plan: plans elastic pipelining with progressive freezing (AutoFreeze, AutoPipe,
AutoDP, AutoCache) before any training, and predicts its speedup over the static pipeline.

usage: weft-plan (--model NAME | --layers FILE) [options]
       weft-plan --list-models

model
  --model NAME        a preset computed from its hyper-parameters: vit-b16, vit-l16,
                      bert-base, bert-large, gpt2-small (or gpt2), gpt2-medium, gpt2-large,
                      gpt2-xl. Units: embed, every transformer block as an attention half
                      and an MLP half, head.
  --layers FILE       per-unit parameter counts and optional measured times: CSV with the
                      header "name,params" or "name,params,time", or JSON
                      [{"name": "embed", "params": 742656, "time": 0.0012}, ...].
                      time = forward + backward seconds per sample of the unit, trainable.
  --list-models       print the presets and their parameter counts, then exit

cluster and plan
  --machines N        machines (1); machines x devices at most 16384
  --devices N         devices per machine, one rank each (8)
  --k0 N              the initial pipeline length (default: --devices, capped at the world
                      and at the number of units)
  --alpha X           freeze rate in (0, 1]: after freeze point T the first
                      ceil(L (1 - (1 - alpha)^T)) units are frozen, the last never (1/3;
                      a fraction such as 1/3 is accepted)
  --epochs N          epochs, at most 10000; a freeze point before every epoch but the
                      first (10)
  --micro-batches N   micro-batches per mini-batch, at most 65536; 0 = 4 x K (0)
  --strategy S        the partition: optimal (default), greedy (the paper's walk), even
  --lambda X          the balancer's weight of a frozen unit, in [0, 1]; default what the
                      cost model charges for it: 1/3 (forward only), 0 with --cache; the
                      paper's value is 1/6
  --cache             AutoCache: the frozen prefix's output is read from a cache (frozen
                      units cost their forward once, when they freeze, plus the read)
  --no-autopipe       K stays K0 (frozen units still rebalanced): the ablation's "freeze only"
  --no-autodp         the static pipeline's replicas only; devices freed by AutoPipe idle
  --ablation          print the ablation: freeze only, + AutoPipe, + AutoPipe + AutoCache,
                      + AutoPipe + AutoDP, all four (overall speedups)
  --schedule S        gpipe (default) or 1f1b: the schedule drawn by --svg (the same
                      pipeline time in this model)
  --compare           plan with every strategy and print a comparison table

cost model
  --batch N           samples per pipeline replica per mini-batch (256)
  --global-batch      --batch is the mini-batch over all replicas (weft's runtime)
  --epoch-samples N   samples per epoch, for the transitions' share (1281167, ImageNet)
  --tokens N          tokens per sample (presets: ViT 197, BERT 384, GPT-2 1024; layer
                      files 512); not used when the units have measured times
  --flops X           FLOP/s of one device (11.2e12: the paper's Quadro RTX 5000, float32)
  --bandwidth X       bytes/s inside a machine (15.754e9: PCIe 3.0 x16, the paper's)
  --inter-bandwidth X bytes/s between machines (5e9: the paper's InfiniBand; 0: --bandwidth)
  --hidden N          values per token crossing a stage boundary (presets: their hidden
                      size; layer files: 0, no transfer costed)
  --cache-bandwidth X bytes/s of reading cached activations into a device (0: --bandwidth)
  --optimizer-bytes X optimizer state per trainable parameter moved at a transition (4)
  --compute-devices X all devices share this many devices' compute (0: each its own)

output
  --svg FILE          also draw the partition over the epochs and the micro-batch schedule
                      of the first and the last epoch, as an SVG picture
  -h, --help          this text

The cost model, per mini-batch step of a plan with K stages, R replicas, M micro-batches,
b samples per replica (pipe/planner/README.md has every term and its source):
  forward of a unit, per sample  = 2 x params x tokens / flops   (measured: time / 3)
  a trainable unit costs 3 x forward (forward + backward); a frozen one 1 x forward,
  or 0 in the pipeline with --cache
  stage time per micro-batch     = the sum over its units x b / M samples
  pipeline                       = (M + K - 1) x the largest stage time per micro-batch
                                   + 2 x the K - 1 hops of b / M activations (fill, drain)
  cache (--cache)                = b x (forward of the units frozen since the last epoch
                                   + tokens x hidden x 4 bytes / cache bandwidth)
  gradient sync (R > 1)          = 2 (R - 1) / R x 4 bytes x (the trainable parameters of
                                   all stages whose replicas span machines / inter-bandwidth,
                                   or the largest stage's inside a machine / bandwidth)
  step                           = max(pipeline + cache, work / compute devices) + sync
  throughput                     = R x b / step     samples/s
  transition                     = weights (+ optimizer state) a rank newly needs /
                                   inter-bandwidth
  overall                        = the static run's time / the elastic run's (epochs of
                                   --epoch-samples at each throughput, plus transitions)
Not modelled: memory, attention's tokens^2 term, embedding lookups (costed like matrix
products), overlap of the sync with the backward pass, framework overheads.

Output: per epoch, a table of stages and one line "PLAN key=value ..."; then a summary
table and one line "PLAN_SUMMARY key=value ...". With --compare: the comparison table and
one line "COMPARE key=value ..." per strategy.
Exit status: 0 success, 1 invalid input or plan, 2 a command line that does not parse.
)";
}

namespace {

Status ParseInt(const std::string& flag, const std::string& text, int* out) {
  if (!absl::SimpleAtoi(text, out) || text.empty() ||
      text.find_first_of(" \t+") != std::string::npos) {
    return InvalidArgument("expected an integer after ", flag, ", found '", text, "'");
  }
  return OkStatus();
}

// A finite decimal number, or a fraction "a/b" (for --alpha 1/3).
Status ParseReal(const std::string& flag, const std::string& text, double* out) {
  const std::vector<std::string> parts = absl::StrSplit(text, '/');
  if (parts.size() == 2) {
    double num = 0, den = 0;
    if (absl::SimpleAtod(parts[0], &num) && absl::SimpleAtod(parts[1], &den) &&
        std::isfinite(num) && std::isfinite(den) && den != 0 &&
        parts[0].find_first_of(" \t") == std::string::npos &&
        parts[1].find_first_of(" \t") == std::string::npos) {
      *out = num / den;
      return OkStatus();
    }
  } else if (parts.size() == 1 && !text.empty() && text.find_first_of(" \t") == std::string::npos) {
    double value = 0;
    if (absl::SimpleAtod(text, &value) && std::isfinite(value)) {
      *out = value;
      return OkStatus();
    }
  }
  return InvalidArgument("expected a number after ", flag, " (such as 0.25, 1e14 or 1/3), found '",
                         text, "'");
}

}  // namespace

StatusOr<CommandLine> ParseCommandLine(const std::vector<std::string>& args) {
  CommandLine cl;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i];
    std::string value;
    bool has_inline_value = false;
    if (flag.rfind("--", 0) == 0) {
      const size_t eq = flag.find('=');
      if (eq != std::string::npos) {
        value = flag.substr(eq + 1);
        flag = flag.substr(0, eq);
        has_inline_value = true;
      }
    }
    auto take_value = [&]() -> StatusOr<std::string> {
      if (has_inline_value) return value;
      if (i + 1 >= args.size()) {
        return InvalidArgument("expected a value after ", flag,
                               ", found the end of the "
                               "command line (see --help)");
      }
      return args[++i];
    };
    auto no_value = [&]() -> Status {
      if (has_inline_value) {
        return InvalidArgument("expected no value after ", flag, ", found '", value, "'");
      }
      return OkStatus();
    };
    PlannerOptions& o = cl.options;
    if (flag == "-h" || flag == "--help") {
      WEFT_RETURN_IF_ERROR(no_value());
      cl.help = true;
    } else if (flag == "--list-models") {
      WEFT_RETURN_IF_ERROR(no_value());
      cl.list_models = true;
    } else if (flag == "--compare") {
      WEFT_RETURN_IF_ERROR(no_value());
      cl.compare = true;
    } else if (flag == "--cache") {
      WEFT_RETURN_IF_ERROR(no_value());
      o.cost.cache = true;
    } else if (flag == "--no-autopipe") {
      WEFT_RETURN_IF_ERROR(no_value());
      o.autopipe = false;
    } else if (flag == "--no-autodp") {
      WEFT_RETURN_IF_ERROR(no_value());
      o.autodp = false;
    } else if (flag == "--global-batch") {
      WEFT_RETURN_IF_ERROR(no_value());
      o.cost.global_batch = true;
    } else if (flag == "--ablation") {
      WEFT_RETURN_IF_ERROR(no_value());
      cl.ablation = true;
    } else if (flag == "--model") {
      WEFT_ASSIGN_OR_RETURN(cl.model, take_value());
    } else if (flag == "--layers") {
      WEFT_ASSIGN_OR_RETURN(cl.layers, take_value());
    } else if (flag == "--svg") {
      WEFT_ASSIGN_OR_RETURN(cl.svg, take_value());
    } else if (flag == "--machines" || flag == "--devices" || flag == "--k0" ||
               flag == "--epochs" || flag == "--micro-batches") {
      WEFT_ASSIGN_OR_RETURN(const std::string text, take_value());
      int n = 0;
      WEFT_RETURN_IF_ERROR(ParseInt(flag, text, &n));
      if (flag == "--machines") o.machines = n;
      if (flag == "--devices") o.devices = n;
      if (flag == "--epochs") o.epochs = n;
      if (flag == "--micro-batches") o.micro_batches = n;
      if (flag == "--k0") {
        // 0 is the library's "default"; on the command line a K0 must be a length.
        if (n < 1) {
          return InvalidArgument(
              "expected --k0 >= 1 (the initial pipeline length; leave it "
              "out for the default), found ",
              n);
        }
        o.k0 = n;
      }
    } else if (flag == "--alpha" || flag == "--lambda" || flag == "--batch" || flag == "--tokens" ||
               flag == "--flops" || flag == "--bandwidth" || flag == "--inter-bandwidth" ||
               flag == "--hidden" || flag == "--cache-bandwidth" ||
               flag == "--optimizer-bytes" || flag == "--compute-devices" ||
               flag == "--epoch-samples") {
      WEFT_ASSIGN_OR_RETURN(const std::string text, take_value());
      double x = 0;
      WEFT_RETURN_IF_ERROR(ParseReal(flag, text, &x));
      if (flag == "--alpha") o.alpha = x;
      if (flag == "--lambda") o.lambda = x;
      if (flag == "--batch") o.cost.batch = x;
      if (flag == "--flops") o.cost.flops = x;
      if (flag == "--bandwidth") o.cost.bandwidth = x;
      if (flag == "--inter-bandwidth") o.cost.inter_bandwidth = x;
      if (flag == "--hidden") o.cost.hidden = x;
      if (flag == "--cache-bandwidth") o.cost.cache_bandwidth = x;
      if (flag == "--optimizer-bytes") o.cost.optimizer_bytes = x;
      if (flag == "--compute-devices") o.cost.compute_devices = x;
      if (flag == "--epoch-samples") o.epoch_samples = x;
      if (flag == "--tokens") {
        if (!(x > 0))
          return InvalidArgument("expected --tokens > 0 (tokens per sample), found ", x);
        o.cost.tokens = x;
      }
    } else if (flag == "--strategy") {
      WEFT_ASSIGN_OR_RETURN(const std::string text, take_value());
      StatusOr<pipe::Strategy> strategy = pipe::ParseStrategy(text);
      if (!strategy.ok()) {
        return InvalidArgument("expected --strategy optimal, greedy or even, found '", text, "'");
      }
      o.strategy = *strategy;
    } else if (flag == "--schedule") {
      WEFT_ASSIGN_OR_RETURN(const std::string text, take_value());
      if (text == "gpipe") {
        o.cost.schedule = pipe::ScheduleKind::kGPipe;
      } else if (text == "1f1b") {
        o.cost.schedule = pipe::ScheduleKind::kOneFOneB;
      } else {
        return InvalidArgument("expected --schedule gpipe or 1f1b, found '", text, "'");
      }
    } else {
      return InvalidArgument("unknown option '", args[i], "' (see --help for the options)");
    }
  }
  if (cl.help || cl.list_models) return cl;
  if (!cl.model.empty() && !cl.layers.empty()) {
    return InvalidArgument(
        "expected either --model or --layers, found both (give a preset "
        "or a layer file)");
  }
  if (cl.model.empty() && cl.layers.empty()) {
    return InvalidArgument(
        "expected --model NAME or --layers FILE, found neither (see "
        "--help; --list-models lists the presets)");
  }
  return cl;
}

namespace {

Status RunParsed(const CommandLine& cl, std::ostream& out, std::ostream& err) {
  if (cl.list_models) {
    for (const std::string& name : PresetNames()) {
      WEFT_ASSIGN_OR_RETURN(const Model model, MakePreset(name));
      out << absl::StrFormat("%-12s %-13s %3d units  %14s parameters  %4d tokens per sample\n",
                             name, model.title, model.layers(),
                             absl::StrFormat("%.2fM", model.total_params() / 1e6),
                             static_cast<int>(model.default_tokens));
    }
    return OkStatus();
  }
  Model model;
  if (!cl.model.empty()) {
    WEFT_ASSIGN_OR_RETURN(model, MakePreset(cl.model));
  } else {
    WEFT_ASSIGN_OR_RETURN(model, LoadLayerFile(cl.layers));
  }
  WEFT_ASSIGN_OR_RETURN(const PlannerResult result, RunPlanner(model, cl.options));
  if (cl.ablation) {
    WEFT_ASSIGN_OR_RETURN(const std::vector<AblationRow> rows, RunAblation(model, cl.options));
    out << FormatAblation(model, cl.options, rows);
  } else if (cl.compare) {
    std::vector<PlannerResult> results;
    for (pipe::Strategy s :
         {pipe::Strategy::kOptimal, pipe::Strategy::kGreedy, pipe::Strategy::kEven}) {
      PlannerOptions options = cl.options;
      options.strategy = s;
      StatusOr<PlannerResult> r = RunPlanner(model, options);
      if (!r.ok()) {
        return Annotate(r.status(), absl::StrCat("the ", pipe::StrategyName(s), " strategy"));
      }
      results.push_back(*std::move(r));
    }
    out << FormatComparison(model, results);
  } else {
    out << FormatReport(model, result);
  }
  if (!cl.svg.empty()) {
    WEFT_ASSIGN_OR_RETURN(const std::string svg, RenderSvg(model, result));
    std::ofstream file(cl.svg, std::ios::binary | std::ios::trunc);
    if (!file) {
      return FailedPrecondition("cannot write the picture to ", cl.svg, ": ", std::strerror(errno),
                                " (expected a writable path for --svg)");
    }
    file << svg;
    file.close();
    if (!file) return FailedPrecondition("writing ", cl.svg, " failed: ", std::strerror(errno));
    err << "weft-plan: drew the plan in " << cl.svg << "\n";
  }
  return OkStatus();
}

}  // namespace

int RunWeftPlan(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  StatusOr<CommandLine> cl = ParseCommandLine(args);
  if (!cl.ok()) {
    err << "weft-plan: " << cl.status().message() << "\n";
    return kExitUsage;
  }
  if (cl->help) {
    out << HelpText();
    return kExitOk;
  }
  const Status status = RunParsed(*cl, out, err);
  if (!status.ok()) {
    err << "weft-plan: " << status.message() << "\n";
    return kExitError;
  }
  return kExitOk;
}

}  // namespace planner
}  // namespace weft
