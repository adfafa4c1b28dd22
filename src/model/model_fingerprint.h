// What names a model's KV on disk (the SSD tier's entries): a fingerprint of its
// config and weights — config.json and every safetensors file's name, size and
// header (its tensors' names, types, shapes and offsets), not the gigabytes of
// weights — and a hash of its tokenizer's files. Equal fingerprints: the same
// checkpoint, as far as anything short of reading every weight can tell.
#pragma once

#include <string>

namespace kettle {

struct ModelFingerprint {
  std::string weights;    // hex SHA-256
  std::string tokenizer;  // hex SHA-256
};

// `source`: a model folder, or "synthetic:<preset>" (named by its source alone).
ModelFingerprint model_fingerprint(const std::string& source);

// A model folder's name (its last path component, a trailing slash ignored): how serve
// names the model it serves and the disk tier names its directory.
std::string model_folder_name(const std::string& folder);

}  // namespace kettle
