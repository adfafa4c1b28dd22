// `kettle convert SRC DST -q [--q-bits B] [--q-group-size G]`: a float checkpoint
// into MLX's affine-quantized layout (model/quantize_checkpoint.h), which kettle,
// mlx-lm and mlx-community's tools all load.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <optional>

#include "cli/commands.h"
#include "cli/options.h"
#include "model/quantize_checkpoint.h"
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
};

int run_convert(const ConvertFlags& f) {
  if (!f.quantize)
    fail(ErrorCategory::kInvalidArgument, "convert: nothing asked; -q (quantize) is the conversion it makes today");
  if (f.json) log::set_level(log::Level::kQuiet);
  QuantizeOptions options = f.options;
  options.fit = f.fit == "mlx" ? AffineFit::kMlx : AffineFit::kLeastSquares;
  const std::string src = model_or_default(f.src);
  Timer timer;
  std::optional<ProgressBar> bar;
  const QuantizeReport r = quantize_checkpoint(src, f.dst, options, [&](size_t done, size_t total) {
    if (f.json) return;
    if (!bar) bar.emplace("convert", static_cast<int64_t>(total));
    bar->update(static_cast<int64_t>(done));
  });
  if (bar) bar->finish();
  if (f.json) {
    const nlohmann::json out = {{"source", src},           {"destination", f.dst},      {"bits", f.options.bits},
                                {"group_size", f.options.group_size}, {"method", f.fit}, {"tensors", r.tensors},
                                {"quantized", r.quantized}, {"bytes_in", r.bytes_in}, {"bytes_out", r.bytes_out},
                                {"shards", r.shards},       {"seconds", timer.millis() / 1e3}};
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("%s: %lld weights quantized to %d bits (groups of %d), %.2f GB → %.2f GB in %d shard%s, %.1f s\n",
                f.dst.c_str(), static_cast<long long>(r.quantized), f.options.bits, f.options.group_size,
                static_cast<double>(r.bytes_in) / 1e9, static_cast<double>(r.bytes_out) / 1e9, r.shards,
                r.shards == 1 ? "" : "s", timer.millis() / 1e3);
  }
  return 0;
}

}  // namespace

Action register_convert(CLI::App& app) {
  auto f = std::make_shared<ConvertFlags>();
  app.add_option("src", f->src, "the float checkpoint's folder (or a local Hugging Face cache query)")->required();
  app.add_option("dst", f->dst, "the new folder to write (must not exist)")->required();
  app.add_flag("-q,--quantize", f->quantize, "quantize the weights (MLX affine layout)");
  app.add_option("--q-bits", f->options.bits, "bits per weight: 2, 3, 4, 5, 6 or 8")->capture_default_str();
  app.add_option("--q-group-size", f->options.group_size, "weights per scale and bias: 32, 64 or 128")
      ->capture_default_str();
  app.add_option("--q-method", f->fit,
                 "how each group's scale and bias are chosen: least-squares (lowest error), or mlx (mlx-lm's own codes)")
      ->check(CLI::IsMember({"least-squares", "mlx"}))
      ->capture_default_str();
  app.add_flag("--json", f->json, "print one JSON object");
  return [f] { return run_convert(*f); };
}

}  // namespace kettle::cli
