// A read-only memory-mapped file: model weights are read in place, never copied.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kettle {

class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // throws kettle::Error naming the path
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Lets the kernel drop the pages of [begin, begin + bytes) of a read-only mapping from this
// process's memory (a streamed pass over a large file stays small); a later read maps
// them in again from the file. Only whole pages inside the range are dropped.
void release_pages(const void* begin, size_t bytes);

}  // namespace kettle
