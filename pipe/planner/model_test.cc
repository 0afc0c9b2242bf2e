#include "pipe/planner/model.h"

#include <cmath>
#include <string>

#include "gtest/gtest.h"

namespace weft {
namespace planner {
namespace {

::testing::AssertionResult MessageHas(const Status& status, const std::string& part) {
  if (status.ok()) return ::testing::AssertionFailure() << "OK, wanted an error with: " << part;
  if (std::string(status.message()).find(part) == std::string::npos) {
    return ::testing::AssertionFailure()
           << "\"" << status.message() << "\" lacks \"" << part << "\"";
  }
  return ::testing::AssertionSuccess();
}

// Exact totals: what the reference implementations report as sum(p.numel() for p in
// model.parameters()): timm's vit_base_patch16_224 (86,567,656) and vit_large_patch16_224
// (304,326,632); Hugging Face's BertModel (bert-base 109,482,240, bert-large 335,141,888)
// plus our 2-way output layer (2h + 2: 1,538 and 2,050); Hugging Face's GPT2Model, whose
// LM head is tied (124,439,808; 354,823,168; 774,030,080; 1,557,611,200). An exact match
// catches even a missing bias or LayerNorm (1,536 parameters in ViT-B/16, 0.002%).
struct Exact {
  const char* preset;
  double total;
  int blocks;
};
constexpr Exact kExact[] = {
    {"vit-b16", 86567656, 12},     {"vit-l16", 304326632, 24},    {"bert-base", 109483778, 12},
    {"bert-large", 335143938, 24}, {"gpt2-small", 124439808, 12}, {"gpt2-medium", 354823168, 24},
    {"gpt2-large", 774030080, 36}, {"gpt2-xl", 1557611200, 48},
};

TEST(PresetTest, TotalsMatchTheReferenceImplementationsExactly) {
  for (const Exact& e : kExact) {
    StatusOr<Model> m = MakePreset(e.preset);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->total_params(), e.total) << e.preset;
    EXPECT_EQ(m->layers(), 2 * e.blocks + 2) << e.preset;
  }
}

// The totals people quote. Tolerance 1%: the headlines are rounded to 2 or 3 significant
// figures (BERT-base's "110M" is 0.47% above its count), while the smallest mistake this
// check is meant to catch, one transformer block too many or too few, moves a total by at
// least 1.9% (GPT-2 XL: 30.7M of 1,557.6M), and an untied GPT-2 LM head by 25% or more.
// Sources: timm's model cards (ViT: 86.6M, 304.3M); the BERT paper (110M; its "340M" for
// BERT-large is 1.4% above the real count, so the Hugging Face card's 336M); OpenAI's
// released GPT-2 checkpoints (124M, 355M, 774M, 1558M; the GPT-2 paper's 117M/345M/762M/
// 1542M are known undercounts).
struct Headline {
  const char* preset;
  double millions;
};
constexpr Headline kHeadlines[] = {
    {"vit-b16", 86.6},   {"vit-l16", 304.3},   {"bert-base", 110},  {"bert-large", 336},
    {"gpt2-small", 124}, {"gpt2-medium", 355}, {"gpt2-large", 774}, {"gpt2-xl", 1558},
};

TEST(PresetTest, TotalsAreWithinOnePercentOfThePublishedHeadlines) {
  for (const Headline& h : kHeadlines) {
    StatusOr<Model> m = MakePreset(h.preset);
    ASSERT_TRUE(m.ok()) << m.status();
    const double relative = std::fabs(m->total_params() / 1e6 - h.millions) / h.millions;
    EXPECT_LT(relative, 0.01) << h.preset << ": " << m->total_params();
  }
}

TEST(PresetTest, UnitsAreEmbedBlockHalvesHead) {
  StatusOr<Model> vit = MakePreset("vit-b16");
  ASSERT_TRUE(vit.ok());
  ASSERT_EQ(vit->layers(), 26);
  EXPECT_EQ(vit->units[0].name, "embed");
  // 16x16x3 patch projection with bias + class token + 197 positions.
  EXPECT_EQ(vit->units[0].params, 768 * 768 + 768 + 768 + 197 * 768);
  EXPECT_EQ(vit->units[1].name, "block0.attn");
  // LayerNorm + QKV + output projection, with biases.
  EXPECT_EQ(vit->units[1].params, 2 * 768 + 3 * 768 * 768 + 3 * 768 + 768 * 768 + 768);
  EXPECT_EQ(vit->units[2].name, "block0.mlp");
  EXPECT_EQ(vit->units[2].params, 2 * 768 + 768 * 3072 + 3072 + 3072 * 768 + 768);
  EXPECT_EQ(vit->units[24].name, "block11.mlp");
  EXPECT_EQ(vit->units[25].name, "head");
  EXPECT_EQ(vit->units[25].params, 2 * 768 + 768 * 1000 + 1000);
  EXPECT_EQ(vit->default_tokens, 197);
  EXPECT_FALSE(vit->has_times());

  StatusOr<Model> bert = MakePreset("bert-base");
  ASSERT_TRUE(bert.ok());
  EXPECT_EQ(bert->units[0].params, (30522 + 512 + 2) * 768 + 2 * 768);
  EXPECT_EQ(bert->units.back().params, 768 * 768 + 768 + 768 * 2 + 2);
}

TEST(PresetTest, Gpt2CountsTheTiedLmHeadOnceAndSaysSo) {
  StatusOr<Model> gpt = MakePreset("gpt2");  // alias of gpt2-small
  ASSERT_TRUE(gpt.ok()) << gpt.status();
  EXPECT_EQ(gpt->name, "gpt2-small");
  EXPECT_EQ(gpt->units.back().name, "head");
  EXPECT_EQ(gpt->units.back().params, 2 * 768);  // the final LayerNorm only
  EXPECT_EQ(gpt->units.front().params, (50257 + 1024) * 768);
  EXPECT_EQ(gpt->default_tokens, 1024);
  bool says_tied = false;
  for (const std::string& note : gpt->notes) {
    if (note.find("tied") != std::string::npos) says_tied = true;
  }
  EXPECT_TRUE(says_tied);
}

TEST(PresetTest, UnknownNameListsThePresets) {
  StatusOr<Model> m = MakePreset("resnet50");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(MessageHas(m.status(), "unknown model 'resnet50'"));
  EXPECT_TRUE(MessageHas(m.status(), "vit-b16, vit-l16, bert-base"));
  EXPECT_TRUE(MessageHas(m.status(), "--layers FILE"));
  EXPECT_TRUE(MakePreset("ViT-B16").ok());  // case does not matter
}

// ---- CSV --------------------------------------------------------------------------------

TEST(LayerCsvTest, ParsesWithAndWithoutTimes) {
  StatusOr<Model> m = ParseLayerCsv("name,params\nembed, 100\n\nblock0,2e3\r\nhead,0\n", "a.csv");
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->layers(), 3);
  EXPECT_EQ(m->units[0].name, "embed");
  EXPECT_EQ(m->units[1].params, 2000);
  EXPECT_EQ(m->units[2].params, 0);
  EXPECT_FALSE(m->has_times());
  EXPECT_EQ(m->name, "a.csv");

