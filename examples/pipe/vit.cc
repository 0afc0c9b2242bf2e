#include "examples/pipe/vit.h"

#include <ATen/ATen.h>
#include <torch/nn/init.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <string>

namespace weft {
namespace examples {
namespace {

// Xavier-uniform weights and zero biases, as ViT does for its linear layers (instead of
// LibTorch's Kaiming-uniform default, made for convolutional nets).
void InitLinear(const at::Tensor& weight, const at::Tensor& bias) {
  torch::NoGradGuard no_grad;
  torch::nn::init::xavier_uniform_(weight);
  torch::nn::init::zeros_(bias);
}

void InitLinear(const torch::nn::Linear& linear) { InitLinear(linear->weight, linear->bias); }

}  // namespace

TokenLinearImpl::TokenLinearImpl(int in, int out) {
  weight_ = register_parameter("weight", torch::empty({out, in}));
  bias_ = register_parameter("bias", torch::empty({out}));
  InitLinear(weight_, bias_);
}

at::Tensor TokenLinearImpl::forward(const at::Tensor& x) {
  // [B, T, in] -> [B, in, T] (a view; oneDNN takes it as is) -> [B, out, T] -> [B, T, out].
  return at::conv1d(x.transpose(1, 2), weight_.unsqueeze(-1), bias_).transpose(1, 2);
}

PatchEmbedImpl::PatchEmbedImpl(const VitConfig& config) {
  project_ = register_module(
      "project", torch::nn::Conv2d(torch::nn::Conv2dOptions(config.channels, config.dim,
                                                            config.patch)
                                       .stride(config.patch)));
  // Small random values (ViT uses std 0.02) so that positions are distinguishable from
  // the first step without swamping the patch content.
  class_token_ = register_parameter("class_token", torch::randn({1, 1, config.dim}) * 0.02);
  position_ =
      register_parameter("position", torch::randn({1, config.tokens(), config.dim}) * 0.02);
}

at::Tensor PatchEmbedImpl::forward(const at::Tensor& images) {
  // [B, D, h, w] -> [B, h*w, D]
  at::Tensor patches = project_->forward(images).flatten(2).transpose(1, 2);
  at::Tensor cls = class_token_.expand({patches.size(0), -1, -1});
  return at::cat({cls, patches}, 1) + position_;
}

AttentionHalfImpl::AttentionHalfImpl(int dim, int heads) : heads_(heads) {
  norm_ = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
  qkv_ = register_module("qkv", TokenLinear(dim, 3 * dim));
  out_ = register_module("out", TokenLinear(dim, dim));
}

at::Tensor AttentionHalfImpl::forward(const at::Tensor& x) {
  const int64_t b = x.size(0), t = x.size(1), d = x.size(2);
  const int64_t head_dim = d / heads_;
  // [B, T, 3D] -> [3, B, H, T, Dh]
  at::Tensor qkv = qkv_->forward(norm_->forward(x))
                       .reshape({b, t, 3, heads_, head_dim})
                       .permute({2, 0, 3, 1, 4});
  at::Tensor q = qkv[0], k = qkv[1], v = qkv[2];
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(head_dim));
  at::Tensor mixed = at::matmul(at::softmax(scores, -1), v);  // [B, H, T, Dh]
  return x + out_->forward(mixed.transpose(1, 2).reshape({b, t, d}));
}

MlpHalfImpl::MlpHalfImpl(int dim, int hidden) {
  norm_ = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
  fc1_ = register_module("fc1", TokenLinear(dim, hidden));
  fc2_ = register_module("fc2", TokenLinear(hidden, dim));
}

at::Tensor MlpHalfImpl::forward(const at::Tensor& x) {
  return x + fc2_->forward(at::gelu(fc1_->forward(norm_->forward(x))));
}

ClassifierHeadImpl::ClassifierHeadImpl(int dim, int classes) {
  norm_ = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
  head_ = register_module("head", torch::nn::Linear(dim, classes));
  InitLinear(head_);
}

at::Tensor ClassifierHeadImpl::forward(const at::Tensor& x) {
  return head_->forward(norm_->forward(x).select(1, 0));
}

torch::nn::Sequential MakeVit(const VitConfig& config, uint64_t seed) {
  TORCH_CHECK(config.image > 0 && config.patch > 0 && config.image % config.patch == 0,
              "VitConfig: image must be a positive multiple of patch");
  TORCH_CHECK(config.channels > 0 && config.dim > 0 && config.mlp > 0 && config.classes > 1,
              "VitConfig: channels, dim, mlp must be positive and classes >= 2");
  TORCH_CHECK(config.depth >= 1 && config.heads >= 1 && config.dim % config.heads == 0,
              "VitConfig: depth >= 1 and dim a multiple of heads");
  torch::manual_seed(seed);
  torch::nn::Sequential model;
  model->push_back("embed", PatchEmbed(config));
  for (int block = 0; block < config.depth; ++block) {
    model->push_back("attn" + std::to_string(block), AttentionHalf(config.dim, config.heads));
    model->push_back("mlp" + std::to_string(block), MlpHalf(config.dim, config.mlp));
  }
  model->push_back("head", ClassifierHead(config.dim, config.classes));
  return model;
}

}  // namespace examples
}  // namespace weft
