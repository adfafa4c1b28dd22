// CudaBackend::run_step: a step under its StepContext, recorded as a CUDA graph
// on its second sighting (the first runs eagerly, sizing workspaces) and
// replayed after.
#include <algorithm>
#include <cstring>

#include "backend/cuda/cuda_backend_impl.h"

namespace kettle {

// The context holds while ops run (a recorded step's host-side choices are made then).
void CudaBackend::run_step(const StepContext& context, uint64_t key, const std::function<void()>& ops) {
  check(cudaSetDevice(device_), "cudaSetDevice");  // this thread works on this backend's device
  struct Scoped {
    StepContext& held;
    StepContext saved;
    ~Scoped() { held = saved; }
  } scoped{context_, context_};
  context_ = context;
  if (key == 0 || timer_.enabled()) return ops();  // unrecorded, or each op timed on its own
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {  // first sighting: run it, sizing workspaces
    graphs_.emplace(key, nullptr);
    ops();
    return;
  }
  if (it->second == nullptr) {
    if (graphs_.size() > kMaxGraphs) {
      drop_graphs();
      graphs_.emplace(key, nullptr);
    }
    cudaGraph_t graph = nullptr;
    check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    capturing_ = true;
    try {
      ops();
    } catch (...) {
      capturing_ = false;
      cudaStreamEndCapture(stream_, &graph);
      if (graph != nullptr) cudaGraphDestroy(graph);
      throw;
    }
    capturing_ = false;
    check(cudaStreamEndCapture(stream_, &graph), "cudaStreamEndCapture");
    cudaGraphExec_t exec = nullptr;
    check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    cudaGraphDestroy(graph);
    graphs_[key] = exec;
    it = graphs_.find(key);
  }
  check(cudaGraphLaunch(it->second, stream_), "cudaGraphLaunch");
}

void CudaBackend::drop_graphs() {
  for (auto& [key, exec] : graphs_)
    if (exec != nullptr) cudaGraphExecDestroy(exec);
  graphs_.clear();
}

}  // namespace kettle
