// A synthetic image classification task for the elastic-pipeline demo, generated on the
// fly and deterministically from (seed, split, sample id): the same id always gives the
// same image and label, so any rank can produce any sample, re-sharding needs no data
// movement, and AutoCache may cache the frozen prefix's output per sample id.
//
// The task. A pool of `m` "key" prototypes and a pool of distractor prototypes, each a
// patch-sized [C, p, p] pattern with zero mean per channel, are fixed by the seed. Class c
// is the c-th unordered pair {a, b} of key prototypes (m is the smallest pool with at
// least `classes` pairs: 5 for 10 classes). An image of class c shows key a and key b,
// plus two distractors, each on its own patch cell at a random position and each with a
// random sign and amplitude, on Gaussian noise. Why this shape:
//   - zero-mean prototypes: the mean pixel carries no class information;
//   - random signs: a linear classifier on the pixels (template matching summed over
//     positions) sees +/- cancel, so a per-patch nonlinearity is needed;
//   - pairs: no single patch decides the class; the class token must gather the two keys
//     from wherever they are, which is what self-attention does;
//   - patch-aligned placement and moderate noise keep it learnable in a few epochs.
#ifndef WEFT_EXAMPLES_PIPE_SYNTHETIC_H_
#define WEFT_EXAMPLES_PIPE_SYNTHETIC_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "examples/pipe/vit.h"

namespace weft {
namespace examples {

class SyntheticImages {
 public:
  // Train and test draw different images from the same prototypes (the same task).
  enum class Split { kTrain, kTest };

  // `size` samples (ids 0 .. size-1) of config.channels x config.image x config.image
  // images in config.classes classes, placed on the config.patch grid. `noise` is the
  // standard deviation of the background noise (prototype pixels have RMS 1). Aborts
  // (TORCH_CHECK) if the grid has fewer than 4 cells.
  SyntheticImages(int64_t size, const VitConfig& config, uint64_t seed,
                  Split split = Split::kTrain, float noise = 0.5f);

  int64_t size() const { return size_; }
  int classes() const { return classes_; }

  // Fills *images with a new [n, C, H, W] float tensor and *labels with a new [n] int64
  // tensor for the given sample ids (n = ids.size(); each id in [0, size()), else abort).
  void Get(const std::vector<int64_t>& ids, at::Tensor* images, at::Tensor* labels) const;

 private:
  // Writes sample `id` into image (C*H*W floats, CHW order) and returns its label.
  int64_t Generate(int64_t id, float* image) const;

  int64_t size_;
  int channels_, image_, patch_, classes_;
  uint64_t stream_;  // per-split seed of the per-sample generators
  float noise_;
  // Prototypes, each channels_ * patch_ * patch_ floats (CHW order).
  std::vector<std::vector<float>> keys_;
  std::vector<std::vector<float>> distractors_;
  // Class c shows keys pairs_[c].first and pairs_[c].second.
  std::vector<std::pair<int, int>> pairs_;
};

}  // namespace examples
}  // namespace weft

#endif  // WEFT_EXAMPLES_PIPE_SYNTHETIC_H_
