#include "pipe/planner/tool.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <ostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "pipe/planner/svg.h"
#include "tools/cli/flags.h"

namespace weft {
namespace planner {

namespace {

constexpr char kAbout[] =
    R"(weft-plan: plans elastic pipelining with progressive freezing (AutoFreeze, AutoPipe,
AutoDP, AutoCache) before any training, and predicts its speedup over the static pipeline.

usage: weft-plan (--model NAME | --layers FILE) [options]
       weft-plan --list-models)";

constexpr char kCostModel[] =
    R"(The cost model, per mini-batch step of a plan with K stages, R replicas, M micro-batches,
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

// Values the command line holds before they go into the CommandLine: the options the
// planner reads as enums, and lambda, which is unset unless given.
struct Raw {
  std::string strategy = "optimal";
  std::string schedule = "gpipe";
  double lambda = 1.0 / 3.0;
};

// weft-plan's options, bound to `cl` and `raw`. Ranges are left to the planner where it
// checks them (an invalid plan, exit status 1); the parser refuses what does not parse.
cli::FlagSet Flags(CommandLine* cl, Raw* raw) {
  PlannerOptions& o = cl->options;
  CostOptions& c = o.cost;
  cli::FlagSet flags("weft-plan", kAbout);
  flags.Section("model")
      .String("--model", &cl->model,
              "a preset computed from its hyper-parameters: vit-b16, vit-l16, bert-base, "
              "bert-large, gpt2-small (or gpt2), gpt2-medium, gpt2-large, gpt2-xl. Units: "
              "embed, every transformer block as an attention half and an MLP half, head.")
      .Value("NAME")
      .ShownDefault("")
      .String("--layers", &cl->layers,
              "per-unit parameter counts and optional measured times: CSV with the header "
              "\"name,params\" or \"name,params,time\", or JSON [{\"name\": \"embed\", "
              "\"params\": 742656, \"time\": 0.0012}, ...]. time: the forward and backward "
              "seconds per sample of the unit, trainable.")
      .Value("FILE")
      .ShownDefault("")
      .Set("--list-models", &cl->list_models, true,
           "print the presets and their parameter counts, then exit")
      .Section("cluster and plan")
      .Int("--machines", &o.machines, "machines; machines x devices at most 16384")
      .Int("--devices", &o.devices, "devices per machine, one rank each")
      .Int("--k0", &o.k0, "the initial pipeline length", 1)
      .ShownDefault("--devices, capped at the world and at the number of units")
      .Fraction("--alpha", &o.alpha,
                "freeze rate in (0, 1]: after freeze point T the first ceil(L(1-(1-alpha)^T)) "
                "of the L units are frozen, the last never; a fraction such as 1/3 is "
                "accepted")
      .ShownDefault("1/3")
      .Int("--epochs", &o.epochs,
           "epochs, at most 10000; a freeze point before every epoch but the first")
      .Int("--micro-batches", &o.micro_batches,
           "micro-batches per mini-batch, at most 65536; 0 = 4 x K")
      .String("--strategy", &raw->strategy,
              "the partition: optimal, greedy (the paper's walk) or even",
              {"optimal", "greedy", "even"})
      .Fraction("--lambda", &raw->lambda,
                "the balancer's weight of a frozen unit, in [0, 1]; the paper's value is 1/6")
      .ShownDefault("what the cost model charges for it: 1/3 (forward only), 0 with --cache")
      .Set("--cache", &c.cache, true,
           "AutoCache: the frozen prefix's output is read from a cache (frozen units cost "
           "their forward once, when they freeze, plus the read)")
      .Set("--no-autopipe", &o.autopipe, false,
           "K stays K0 (frozen units still rebalanced): the ablation's \"freeze only\"")
      .Set("--no-autodp", &o.autodp, false,
           "the static pipeline's replicas only; devices freed by AutoPipe idle")
      .Set("--ablation", &cl->ablation, true,
           "print the ablation: freeze only, + AutoPipe, + AutoPipe + AutoCache, + AutoPipe + "
           "AutoDP, all four (overall speedups)")
      .String("--schedule", &raw->schedule,
              "the schedule drawn by --svg (the same pipeline time in this model)",
              {"gpipe", "1f1b"})
      .Set("--compare", &cl->compare, true, "plan with every strategy and print a comparison table")
      .Section("cost model")
      .Fraction("--batch", &c.batch, "samples per pipeline replica per mini-batch")
      .Set("--global-batch", &c.global_batch, true,
           "--batch is the mini-batch over all replicas (weft's runtime)")
      .Fraction("--epoch-samples", &o.epoch_samples,
                "samples per epoch, for the transitions' share (ImageNet's)")
      .Fraction("--tokens", &c.tokens,
                "tokens per sample, > 0; not used when the units have measured times")
      .ShownDefault("presets: ViT 197, BERT 384, GPT-2 1024; layer files 512")
      .Fraction("--flops", &c.flops, "FLOP/s of one device (the paper's Quadro RTX 5000, float32)")
      .Fraction("--bandwidth", &c.bandwidth, "bytes/s inside a machine (PCIe 3.0 x16, the paper's)")
      .Fraction("--inter-bandwidth", &c.inter_bandwidth,
                "bytes/s between machines (the paper's InfiniBand); 0: --bandwidth")
      .Fraction("--hidden", &c.hidden,
                "values per token crossing a stage boundary; 0: the presets' hidden size, "
                "none for layer files (no transfer costed)")
      .Fraction("--cache-bandwidth", &c.cache_bandwidth,
                "bytes/s of reading cached activations into a device; 0: --bandwidth")
      .Fraction("--optimizer-bytes", &c.optimizer_bytes,
                "optimizer state per trainable parameter moved at a transition")
      .Fraction("--compute-devices", &c.compute_devices,
                "all devices share this many devices' compute; 0: each its own")
      .Section("output")
      .String("--svg", &cl->svg,
              "also draw the partition over the epochs and the micro-batch schedule of the "
              "first and the last epoch, as an SVG picture")
      .Value("FILE")
      .ShownDefault("")
      .Epilogue(kCostModel);
  return flags;
}

}  // namespace

std::string HelpText() {
  CommandLine cl;
  Raw raw;
  std::string help = Flags(&cl, &raw).Help();
  // FlagSet lists -h, --help itself nowhere: say it where the options end.
  const size_t end = help.find("\n\nThe cost model");
  help.insert(end == std::string::npos ? help.size() : end,
              "\n  -h, --help                this text");
  return help;
}

StatusOr<CommandLine> ParseCommandLine(const std::vector<std::string>& args) {
  CommandLine cl;
  Raw raw;
  cli::FlagSet flags = Flags(&cl, &raw);
  WEFT_RETURN_IF_ERROR(flags.Parse(args));
  if (flags.help_requested()) {
    cl.help = true;
    return cl;
  }
  PlannerOptions& o = cl.options;
  // 0 is the library's "default"; on the command line tokens must be a count.
  if (flags.given("--tokens") && !(o.cost.tokens > 0)) {
    return InvalidArgument("--tokens: ", o.cost.tokens,
                           " is out of range; expected > 0 (tokens per sample)");
  }
  if (flags.given("--lambda")) o.lambda = raw.lambda;
  WEFT_ASSIGN_OR_RETURN(o.strategy, pipe::ParseStrategy(raw.strategy));
  o.cost.schedule =
      raw.schedule == "1f1b" ? pipe::ScheduleKind::kOneFOneB : pipe::ScheduleKind::kGPipe;
  if (cl.list_models) return cl;
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
