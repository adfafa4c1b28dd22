// `kettle convert SRC DST -q [--q-bits B] [--q-group-size G]`: a float checkpoint
// into MLX's affine-quantized layout (model/quantize_checkpoint.h), which kettle,
// mlx-lm and mlx-community's tools all load. Mixed precision: `--target-bpw B
// --calibration FILE [--candidate-bits 4,8] [--n-calibration N]` measures each weight's
// sensitivity on the calibration text and picks its bits (model/quant_sensitivity.h).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "cli/commands.h"
#include "cli/options.h"
#include "model/model.h"
#include "model/quant_sensitivity.h"
#include "model/quantize_checkpoint.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/log.h"
#include "util/progress.h"
#include "util/timer.h"

namespace kettle::cli {
namespace {

struct ConvertFlags {
  std::string src;
  std::string dst;
  bool quantize = false;
  QuantizeOptions options;
  std::string fit = "least-squares";
  bool json = false;
  bool bits_given = false;  // --q-bits on the command line
  bool group_given = false, method_given = false, seed_given = false;
  // Mixed precision.
  double target_bpw = 0.0;
  bool target_given = false;
  std::vector<int> candidate_bits = {4, 8};
  bool candidates_given = false;
  std::string calibration;
  int64_t n_calibration = 1024;
  bool n_calibration_given = false;
  ThreadOption threads;
  DeviceOption device;  // where calibration runs
  bool device_given = false;
};

void check_mixed_flags(const ConvertFlags& f) {
  if (!f.target_given) {
    for (const auto& [given, flag] : {std::pair{!f.calibration.empty(), "--calibration"},
                                      std::pair{f.candidates_given, "--candidate-bits"},
                                      std::pair{f.n_calibration_given, "--n-calibration"}})
      if (given) fail(ErrorCategory::kInvalidArgument, "{} applies to mixed precision; add --target-bpw", flag);
    if (f.device_given)
      fail(ErrorCategory::kInvalidArgument, "--device applies to mixed precision's calibration; add --target-bpw");
    return;
  }
  if (!(f.target_bpw > 0.0 && f.target_bpw <= 32.0))
    fail(ErrorCategory::kInvalidArgument, "--target-bpw {}: bits per weight between 0 and 32", f.target_bpw);
  if (f.calibration.empty())
    fail(ErrorCategory::kInvalidArgument, "--target-bpw {}: mixed precision needs --calibration FILE (text to measure "
         "each weight's sensitivity on)", f.target_bpw);
  if (f.bits_given)
    fail(ErrorCategory::kInvalidArgument, "--q-bits and --target-bpw: give one (--candidate-bits lists the widths "
         "mixed precision picks from)");
  for (int bits : f.candidate_bits)
    if (!affine_bits_supported(bits))
      fail(ErrorCategory::kInvalidArgument, "--candidate-bits {}: affine quantization takes 2, 3, 4, 5, 6 or 8 bits", bits);
  if (f.n_calibration < 2) fail(ErrorCategory::kInvalidArgument, "--n-calibration {}: at least 2 tokens", f.n_calibration);
  if (!std::filesystem::is_regular_file(f.calibration))
    fail(ErrorCategory::kNotFound, "--calibration {}: no such file", f.calibration);
}

// The first n tokens of the calibration file, as the model's tokenizer reads it.
std::vector<int32_t> calibration_tokens(const std::string& model, const std::string& file, int64_t n) {
  std::ifstream in(file, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in && !in.eof()) fail(ErrorCategory::kInvalidArgument, "--calibration {}: cannot read", file);
  std::vector<int32_t> ids = Tokenizer::from_file(model).encode(text.str(), true);
  if (ids.size() < 2) fail(ErrorCategory::kInvalidArgument, "--calibration {}: {} tokens; at least 2 are needed", file,
                           ids.size());
  if (static_cast<int64_t>(ids.size()) > n) ids.resize(static_cast<size_t>(n));
  return ids;
}

// Bits per weight from each weight's sensitivity; the most common width becomes the
// default, the others per-tensor.
void choose_mixed_bits(const ConvertFlags& f, const std::string& src, QuantizeOptions& options) {
  SensitivityOptions s;
  s.candidate_bits = f.candidate_bits;
  std::sort(s.candidate_bits.begin(), s.candidate_bits.end());
  s.candidate_bits.erase(std::unique(s.candidate_bits.begin(), s.candidate_bits.end()), s.candidate_bits.end());
  s.group_size = options.group_size;
  s.fit = options.fit;
  s.threads = options.threads;
  s.device = f.device.device;
  options.choose_bits = [&f, s, src](Model& model, const std::map<std::string, DType>& scale_types) {
    SensitivityOptions o = s;
    o.scale_types = scale_types;
    const WeightStore& store = *model.store;
    check_target_bpw(store, o, f.target_bpw);
    const std::vector<int32_t> tokens = calibration_tokens(src, f.calibration, f.n_calibration);
    std::optional<ProgressBar> bar;
    const auto measured = measure_sensitivity(model, tokens, o, [&](int64_t done, int64_t total) {
      if (f.json) return;
      if (!bar) bar.emplace("sensitivity", total);
      bar->update(done);
    });
    if (bar) bar->finish();
    const BitsAllocation a = allocate_bits(store, measured, o, f.target_bpw);
    log::info("mixed precision: {:.3f} bits per weight of the {} asked, from {} calibration tokens", a.bits_per_weight,
              f.target_bpw, tokens.size());
    return a.bits;
  };
}

int run_convert(const ConvertFlags& f) {
  if (!f.quantize && !f.options.rotate)
    fail(ErrorCategory::kInvalidArgument, "convert: nothing asked; -q (quantize) and --rotate-weights are the "
         "conversions it makes");
  if (!f.quantize)
    for (const auto& [given, flag] : {std::pair{f.bits_given, "--q-bits"}, std::pair{f.group_given, "--q-group-size"},
                                      std::pair{f.method_given, "--q-method"}, std::pair{f.target_given, "--target-bpw"}})
      if (given) fail(ErrorCategory::kInvalidArgument, "{} applies to quantizing; add -q", flag);
  if (f.seed_given && !f.options.rotate)
    fail(ErrorCategory::kInvalidArgument, "--rotation-seed applies to --rotate-weights");
  if (f.json) log::set_level(log::Level::kQuiet);
  check_mixed_flags(f);
  QuantizeOptions options = f.options;
  options.quantize = f.quantize;
  options.fit = f.fit == "mlx" ? AffineFit::kMlx : AffineFit::kLeastSquares;
  options.threads = f.threads.resolve();
  const std::string src = model_or_default(f.src);
  if (f.target_given) choose_mixed_bits(f, src, options);
  Timer timer;
  std::optional<ProgressBar> bar;
  const QuantizeReport r = quantize_checkpoint(src, f.dst, options, [&](size_t done, size_t total) {
    if (f.json) return;
    if (!bar) bar.emplace("convert", static_cast<int64_t>(total));
    bar->update(static_cast<int64_t>(done));
  });
  if (bar) bar->finish();
  if (f.json) {
    nlohmann::json at_bits = nlohmann::json::object();
    for (const auto& [bits, n] : r.weights_at_bits) at_bits[std::to_string(bits)] = n;
    nlohmann::json out = {{"source", src},           {"destination", f.dst},      {"bits", r.bits},
                          {"group_size", f.options.group_size}, {"method", f.fit}, {"tensors", r.tensors},
                          {"quantized", r.quantized}, {"weights_at_bits", at_bits},
                          {"bits_per_weight", r.bits_per_weight}, {"bytes_in", r.bytes_in},
                          {"bytes_out", r.bytes_out}, {"shards", r.shards}, {"seconds", timer.millis() / 1e3}};
    out["rotation_seed"] = f.options.rotate ? nlohmann::json(f.options.rotation_seed) : nlohmann::json(nullptr);
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::string widths;
    for (const auto& [bits, n] : r.weights_at_bits)
      widths += fmt::format("{}{} at {} bits", widths.empty() ? "" : ", ", n, bits);
    const std::string what =
        (f.options.rotate ? fmt::format("rotated (seed {}){}", f.options.rotation_seed, f.quantize ? ", " : "") : "") +
        (f.quantize ? fmt::format("{} weights quantized ({}; groups of {})", r.quantized, widths, f.options.group_size)
                    : std::string(" as f32"));
    std::printf("%s: %s, %.2f bits per weight, %.2f GB → %.2f GB in %d shard%s, %.1f s\n", f.dst.c_str(), what.c_str(),
                r.bits_per_weight, static_cast<double>(r.bytes_in) / 1e9, static_cast<double>(r.bytes_out) / 1e9,
                r.shards, r.shards == 1 ? "" : "s", timer.millis() / 1e3);
  }
  return 0;
}

}  // namespace

Action register_convert(CLI::App& app) {
  auto f = std::make_shared<ConvertFlags>();
  app.add_option("src", f->src, "the float checkpoint's folder (or a local Hugging Face cache query)")->required();
  app.add_option("dst", f->dst, "the new folder to write (must not exist)")->required();
  app.add_flag("-q,--quantize", f->quantize, "quantize the weights (MLX affine layout)");
  app.add_option("--q-bits", f->options.bits, "bits per weight: 2, 3, 4, 5, 6 or 8")
      ->capture_default_str()
      ->each([f](const std::string&) { f->bits_given = true; });
  app.add_option("--q-group-size", f->options.group_size, "weights per scale and bias: 32, 64 or 128")
      ->capture_default_str()
      ->each([f](const std::string&) { f->group_given = true; });
  app.add_option("--q-method", f->fit,
                 "how each group's scale and bias are chosen: least-squares (lowest error), or mlx (mlx-lm's own codes)")
      ->check(CLI::IsMember({"least-squares", "mlx"}))
      ->capture_default_str()
      ->each([f](const std::string&) { f->method_given = true; });
  app.add_option("--target-bpw", f->target_bpw,
                 "mixed precision: bits per weight in all (codes, scales and biases), each weight's bits chosen by its "
                 "sensitivity on --calibration")
      ->each([f](const std::string&) { f->target_given = true; });
  app.add_option("--candidate-bits", f->candidate_bits, "mixed precision: the widths to choose from (default 4,8)")
      ->delimiter(',')
      ->each([f](const std::string&) { f->candidates_given = true; });
  app.add_option("--calibration", f->calibration, "mixed precision: a text file to measure sensitivity on");
  app.add_option("--n-calibration", f->n_calibration, "mixed precision: calibration tokens used (its first N)")
      ->capture_default_str()
      ->each([f](const std::string&) { f->n_calibration_given = true; });
  app.add_flag("--rotate-weights", f->options.rotate,
               "fold a random Hadamard rotation of the residual stream into the weights (the float model's function "
               "unchanged; outlier channels spread out before quantizing). Without -q, writes the rotated weights as f32");
  app.add_option("--rotation-seed", f->options.rotation_seed, "the rotation's random signs")
      ->capture_default_str()
      ->each([f](const std::string&) { f->seed_given = true; });
  f->threads.add_to(app);
  f->device.add_device_to(app, "where mixed precision's calibration forwards run");
  app.get_option("--device")->each([f](const std::string&) { f->device_given = true; });
  app.add_flag("--json", f->json, "print one JSON object");
  return [f] { return run_convert(*f); };
}

}  // namespace kettle::cli
