#include "core/engine/parallel.h"

#include <cstdlib>
#include <cstring>

#include "core/util/log.h"
#include "core/util/status.h"

namespace ember {

namespace {

enum Command : uint32_t { kForward = 1, kCopyBlocks = 2, kStop = 3 };

struct Header {
  uint32_t command;
  uint32_t reserved;
  uint64_t words;
};

void put(std::vector<int32_t>& out, const std::vector<int32_t>& v) {
  out.push_back(static_cast<int32_t>(v.size()));
  out.insert(out.end(), v.begin(), v.end());
}

class Reader {
 public:
  Reader(const int32_t* w, size_t n) : w_(w), n_(n) {}
  int32_t word() {
    if (i_ >= n_) fail(StatusCode::kInternal, "model parallel: a truncated batch came from rank 0");
    return w_[i_++];
  }
  std::vector<int32_t> vec() {
    const int32_t len = word();
    if (len < 0 || static_cast<size_t>(len) > n_ - i_)
      fail(StatusCode::kInternal, "model parallel: a bad batch came from rank 0");
    std::vector<int32_t> v(w_ + i_, w_ + i_ + len);
    i_ += static_cast<size_t>(len);
    return v;
  }
  bool done() const { return i_ == n_; }

 private:
  const int32_t* w_;
  size_t n_, i_ = 0;
};

}  // namespace

std::vector<int32_t> serialize_batch(const Batch& b) {
  std::vector<int32_t> out;
  for (const auto* v : {&b.tokens, &b.positions, &b.slots, &b.kv_len, &b.seq_of_row, &b.logit_rows, &b.embd_rows,
                        &b.tree_from, &b.tree_begin, &b.tree_slots}) {
    put(out, *v);
  }
  put(out, std::vector<int32_t>(b.decode_rows.begin(), b.decode_rows.end()));
  out.push_back(static_cast<int32_t>(b.seqs.size()));
  for (const auto& s : b.seqs) {
    if (s.lora) fail(StatusCode::kUnsupported, "LoRA adapters on a model split across ranks are not supported yet");
    out.insert(out.end(),
               {s.first_row, s.n_rows, s.n_groups, s.hole_begin, s.hole_end, (s.decodes ? 1 : 0) | (s.scores ? 2 : 0)});
    put(out, s.block_table);
  }
  return out;
}

Batch deserialize_batch(const int32_t* words, size_t n) {
  Reader r(words, n);
  Batch b;
  for (auto* v : {&b.tokens, &b.positions, &b.slots, &b.kv_len, &b.seq_of_row, &b.logit_rows, &b.embd_rows,
                  &b.tree_from, &b.tree_begin, &b.tree_slots}) {
    *v = r.vec();
  }
  const std::vector<int32_t> dec = r.vec();
  b.decode_rows.assign(dec.begin(), dec.end());
  const int32_t n_seqs = r.word();
  if (n_seqs < 0) fail(StatusCode::kInternal, "model parallel: a bad batch came from rank 0");
  b.seqs.resize(static_cast<size_t>(n_seqs));
  for (auto& s : b.seqs) {
    s.first_row = r.word();
    s.n_rows = r.word();
    s.n_groups = r.word();
    s.hole_begin = r.word();
    s.hole_end = r.word();
    const int32_t flags = r.word();
    s.decodes = (flags & 1) != 0;
    s.scores = (flags & 2) != 0;
    s.block_table = r.vec();
  }
  if (!r.done()) fail(StatusCode::kInternal, "model parallel: a bad batch came from rank 0");
  return b;
}

namespace {
// The leader alive in this process (one split engine at a time), for the
// exit handler.
std::mutex g_leader_mutex;
ParallelLeader* g_leader = nullptr;
}  // namespace

ParallelLeader::ParallelLeader(std::unique_ptr<Forward> local, comm::Communicator& comm)
    : local_(std::move(local)), comm_(comm) {
  static std::once_flag registered;
  // (Registered after the communicator's own handler, so it runs first.)
  std::call_once(registered, [] {
    std::atexit([] {
      std::lock_guard<std::mutex> lock(g_leader_mutex);
      if (g_leader) g_leader->stop_followers();
    });
  });
  std::lock_guard<std::mutex> lock(g_leader_mutex);
  g_leader = this;
}

ParallelLeader::~ParallelLeader() {
  stop_followers();
  std::lock_guard<std::mutex> lock(g_leader_mutex);
  if (g_leader == this) g_leader = nullptr;
}

void ParallelLeader::stop_followers() {
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopped_) return;
    stopped_ = true;
    if (broken_.empty()) {
      Header h{kStop, 0, 0};
      comm_.broadcast(&h, sizeof h, 0);
    }
  } catch (const std::exception& e) {
    log(LogLevel::kError, "model parallel: the other ranks could not be stopped: %s", e.what());
  }
}

