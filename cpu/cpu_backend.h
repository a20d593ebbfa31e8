// The CPU backend: oneDNN plus Ember's own SIMD kernels.
#pragma once

#include <cstddef>
#include <memory>

#include "core/backend/backend.h"

namespace ember {

// Creates the CPU backend (threads: 0 = all cores). batch_invariant: every
// matmul row is computed as for a single row, so a sequence's output never
// depends on batching, chunking or prefix-cache hits.
std::unique_ptr<Backend> make_cpu_backend(int n_threads, bool batch_invariant = true, bool prompt_tiles = true);

// Bytes of activation buffers (Backend::alloc) the CPU backends of this
// process hold now (tests: the decoder gives a prompt chunk's buffers back).
size_t cpu_buffer_bytes();

// Registers the CPU backend as "cpu" in the core's backend registry
// (core/backend/registry.h), with its ISA as the backend's info. Idempotent,
// thread-safe. It runs by itself when a program or shared library that links
// ember_cpu loads (a static initializer in cpu_backend.cpp, which the link
// keeps: see ember_cpu in the top-level CMakeLists.txt); a direct call is
// only needed before static initialization ends.
void register_cpu_backend();

}  // namespace ember