  StatusOr<Model> t = ParseLayerCsv("Name, Params, Time\na,10,0.5\nb,20,1.5\n", "t.csv");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->has_times());
  EXPECT_EQ(t->times(), (std::vector<double>{0.5, 1.5}));
  EXPECT_EQ(t->params(), (std::vector<double>{10, 20}));
}

TEST(LayerCsvTest, BadFilesSayLineAndProblem) {
  const std::pair<const char*, const char*> cases[] = {
      {"",
       "a.csv: expected the header line 'name,params' or 'name,params,time', found an "
       "empty file"},
      {"name,params\n", "a.csv: expected at least one layer, found none"},
      {"embed,100\n", "a.csv: line 1: expected the header line"},
      {"name,size\nx,1\n",
       "line 1: expected the header line 'name,params' or "
       "'name,params,time', found 'name,size'"},
      {"name,params\nx,1,2\n",
       "a.csv: line 2: expected 2 comma-separated fields "
       "(name,params, as the header says), found 3"},
      {"name,params,time\nx,1\n", "line 2: expected 3 comma-separated fields"},
      {"name,params\nx,abc\n",
       "line 2: expected a number of parameters in the field params, "
       "found 'abc'"},
      {"name,params\nx,nan\n", "found 'nan'"},
      {"name,params\nx,1e999\n", "found '1e999'"},
      {"name,params\nx,12 34\n", "found '12 34'"},
      {"name,params\nx,-5\n", "line 2: expected params >= 0 (a parameter count), found -5"},
      {"name,params,time\nx,5,-1\n", "line 2: expected time >= 0"},
      {"name,params,time\nx,5,\n",
       "line 2: expected a time in seconds in the field time, "
       "found ''"},
      {"name,params\n,5\n", "line 2: expected a layer name in the first field"},
      {"name,params\n\"a\",5\n", "CSV quoting is not supported"},
  };
  const std::string long_name = "name,params\n" + std::string(1025, 'x') + ",5\n";
  StatusOr<Model> named = ParseLayerCsv(long_name, "a.csv");
  EXPECT_TRUE(MessageHas(named.status(),
                         "a.csv: line 2: expected a layer name of at most 1024 bytes, found one "
                         "of 1025"));
  EXPECT_LT(named.status().message().size(), 200u);  // the name is not repeated
  EXPECT_TRUE(ParseLayerCsv("name,params\n" + std::string(1024, 'x') + ",5\n", "a.csv").ok());
  for (const auto& c : cases) {
    StatusOr<Model> m = ParseLayerCsv(c.first, "a.csv");
    EXPECT_TRUE(MessageHas(m.status(), c.second)) << "input: " << c.first;
    if (!m.ok()) {
      EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
    }
  }
}

// ---- JSON -------------------------------------------------------------------------------

