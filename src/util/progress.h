// A one-line progress bar on stderr for long work (loading, perplexity,
// converting). Silent when stderr is not a terminal, so logs and CI stay clean.
#pragma once

#include <cstdint>
#include <string>

#include "util/timer.h"

namespace kettle {

class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total);
  ~ProgressBar();
  void update(int64_t done, const std::string& suffix = "");
  void finish();

 private:
  std::string label_;
  int64_t total_;
  bool enabled_;
  bool finished_ = false;
  Timer timer_;
  double last_draw_ = -1.0;
};

}  // namespace kettle