void ParallelLeader::send(uint32_t command, const std::vector<int32_t>& payload) {
  Header h{command, 0, payload.size()};
  comm_.broadcast(&h, sizeof h, 0);
  if (!payload.empty()) {
    comm_.broadcast(const_cast<int32_t*>(payload.data()), payload.size() * sizeof(int32_t), 0);
  }
}

void ParallelLeader::forward(const Batch& batch, float* logits, float* embd) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!broken_.empty()) fail(StatusCode::kInternal, "model parallel: the ranks' group is broken: " + broken_);
  if (stopped_) fail(StatusCode::kCancelled, "model parallel: the other ranks were stopped (the process is ending)");
  const std::vector<int32_t> payload = serialize_batch(batch);  // (refusals before anything is sent)
  try {
    send(kForward, payload);
    local_->forward(batch, logits, embd);
  } catch (const Error& e) {
    // Every rank got the batch; a part may have failed half way through a
    // collective: the group cannot be trusted to be in step any more.
    broken_ = e.message();
    throw;
  } catch (const std::exception& e) {
    broken_ = e.what();
    throw;
  }
}

void ParallelLeader::mirror_copy(const int32_t* src, const int32_t* dst, int32_t n) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!broken_.empty()) fail(StatusCode::kInternal, "model parallel: the ranks' group is broken: " + broken_);
  if (stopped_) fail(StatusCode::kCancelled, "model parallel: the other ranks were stopped (the process is ending)");
  std::vector<int32_t> payload(src, src + n);
  payload.insert(payload.end(), dst, dst + n);
  try {
    send(kCopyBlocks, payload);
  } catch (const Error& e) {
    broken_ = e.message();
    throw;
  }
}

void ParallelLeader::forward_layers(const Batch&, float*, int32_t) {
  fail(StatusCode::kUnsupported, "self-speculative drafting on a model split across ranks is not supported yet");
}

void ParallelLeader::use_kv_layout(const KvLayerGroups&, const KvView*) {
  fail(StatusCode::kUnsupported, "draft models on a model split across ranks are not supported yet");
}

void ParallelLeader::set_parallel(const ParallelContext&) {
  fail(StatusCode::kInternal, "model parallel: the leader is already split");
}

void follow_leader(Forward& local, Backend& backend, comm::Communicator& comm, int32_t n_vocab, int32_t n_embd) {
  std::vector<int32_t> payload;
  std::vector<float> logits, embd;
  for (;;) {
    Header h{};
    comm.broadcast_untimed(&h, sizeof h, 0);
    if (h.words > (uint64_t{1} << 31)) fail(StatusCode::kInternal, "model parallel: a bad command came from rank 0");
    payload.resize(static_cast<size_t>(h.words));
    if (h.words) comm.broadcast(payload.data(), payload.size() * sizeof(int32_t), 0);
    switch (h.command) {
      case kStop: return;
      case kCopyBlocks: {
        const int32_t n = static_cast<int32_t>(payload.size() / 2);
        backend.kv_copy_blocks(payload.data(), payload.data() + n, n);
        break;
      }
      case kForward: {
        const Batch b = deserialize_batch(payload.data(), payload.size());
        logits.resize(b.logit_rows.size() * static_cast<size_t>(n_vocab));
        embd.resize(b.embd_rows.size() * static_cast<size_t>(n_embd));
        local.forward(b, logits.data(), embd.data());
        break;
      }
      default: fail(StatusCode::kInternal, "model parallel: an unknown command came from rank 0");
    }
  }
}

}  // namespace ember