TEST(LayerJsonTest, ParsesWithAndWithoutTimes) {
  StatusOr<Model> m = ParseLayerJson(
      R"([{"name": "embed", "params": 742656}, {"params": 7087872, "name": "block0"}])", "m.json");
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->layers(), 2);
  EXPECT_EQ(m->units[1].name, "block0");
  EXPECT_EQ(m->units[1].params, 7087872);
  EXPECT_FALSE(m->has_times());

  StatusOr<Model> t = ParseLayerJson(
      R"([{"name": "a", "params": 1, "time": 0.25}, {"name": "b", "params": 2, "time": 0}])",
      "t.json");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->has_times());
}

TEST(LayerJsonTest, BadFilesSayLineColumnAndProblem) {
  const std::pair<const char*, const char*> cases[] = {
      {"[{\"name\": \"a\", \"params\": 1,}]",
       "m.json: line 1, column 28: expected a key after ',', found '}'"},
      {"[\n  {\"name\": \"a\" \"params\": 1}\n]",
       "m.json: line 2, column 16: expected ',' or '}' in an object"},
      {"{\"name\": \"a\", \"params\": 1}", "m.json: line 1, column 1: expected an array of layers"},
      {"[]", "m.json: expected at least one layer, found none"},
      {"[1]", "line 1, column 2: expected layer 0 to be an object"},
      {"[{\"name\": \"a\", \"parms\": 1}]",
       "line 1, column 25: expected only the keys name, params and time in layer 0, found "
       "\"parms\""},
      {"[{\"params\": 1}]", "line 1, column 2: expected a \"name\" in layer 0, found none"},
      {"[{\"name\": 5, \"params\": 1}]",
       "line 1, column 11: expected the name of layer 0 to be a non-empty string, found a "
       "number"},
      {"[{\"name\": \"\", \"params\": 1}]", "found an empty string"},
      {"[{\"name\": \"a\"}]", "expected \"params\" (the parameter count) in layer 0 (a)"},
      {"[{\"name\": \"a\", \"params\": \"12\"}]",
       "line 1, column 26: expected params of layer 0 (a) to be a number, found a string"},
      {"[{\"name\": \"a\", \"params\": -3}]",
       "line 1, column 26: expected params >= 0 for layer 0 (a), found -3"},
      {"[{\"name\": \"a\", \"params\": 3, \"time\": -1}]", "expected time >= 0 for layer 0 (a)"},
      {"[{\"name\": \"a\", \"params\": 3, \"time\": \"1s\"}]",
       "expected time of layer 0 (a) to be a number of seconds, found a string"},
      {"[{\"name\": \"a\", \"params\": 3, \"time\": 1},\n {\"name\": \"b\", \"params\": 3}]",
       "line 2, column 2: expected a \"time\" for every layer or for none, found layer 1 (b) "
       "without one"},
      {"[{\"name\": \"a\", \"params\": 3},\n {\"name\": \"b\", \"params\": 3, \"time\": 1}]",
       "found layer 1 (b) with one while an earlier layer is without"},
  };
  for (const auto& c : cases) {
    StatusOr<Model> m = ParseLayerJson(c.first, "m.json");
    EXPECT_TRUE(MessageHas(m.status(), c.second)) << "input: " << c.first;
    if (!m.ok()) {
      EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
    }
  }
  StatusOr<Model> named =
      ParseLayerJson("[{\"name\": \"" + std::string(2000, 'x') + "\", \"params\": 1}]", "m.json");
  EXPECT_TRUE(MessageHas(named.status(),
                         "m.json: line 1, column 11: expected the name of layer 0 to be at most "
                         "1024 bytes, found 2000"));
}

TEST(LayerTextTest, ChoosesTheFormatFromTheFirstCharacter) {
  StatusOr<Model> json = ParseLayerText("  \n[{\"name\": \"a\", \"params\": 1}]", "x");
  ASSERT_TRUE(json.ok()) << json.status();
  StatusOr<Model> csv = ParseLayerText("name,params\na,1\n", "x");
  ASSERT_TRUE(csv.ok()) << csv.status();
  // A JSON file with a syntax error is reported as JSON, with its column.
  EXPECT_TRUE(MessageHas(ParseLayerText("[{\"name\": 'a'}]", "x").status(),
                         "x: line 1, column 11: expected a value"));
}

TEST(LayerFileTest, LoadsTestdataAndReportsMissingFiles) {
  StatusOr<Model> csv = LoadLayerFile("pipe/planner/testdata/tiny.csv");
  ASSERT_TRUE(csv.ok()) << csv.status();
  EXPECT_EQ(csv->layers(), 6);
  EXPECT_TRUE(csv->has_times());
  StatusOr<Model> json = LoadLayerFile("pipe/planner/testdata/tiny.json");
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(json->layers(), 6);
  EXPECT_FALSE(json->has_times());
  StatusOr<Model> bad = LoadLayerFile("pipe/planner/testdata/bad_syntax.json");
  EXPECT_TRUE(MessageHas(bad.status(), "bad_syntax.json: line 3, column"));
  StatusOr<Model> missing = LoadLayerFile("pipe/planner/testdata/no_such_file.csv");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(MessageHas(missing.status(), "cannot open the layer file"));
}

}  // namespace
}  // namespace planner
}  // namespace weft
