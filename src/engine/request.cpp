#include "engine/request.h"

namespace kettle {

SamplingParams default_sampling(const GenerationDefaults& d) {
  SamplingParams p;
  // transformers adds RepetitionPenaltyLogitsProcessor whether or not it samples.
  p.repetition_penalty = d.repetition_penalty;
  if (!d.do_sample) return p;  // greedy
  p.temperature = d.temperature;
  p.top_k = d.top_k;
  p.top_p = d.top_p;
  p.min_p = d.min_p;
  return p;
}

}  // namespace kettle
