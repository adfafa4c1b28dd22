// safetensors output (format: huggingface/safetensors README): an 8-byte
// little-endian header length, the JSON header padded with spaces to a multiple
// of 8, then the tensors' bytes back to back.
#include "model/safetensors_writer.h"

#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "util/error.h"

namespace kettle {

SafetensorsWriter::SafetensorsWriter(const std::string& path, std::vector<PlannedTensor> tensors,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path), tensors_(std::move(tensors)) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (const PlannedTensor& t : tensors_) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes}}};
    offset += t.bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  file_ = std::fopen(path.c_str(), "wb");
  if (file_ == nullptr) fail(ErrorCategory::kInvalidArgument, "cannot create {}: {}", path, std::strerror(errno));
  const uint64_t length = text.size();
  unsigned char prefix[8];
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<unsigned char>(length >> (8 * i));
  if (std::fwrite(prefix, 1, 8, file_) != 8 || std::fwrite(text.data(), 1, text.size(), file_) != text.size())
    fail(ErrorCategory::kResourceExhausted, "writing {}: {}", path, std::strerror(errno));
}

SafetensorsWriter::~SafetensorsWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void SafetensorsWriter::write(const void* data, size_t bytes) {
  while (current_ < tensors_.size() && written_ == tensors_[current_].bytes) {
    ++current_;
    written_ = 0;
  }
  if (current_ == tensors_.size() || written_ + bytes > tensors_[current_].bytes)
    fail(ErrorCategory::kInternal, "{}: more bytes written than planned for '{}'", path_,
         current_ < tensors_.size() ? tensors_[current_].name : "(past the last tensor)");
  if (bytes > 0 && std::fwrite(data, 1, bytes, file_) != bytes)
    fail(ErrorCategory::kResourceExhausted, "writing {}: {}", path_, std::strerror(errno));
  written_ += bytes;
}

void SafetensorsWriter::finish() {
  while (current_ < tensors_.size() && written_ == tensors_[current_].bytes) {
    ++current_;
    written_ = 0;
  }
  if (current_ != tensors_.size())
    fail(ErrorCategory::kInternal, "{}: tensor '{}' was not written whole", path_, tensors_[current_].name);
  const bool ok = std::fflush(file_) == 0 && ::fsync(fileno(file_)) == 0;
  const int err = errno;
  std::fclose(file_);
  file_ = nullptr;
  if (!ok) fail(ErrorCategory::kResourceExhausted, "writing {}: {}", path_, std::strerror(err));
}

}  // namespace kettle
