// A small vision transformer for weft's elastic-pipeline demo (pipe/README.md),
// built as a torch::nn::Sequential of "layer groups": the unit that AutoFreeze freezes
// and that the balancer assigns to pipeline stages. Every group takes and returns ONE
// tensor, so any contiguous run of groups is a valid pipeline stage:
//
//   group 0           patch embedding + class token + position embedding  -> [B, T, D]
//   groups 1 .. 2d    per encoder block: the attention half, then the MLP half, each
//                     "x + f(LayerNorm(x))" with its own residual, so no stage boundary
//                     ever cuts a skip connection                       [B, T, D] -> [B, T, D]
//   group 2d + 1      final LayerNorm + class token + linear head         -> [B, classes]
//
// T = (image / patch)^2 + 1 tokens. No dropout: the pipeline and the single-process run
// must compute the same function, and AutoCache needs a deterministic frozen prefix.
#ifndef WEFT_EXAMPLES_PIPE_VIT_H_
#define WEFT_EXAMPLES_PIPE_VIT_H_

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <cstdint>

namespace weft {
namespace examples {

// The defaults are the demo's: 18 groups (so 8 pipeline stages have >= 2 groups each),
// one epoch of 4096 samples in about 7 s on one CPU thread, and a task (synthetic.h)
// that reaches >= 95% test accuracy within a few epochs.
struct VitConfig {
  int image = 16;     // square images, image x image pixels
  int patch = 4;      // square patches; image % patch == 0
  int channels = 3;
  int dim = 64;       // token width D
  int depth = 8;      // encoder blocks: 2 * depth + 2 groups
  int heads = 4;      // dim % heads == 0
  int mlp = 128;      // hidden width of the MLP half
  int classes = 10;

  int patches_per_side() const { return image / patch; }
  int tokens() const { return patches_per_side() * patches_per_side() + 1; }
  int groups() const { return 2 * depth + 2; }
};

// A linear map applied to every token of [B, T, in] -> [B, T, out], with nn::Linear's
// parameters (weight [out, in], bias [out]) but computed as a width-1 convolution. Why:
// the LibTorch 1.13 build this project links sends dense matmuls to a reference (netlib)
// BLAS, about 2 GFLOP/s on one thread, while convolutions go to oneDNN; the same
// arithmetic runs 4-8x faster (forward + backward) this way, which is what lets a 16-group
// model train in seconds per epoch on a 2-core machine.
class TokenLinearImpl : public torch::nn::Module {
 public:
  TokenLinearImpl(int in, int out);
  at::Tensor forward(const at::Tensor& x);
  const at::Tensor& weight() const { return weight_; }

 private:
  at::Tensor weight_;  // [out, in]
  at::Tensor bias_;    // [out]
};
TORCH_MODULE(TokenLinear);

// Group 0: non-overlapping patches -> tokens (a strided convolution is a linear map on
// each flattened patch), a learnable class token in front, learnable position embedding.
class PatchEmbedImpl : public torch::nn::Module {
 public:
  explicit PatchEmbedImpl(const VitConfig& config);
  // [B, C, H, W] -> [B, T, D]
  at::Tensor forward(const at::Tensor& images);

 private:
  torch::nn::Conv2d project_{nullptr};
  at::Tensor class_token_;  // [1, 1, D]
  at::Tensor position_;     // [1, T, D]
};
TORCH_MODULE(PatchEmbed);

// The attention half of a block: x + Wo * MultiHeadSelfAttention(LayerNorm(x)).
// Written with matmul/softmax rather than torch::nn::MultiheadAttention, whose C++ API
// is sequence-first ([T, B, D]) and returns a tuple: a group must map one tensor to one.
class AttentionHalfImpl : public torch::nn::Module {
 public:
  AttentionHalfImpl(int dim, int heads);
  at::Tensor forward(const at::Tensor& x);

 private:
  int heads_;
  torch::nn::LayerNorm norm_{nullptr};
  TokenLinear qkv_{nullptr};
  TokenLinear out_{nullptr};
};
TORCH_MODULE(AttentionHalf);

// The MLP half of a block: x + W2 * GELU(W1 * LayerNorm(x)).
class MlpHalfImpl : public torch::nn::Module {
 public:
  MlpHalfImpl(int dim, int hidden);
  at::Tensor forward(const at::Tensor& x);

 private:
  torch::nn::LayerNorm norm_{nullptr};
  TokenLinear fc1_{nullptr};
  TokenLinear fc2_{nullptr};
};
TORCH_MODULE(MlpHalf);

// The last group: LayerNorm, keep the class token, linear head. [B, T, D] -> [B, classes].
class ClassifierHeadImpl : public torch::nn::Module {
 public:
  ClassifierHeadImpl(int dim, int classes);
  at::Tensor forward(const at::Tensor& x);

 private:
  torch::nn::LayerNorm norm_{nullptr};
  torch::nn::Linear head_{nullptr};
};
TORCH_MODULE(ClassifierHead);

// Builds the model with config.groups() children (see the top of this file). The initial
// weights depend only on (config, seed): the global LibTorch generator is seeded with
// `seed` before the parameters are created (so this call resets it). Aborts (TORCH_CHECK)
// on an inconsistent config.
torch::nn::Sequential MakeVit(const VitConfig& config, uint64_t seed);

}  // namespace examples
}  // namespace weft

#endif  // WEFT_EXAMPLES_PIPE_VIT_H_
