// The CPU backend's scratch buffers (prepared activation rows, dequantized
// weight tiles, attention scores): grown to what a call needs, and given
// back after a prompt.
//
// A prompt chunk of 512 rows needs hundreds of times a decode row's scratch;
// kept, it would stay resident for the engine's life (SmolLM2: ~2.4 MB, 2%
// of the model). A buffer goes back once kShrinkAfter calls in a row have
// needed a quarter of it or less: decoding after a prompt. Steps that mix
// prompt chunks with decode rows keep it (their large calls reset the
// count), so a continuous batch does not reallocate it every step. Buffers
// of kMapBytes or more are mapped on their own, so that giving one back
// returns its pages to the system (freed to the heap, glibc would keep them
// in the arena of the thread that allocated them).
#pragma once

#include <cstddef>

namespace ember::cpu {

// Host memory, 64-byte aligned: a mapping of its own from `map_from` bytes
// (freeing it returns its pages to the system), the heap below. Null when
// the system has none; free with free_host(p, bytes, *mapped).
void* alloc_host(size_t bytes, size_t map_from, bool* mapped);
void free_host(void* p, size_t bytes, bool mapped);

class ScratchBuffer {
 public:
  static constexpr size_t kKeepBytes = size_t{256} << 10;  // never given back below this
  static constexpr size_t kMapBytes = size_t{256} << 10;   // mapped on their own from this
  static constexpr int kShrinkAfter = 64;                  // ~ half a SmolLM2 decode step's calls

  ScratchBuffer() = default;
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  ~ScratchBuffer() { release(); }

  // At least `bytes` bytes, 64-byte aligned. The contents are not kept when
  // the buffer grows or shrinks. Fails with kOutOfMemory.
  void* get(size_t bytes);
  size_t capacity() const { return cap_; }
  void release();

 private:
  void* p_ = nullptr;
  size_t cap_ = 0;
  bool mapped_ = false;
  int small_calls_ = 0;
};

}  // namespace ember::cpu
