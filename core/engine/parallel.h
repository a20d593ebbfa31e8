// A model split across ranks (issue 31): rank 0 runs the engine (scheduler,
// sessions, sampling, the KV tables) and sends each forward pass and each KV
// block copy to the other ranks, which run their part of it (their heads and
// FFN columns under tensor parallelism, their layers under pipeline
// parallelism; Decoder::run_split) and nothing else.
//
// The wire (rank 0's broadcasts, in order): a header {command, payload
// bytes}, then the payload. Commands: a forward pass (the Batch), a KV block
// copy (source and destination blocks), stop (rank 0's engine is gone).
// A fault (a rank that died or hangs: the communicator's timeout) breaks the
// group: rank 0's streams end with the error and every later step fails at
// once; the other ranks' follow() throws it.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/comm/communicator.h"
#include "core/model/forward.h"

namespace ember {

class ParallelLeader final : public Forward {
 public:
  // `local`: this rank's forward pass (set_parallel already called).
  ParallelLeader(std::unique_ptr<Forward> local, comm::Communicator& comm);
  // Tells the other ranks to stop (their follow() returns).
  ~ParallelLeader() override;

  void forward(const Batch& batch, float* logits, float* embd = nullptr) override;
  void forward_layers(const Batch& batch, float* logits, int32_t n_layers) override;
  void use_kv_layout(const KvLayerGroups& groups, const KvView* view) override;
  void set_parallel(const ParallelContext& ctx) override;
  // A KV block copy, sent to the other ranks (KvCache::set_split).
  void mirror_copy(const int32_t* src, const int32_t* dst, int32_t n);
  // Tells the other ranks to stop (once); later forward passes fail. Done by
  // the destructor, or at exit for an engine still alive then (its worker
  // finishing the last streams' step when the host returns from main).
  void stop_followers();

 private:
  void send(uint32_t command, const std::vector<int32_t>& payload);
  std::unique_ptr<Forward> local_;
  comm::Communicator& comm_;
  std::mutex mutex_;
  std::string broken_;  // non-empty: why the group cannot run any more
  bool stopped_ = false;
};

// Runs rank 0's commands on a rank > 0 until rank 0 stops. `n_vocab`,
// `n_embd`: the full model's (the sizes of the output buffers). Throws
// ember::Error on a fault.
void follow_leader(Forward& local, Backend& backend, comm::Communicator& comm, int32_t n_vocab, int32_t n_embd);

// A Batch as 32-bit words and back (the forward command's payload). Batches
// with LoRA adapters are refused (not sent).
std::vector<int32_t> serialize_batch(const Batch& batch);
Batch deserialize_batch(const int32_t* words, size_t n);

}  // namespace ember
