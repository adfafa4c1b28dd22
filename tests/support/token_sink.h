// A GenerationSink for engine tests: collects a generation's ids and its end report; a test
// may set `cancel` to cancel it.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/request.h"

namespace kettle::test_support {

class TokenSink final : public GenerationSink {
 public:
  void on_output(GenerationOutput output) override { tokens.insert(tokens.end(), output.ids.begin(), output.ids.end()); }
  void on_end(const GenerationEnd& e) override { end = e; }
  bool cancelled() const override { return cancel; }
  std::vector<int32_t> tokens;
  GenerationEnd end;
  bool cancel = false;
};

}  // namespace kettle::test_support
