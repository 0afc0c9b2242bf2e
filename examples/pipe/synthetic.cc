#include "examples/pipe/synthetic.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>

namespace weft {
namespace examples {
namespace {

constexpr int kDistractorPool = 4;
constexpr int kDistractorsPerImage = 2;

// SplitMix64's finalizer: decorrelates nearby seeds and ids before they seed an
// mt19937_64, whose outputs for seeds 1, 2, 3... are otherwise not well mixed.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A random patch pattern with zero mean per channel and RMS 1 over the patch.
std::vector<float> MakePrototype(int channels, int patch, std::mt19937_64* rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int area = patch * patch;
  std::vector<float> proto(static_cast<size_t>(channels) * area);
  for (float& v : proto) v = normal(*rng);
  double square_sum = 0.0;
  for (int c = 0; c < channels; ++c) {
    float* begin = proto.data() + static_cast<size_t>(c) * area;
    double mean = 0.0;
    for (int i = 0; i < area; ++i) mean += begin[i];
    mean /= area;
    for (int i = 0; i < area; ++i) {
      begin[i] -= static_cast<float>(mean);
      square_sum += static_cast<double>(begin[i]) * begin[i];
    }
  }
  const float scale = static_cast<float>(1.0 / std::sqrt(square_sum / proto.size() + 1e-12));
  for (float& v : proto) v *= scale;
  return proto;
}

}  // namespace

SyntheticImages::SyntheticImages(int64_t size, const VitConfig& config, uint64_t seed,
                                 Split split, float noise)
    : size_(size),
      channels_(config.channels),
      image_(config.image),
      patch_(config.patch),
      classes_(config.classes),
      stream_(Mix(Mix(seed) ^ (split == Split::kTrain ? 0x7472616eULL : 0x74657374ULL))),
      noise_(noise) {
  TORCH_CHECK(size >= 0, "SyntheticImages: negative size");
  TORCH_CHECK(config.patch > 0 && config.image % config.patch == 0,
              "SyntheticImages: image must be a multiple of patch");
  const int cells = config.patches_per_side() * config.patches_per_side();
  TORCH_CHECK(cells >= 2 + kDistractorsPerImage, "SyntheticImages: need at least ",
              2 + kDistractorsPerImage, " patch cells, got ", cells);
  TORCH_CHECK(classes_ >= 2, "SyntheticImages: need at least 2 classes");
  // The smallest key pool with enough pairs; classes beyond the last pair cannot exist.
  int keys = 2;
  while (keys * (keys - 1) / 2 < classes_) ++keys;
  for (int a = 0; a < keys && static_cast<int>(pairs_.size()) < classes_; ++a) {
    for (int b = a + 1; b < keys && static_cast<int>(pairs_.size()) < classes_; ++b) {
      pairs_.emplace_back(a, b);
    }
  }
  // Prototypes depend on the seed only, never on the split: train and test are one task.
  std::mt19937_64 rng(Mix(seed));
  for (int i = 0; i < keys; ++i) keys_.push_back(MakePrototype(channels_, patch_, &rng));
  for (int i = 0; i < kDistractorPool; ++i) {
    distractors_.push_back(MakePrototype(channels_, patch_, &rng));
  }
}

int64_t SyntheticImages::Generate(int64_t id, float* image) const {
  std::mt19937_64 rng(Mix(stream_ ^ Mix(static_cast<uint64_t>(id))));
  std::normal_distribution<float> normal(0.0f, noise_);
  std::uniform_real_distribution<float> amplitude(0.7f, 1.3f);
  const int64_t label = std::uniform_int_distribution<int64_t>(0, classes_ - 1)(rng);

  const int plane = image_ * image_;
  const int total = channels_ * plane;
  for (int i = 0; i < total; ++i) image[i] = normal(rng);

  // Distinct cells for the two keys and the distractors: a partial Fisher-Yates shuffle.
  const int side = image_ / patch_;
  std::vector<int> cells(side * side);
  for (int i = 0; i < static_cast<int>(cells.size()); ++i) cells[i] = i;
  const int shown = 2 + kDistractorsPerImage;
  for (int i = 0; i < shown; ++i) {
    const int j = std::uniform_int_distribution<int>(i, static_cast<int>(cells.size()) - 1)(rng);
    std::swap(cells[i], cells[j]);
  }
  auto place = [&](const std::vector<float>& proto, int cell) {
    const float scale = ((rng() & 1) ? 1.0f : -1.0f) * amplitude(rng);
    const int row0 = (cell / side) * patch_, col0 = (cell % side) * patch_;
    for (int c = 0; c < channels_; ++c) {
      for (int r = 0; r < patch_; ++r) {
        float* dst = image + c * plane + (row0 + r) * image_ + col0;
        const float* src = proto.data() + (c * patch_ + r) * patch_;
        for (int k = 0; k < patch_; ++k) dst[k] += scale * src[k];
      }
    }
  };
  place(keys_[pairs_[label].first], cells[0]);
  place(keys_[pairs_[label].second], cells[1]);
  for (int i = 0; i < kDistractorsPerImage; ++i) {
    const int which = std::uniform_int_distribution<int>(0, kDistractorPool - 1)(rng);
    place(distractors_[which], cells[2 + i]);
  }
  return label;
}

void SyntheticImages::Get(const std::vector<int64_t>& ids, at::Tensor* images,
                          at::Tensor* labels) const {
  const int64_t n = static_cast<int64_t>(ids.size());
  *images = at::empty({n, channels_, image_, image_}, at::kFloat);
  *labels = at::empty({n}, at::kLong);
  float* image_data = images->data_ptr<float>();
  int64_t* label_data = labels->data_ptr<int64_t>();
  const int64_t stride = static_cast<int64_t>(channels_) * image_ * image_;
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(ids[i] >= 0 && ids[i] < size_, "SyntheticImages: id ", ids[i],
                " out of range [0, ", size_, ")");
    label_data[i] = Generate(ids[i], image_data + i * stride);
  }
}

}  // namespace examples
}  // namespace weft
