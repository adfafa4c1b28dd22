// KvPool's block bookkeeping: per kind a reference count per block and a free
// list; the per-layer buffers double (copied once) when the free list is empty
// and the byte cap allows, else the reclaimer is asked to release some.
#include "kv/kv_pool.h"

#include <algorithm>
#include <limits>

#include "kv/kv_quant.h"
#include "util/error.h"

namespace kettle {

KvPool::KvPool(const KvLayout& layout, Backend& backend, Options options)
    : KvPool(layout, std::vector<Backend*>{&backend}, options) {}

KvPool::KvPool(const KvLayout& layout, const std::vector<Backend*>& backends, Options options)
    : backends_(backends),
      layout_(layout),
      block_size_(std::max(1, options.block_size)),
      max_bytes_(options.max_bytes),
      max_sequences_(options.max_sequences),
      max_step_(options.max_step),
      k_(backends.size()),
      v_(backends.size()) {
  for (size_t i = 0; i < layout.layers.size(); ++i) {
    const KvCodec& codec = layout.layers[i].codec;
    for (Backend* b : backends_)
      for (const KvRowCodec* rows : {&codec.key, &codec.value})
        if (layout.layers[i].kind != KvLayer::Kind::kNone && !b->runs_kv(*rows))
          fail(ErrorCategory::kUnsupported, "{} cannot keep KV rows as {} (layer {}; see --kv-quant)", b->name(),
               kv_codec_name(*rows), i);
    block_bytes_[0].push_back(static_cast<size_t>(block_size_) * layout.key_row_bytes(i));
    block_bytes_[1].push_back(static_cast<size_t>(block_size_) * layout.value_row_bytes(i));
  }
  for (size_t rank = 0; rank < backends.size(); ++rank) {
    k_[rank].resize(layout.layers.size());
    v_[rank].resize(layout.layers.size());
  }
  for (const KvLayer& layer : layout.layers) {
    if (layer.kind == KvLayer::Kind::kNone) {
      layer_kind_.push_back(kNoBlocks);
      continue;
    }
    const int kind = layer.kind == KvLayer::Kind::kWindow ? kWindow : kFull;
    layer_kind_.push_back(kind);
    ++layers_of_kind_[static_cast<size_t>(kind)];
    if (kind == kWindow) window_ = std::max<int64_t>(window_, layer.window);
  }
}

size_t KvPool::bytes_per_block(int kind) const {
  size_t bytes = 0;
  for (size_t layer = 0; layer < layer_kind_.size(); ++layer)
    if (layer_kind_[layer] == kind) bytes += block_bytes_[0][layer] + block_bytes_[1][layer];
  return bytes;
}

std::vector<unsigned char> KvPool::read_block(int kind, int32_t block) {
  std::vector<unsigned char> bytes(bytes_per_block(kind) * backends_.size());
  unsigned char* out = bytes.data();
  for (size_t rank = 0; rank < backends_.size(); ++rank)
    for (size_t layer = 0; layer < layer_kind_.size(); ++layer) {
      if (layer_kind_[layer] != kind) continue;
      for (int part = 0; part < 2; ++part) {
        const size_t n = block_bytes_[part][layer];
        backends_[rank]->to_host(out, (part == 0 ? k_ : v_)[rank][layer].data() + static_cast<size_t>(block) * n, n);
        out += n;
      }
    }
  return bytes;
}

void KvPool::write_block(int kind, int32_t block, std::span<const unsigned char> bytes) {
  if (bytes.size() != bytes_per_block(kind) * backends_.size())
    fail(ErrorCategory::kInvalidArgument, "a KV block of this pool is {} bytes, not {}",
         bytes_per_block(kind) * backends_.size(), bytes.size());
  const unsigned char* in = bytes.data();
  for (size_t rank = 0; rank < backends_.size(); ++rank)
    for (size_t layer = 0; layer < layer_kind_.size(); ++layer) {
      if (layer_kind_[layer] != kind) continue;
      for (int part = 0; part < 2; ++part) {
        const size_t n = block_bytes_[part][layer];
        backends_[rank]->to_device((part == 0 ? k_ : v_)[rank][layer].data() + static_cast<size_t>(block) * n, in, n);
        in += n;
      }
    }
}

// A window layer's query reads `window` rows back; a step writes up to max_step rows before
// attending; +1 for a window that starts mid-block.
int64_t KvPool::window_blocks_per_sequence() const {
  return (window_ + max_step_ + block_size_ - 1) / block_size_ + 1;
}

size_t KvPool::admission_bytes(int64_t tokens) const {
  const int kind = admitted_kind();
  int64_t blocks = (tokens + block_size_ - 1) / block_size_;
  if (kind == kWindow) blocks = std::min(blocks, window_blocks_per_sequence());
  return static_cast<size_t>(blocks) * bytes_per_block(kind);
}

size_t KvPool::admission_capacity() const {
  if (max_bytes_ == 0) return 0;
  const int kind = admitted_kind();
  return static_cast<size_t>(max_blocks(kind) - 1) * bytes_per_block(kind);
}

size_t KvPool::used_bytes() const {
  return static_cast<size_t>(used_[kFull]) * bytes_per_block(kFull) +
         static_cast<size_t>(used_[kWindow]) * bytes_per_block(kWindow);
}

size_t KvPool::allocated_bytes() const {
  return static_cast<size_t>(capacity_[kFull]) * bytes_per_block(kFull) +
         static_cast<size_t>(capacity_[kWindow]) * bytes_per_block(kWindow);
}

int64_t KvPool::max_blocks(int kind) const {
  const int64_t id_limit = std::numeric_limits<int32_t>::max() / block_size_;
  if (max_bytes_ == 0) return id_limit;
  if (max_sequences_ > 0 && has_kind(kFull) && has_kind(kWindow)) {  // the window kind's fixed share
    const auto window_share = std::min<int64_t>(static_cast<int64_t>(max_bytes_ / bytes_per_block(kWindow)),
                                                max_sequences_ * window_blocks_per_sequence());
    if (kind == kWindow) return window_share + 1;
    const size_t left = max_bytes_ - static_cast<size_t>(window_share) * bytes_per_block(kWindow);
    return std::min<int64_t>(id_limit, static_cast<int64_t>(left / bytes_per_block(kFull)) + 1);
  }
  const auto k = static_cast<size_t>(kind);
  const auto other_kind = static_cast<size_t>(kind == kFull ? kWindow : kFull);
  const size_t other = static_cast<size_t>(std::max<int64_t>(0, capacity_[other_kind] - 1)) * bytes_per_block(static_cast<int>(other_kind));
  if (other >= max_bytes_) return std::max<int64_t>(capacity_[k], 1);
  // + 1: block 0 (padding) is bookkeeping, not the budget's.
  return std::min<int64_t>(id_limit, static_cast<int64_t>((max_bytes_ - other) / bytes_per_block(kind)) + 1);
}

int64_t KvPool::available_blocks(int kind) const {
  const auto k = static_cast<size_t>(kind);
  // Block 0 (padding) is never handed out, grown or not.
  return static_cast<int64_t>(free_[k].size()) + std::max<int64_t>(0, max_blocks(kind) - std::max<int64_t>(capacity_[k], 1));
}

// Backend memory set to zero bytes (0.0 in f32 and f16, and in every quantized codec): one
// block's worth uploaded, then doubled by device copies.
void KvPool::zero(Backend& backend, unsigned char* data, size_t bytes, size_t block_bytes) {
  if (bytes == 0) return;
  const size_t first = std::min(bytes, block_bytes);
  const std::vector<unsigned char> zeros(first, 0);
  backend.to_device(data, zeros.data(), first);
  for (size_t done = first; done < bytes;) {
    const size_t n = std::min(done, bytes - done);
    backend.copy(data + done, data, n);
    done += n;
  }
}

bool KvPool::grow(int kind, int64_t blocks) {
  const auto k = static_cast<size_t>(kind);
  blocks = std::min(blocks, max_blocks(kind));
  if (blocks <= capacity_[k]) return false;
  for (size_t rank = 0; rank < backends_.size(); ++rank) {
    Backend& backend = *backends_[rank];
    for (size_t layer = 0; layer < layer_kind_.size(); ++layer) {
      if (layer_kind_[layer] != kind) continue;
      for (int part = 0; part < 2; ++part) {
        const size_t block_bytes = block_bytes_[part][layer];
        BackendArray<unsigned char> grown(backend, static_cast<size_t>(blocks) * block_bytes);
        BackendArray<unsigned char>& old = (part == 0 ? k_ : v_)[rank][layer];
        if (old.size() > 0) backend.copy(grown.data(), old.data(), old.bytes());
        // New blocks start as zeros: a kernel may read rows it then masks out (0 · NaN is NaN).
        zero(backend, grown.data() + old.size(), grown.size() - old.size(), block_bytes);
        old = std::move(grown);
      }
    }
  }
  refs_[k].resize(static_cast<size_t>(blocks), 0);
  for (int64_t id = blocks - 1; id >= std::max<int64_t>(1, capacity_[k]); --id) free_[k].push_back(static_cast<int32_t>(id));
  capacity_[k] = blocks;
  ++epoch_;
  return true;
}

void KvPool::preallocate() {
  for (int kind : {kFull, kWindow})
    if (has_kind(kind)) grow(kind, max_blocks(kind));
}

void KvPool::reserve(int kind, int64_t blocks) {
  const auto k = static_cast<size_t>(kind);
  const auto missing = blocks - static_cast<int64_t>(free_[k].size());
  if (missing > 0) grow(kind, std::max<int64_t>(capacity_[k], 1) + missing);
}

int32_t KvPool::allocate(int kind) {
  const auto k = static_cast<size_t>(kind);
  if (free_[k].empty()) grow(kind, std::max<int64_t>(16, capacity_[k] * 2));
  while (free_[k].empty() && reclaim_ && reclaim_()) {
  }
  if (free_[k].empty())
    fail(ErrorCategory::kResourceExhausted, "the KV cache is full ({} blocks of {} tokens, {} MiB): no block left",
         capacity_[k], block_size_, allocated_bytes() >> 20);
  const int32_t id = free_[k].back();
  free_[k].pop_back();
  refs_[k][static_cast<size_t>(id)] = 1;
  ++used_[k];
  return id;
}

void KvPool::retain(int kind, int32_t block) {
  if (block > 0) ++refs_[static_cast<size_t>(kind)][static_cast<size_t>(block)];
}

void KvPool::release(int kind, int32_t block) {
  if (block <= 0) return;
  const auto k = static_cast<size_t>(kind);
  if (--refs_[k][static_cast<size_t>(block)] == 0) {
    free_[k].push_back(block);
    --used_[k];
  }
}

}  // namespace kettle
