// kv_config.json beside a model: the per-layer KV storage `--kv-quant config` applies
// (kv/kv_quant.h). Either a list or {"layers": [...]} of
//   {"layer_idx": L, "bits": 4 | 8, "group_size": G}
// (G 32, 64 or 128, dividing the head dim); a layer not listed keeps plain rows.
#pragma once

#include <string>

#include "kv/kv_quant.h"

namespace kettle {

// The policy of `model_dir`'s kv_config.json. Throws kettle::Error (kInvalidArgument)
// naming the file and the entry: a missing file, bad JSON, an unknown key, bits or group
// size it cannot take, a layer listed twice.
KvQuant read_kv_config(const std::string& model_dir);

}  // namespace kettle
