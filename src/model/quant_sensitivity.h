// Mixed precision for `kettle convert --target-bpw`: how much each weight matters
// when quantized, and bits per weight chosen to meet a size budget.
//
// Sensitivity of a weight at b bits: the mean KL divergence, per calibration token,
// of the model's next-token distribution with that weight alone quantized (b bits,
// the convert's group size and fit, run through the affine kernels of the chosen
// device as a converted model runs) from the float model's. The allocation starts every weight
// at the fewest bits and, while the budget allows, takes the upgrade that saves the
// most KL per bit added (the weights' KLs taken as additive, as llama.cpp's and
// mlx-lm's mixed recipes take them).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/weight_store.h"
#include "tensor/affine_quant.h"

namespace kettle {

struct SensitivityOptions {
  std::vector<int> candidate_bits;  // ascending, each an affine width
  int group_size = 64;
  AffineFit fit = AffineFit::kLeastSquares;
  int64_t window = 512;  // calibration tokens per forward (at most the model's context)
  int threads = 0;       // CPU threads; 0: every core
  // Where the calibration forwards run (make_backend's names): a fresh backend per run, so
  // a GPU holds one candidate's weights at a time.
  std::string device = "cpu";
  // The type a weight's scales and biases will be written in, where not the tensor's own
  // (a rotated weight, held in f32, is written with its source's).
  std::map<std::string, DType> scale_types;
};

struct WeightSensitivity {
  std::string name;  // the tensor (`….weight`)
  int64_t parameters = 0;
  DType dtype = DType::kBF16;  // its float type, in which its scales and biases are stored
  std::vector<double> kl;      // per candidate: nats per calibration token
};

// Every weight of `model` (a float checkpoint) that convert would quantize, measured on
// `tokens` (at least 2). A weight the forward never reads gets zeros. progress(done, total)
// counts forwards.
std::vector<WeightSensitivity> measure_sensitivity(Model& model, const std::vector<int32_t>& tokens,
                                                   const SensitivityOptions& options,
                                                   const std::function<void(int64_t, int64_t)>& progress = {});

struct BitsAllocation {
  std::map<std::string, int> bits;  // tensor name → its bits
  double bits_per_weight = 0.0;     // of the whole checkpoint as it will be written
};

// Fails, naming the smallest reachable target, when `target_bpw` is below the bits per
// weight of the checkpoint in `store` with every weight convert quantizes at the fewest
// candidate bits (before calibrating: allocate_bits checks it again).
void check_target_bpw(const WeightStore& store, const SensitivityOptions& options, double target_bpw);

// Bits for each measured weight so the checkpoint in `store` stays within `target_bpw`
// over all its parameters (codes, scales and biases of the quantized weights; the other
// tensors at their own width).
BitsAllocation allocate_bits(const WeightStore& store, const std::vector<WeightSensitivity>& weights,
                             const SensitivityOptions& options, double target_bpw);

}  // namespace kettle
