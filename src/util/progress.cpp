// ProgressBar: redraws at most ten times a second with a carriage return.
#include "util/progress.h"

#include <unistd.h>

#include <cstdio>

namespace kettle {

ProgressBar::ProgressBar(std::string label, int64_t total)
    : label_(std::move(label)), total_(total), enabled_(::isatty(STDERR_FILENO) == 1) {}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::update(int64_t done, const std::string& suffix) {
  if (!enabled_ || finished_) return;
  const double now = timer_.seconds();
  if (done < total_ && now - last_draw_ < 0.1) return;
  last_draw_ = now;
  constexpr int kWidth = 30;
  const int filled = total_ > 0 ? static_cast<int>(kWidth * done / total_) : kWidth;
  std::string bar(static_cast<size_t>(filled), '=');
  bar.resize(kWidth, ' ');
  std::fprintf(stderr, "\r%s [%s] %lld/%lld %.0fs %s\033[K", label_.c_str(), bar.c_str(), static_cast<long long>(done),
               static_cast<long long>(total_), now, suffix.c_str());
  std::fflush(stderr);
}

void ProgressBar::finish() {
  if (!enabled_ || finished_) return;
  finished_ = true;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
}

}  // namespace kettle
