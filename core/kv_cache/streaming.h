// Cache policies of a session (full, window, sinks + window) and the layout
// of a bounded (window/sink) sequence inside its block table.
//
// StreamingLLM (Xiao et al., ICLR 2024): keep the first S tokens (the
// attention sinks) plus the most recent W tokens, and give them positions
// inside the cache -- sinks 0..S-1, window S..S+n_window-1 -- so RoPE never
// sees a position >= S + W however long the stream runs.
//
// Layout in logical cache slots (slot s lives in block_table[s / B]):
//
//   [0, S)              sinks               positions 0..S-1
//   [S, win_begin)      hole: evicted tokens that shared the sinks' last block
//   [win_begin, kv_len) window              positions S..S+(kv_len-win_begin)-1
//
// Eviction is block-granular and never copies KV: the first eviction drops
// the rest of the sinks' last block (the hole; a mask in attention), every
// later one drops the window's oldest block from the block table (the later
// slots renumber by B, which costs an int move per block). The kept window
// keys are then re-rotated by the shift (llama.cpp's K-shift), so the window
// between evictions holds from W-B+1 to W tokens. Evictions happen at fixed
// token indices, whatever the chunking (chunk_limit). See docs/BENCHMARKS.md
// (StreamingLLM) for why K-shift rather than rotating keys at attention time.
//
// This class is pure bookkeeping (tested without a model): token indices
// are positions in the session's history; `n_processed` is how many history
// tokens have been run (resident or evicted).
#pragma once

#include <cstdint>

namespace ember {

enum class CachePolicyKind : int32_t { kFull = 0, kWindow = 1, kSink = 2 };

struct CachePolicy {
  static constexpr int32_t kDefaultSinkTokens = 4;  // StreamingLLM's choice
  CachePolicyKind kind = CachePolicyKind::kFull;
  int32_t sink_tokens = 0;    // S (always 0 for kWindow)
  int32_t window_tokens = 0;  // W (0 for kFull)
  bool bounded() const { return kind != CachePolicyKind::kFull; }
  int32_t capacity() const { return sink_tokens + window_tokens; }
  // Throws ember::Error (kInvalidArgument) unless S >= 0, W >= block_size and
  // S + W <= n_ctx_train (the positions stay inside the trained range).
  void validate(int32_t block_size, int32_t n_ctx_train) const;
};

class StreamingLayout {
 public:
  StreamingLayout() = default;
  StreamingLayout(int32_t sinks, int32_t window, int32_t block_size);

  int32_t sinks() const { return sinks_; }
  int32_t window() const { return window_; }
  int32_t block_size() const { return block_size_; }

  // Tokens evicted so far (history indices [S, S + n_evicted)), and whole
  // window blocks dropped from the front of the table.
  int64_t n_evicted() const { return n_evicted_; }
  int64_t dropped_blocks() const { return dropped_blocks_; }
  bool shifted() const { return n_evicted_ > 0; }
  int32_t win_begin() const;  // first window slot (== S before any eviction)

  // The most tokens one forward chunk may append after `n_processed`: up to
  // (not past) the next eviction point. Every row of such a chunk then sees
  // exactly the cache it would see if the tokens came one at a time, so a
  // session's results never depend on how its tokens were split into calls,
  // chunks or prefix-cache hits.
  int32_t chunk_limit(int64_t n_processed) const;
  // Slots the table must cover at most (the cache never grows past this).
  int32_t max_slots() const;

  // Logical slots used when `n_processed` history tokens have been run.
  int32_t kv_len(int64_t n_processed) const;
  // Tokens whose K/V are resident (sinks + window) for `n_processed`.
  int32_t resident(int64_t n_processed) const;
  // Slot and RoPE position of history token t (t < S or t >= S + n_evicted).
  int32_t slot_of(int64_t t) const;
  int32_t position_of(int64_t t) const;
  // The hole [S, win_begin) that attention must skip (empty before eviction).
  int32_t hole_begin() const { return sinks_; }
  int32_t hole_end() const { return win_begin(); }

  struct Eviction {
    int32_t hole_tokens = 0;     // tokens evicted from the sinks' last block
    int32_t dropped_blocks = 0;  // window blocks dropped, all at table index first_block
    int32_t first_block = 0;     // table index of the dropped blocks (the window's first block)
    int32_t shift = 0;           // positions the kept window moves down (tokens evicted)
    bool any() const { return shift > 0; }
  };
  // What must be evicted before `n_new` tokens (<= chunk_limit()) are
  // appended after `n_processed` ones, so the window holds at most W tokens.
  Eviction plan(int64_t n_processed, int32_t n_new) const;
  void apply(const Eviction& e);

  // Whether the history can be rolled back to `n` processed tokens (not into
  // evicted tokens), and the rollback itself (bookkeeping only).
  bool can_truncate(int64_t n) const { return n_evicted_ == 0 || n >= sinks_ + n_evicted_; }

  // For restoring a saved session.
  void restore(int64_t n_evicted, int64_t dropped_blocks) {
    n_evicted_ = n_evicted;
    dropped_blocks_ = dropped_blocks;
  }
  bool consistent() const;

 private:
  int32_t sinks_ = 0, window_ = 0, block_size_ = 16;
  int64_t n_evicted_ = 0;
  int64_t dropped_blocks_ = 0;
};

}  // namespace ember
