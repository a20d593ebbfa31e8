// `ember serve`: an OpenAI-compatible HTTP server over the public C ABI
// (cpp-httplib for HTTP, nlohmann-json for JSON; docs/SERVER.md).
//
//   GET  /                      the chat page (one static page, streams replies)
//   GET  /health                {"status": "ok"}
//   GET  /metrics               Prometheus text: requests, tokens, tokens/s, queue, KV use
//   GET  /v1/models             the served model
//   POST /v1/chat/completions   chat (SSE streaming, sampling, logprobs, response_format, tools)
//   POST /v1/completions        raw-text completion
//   POST /v1/embeddings         pooled hidden states
//
// One engine serves every request: each request is a session of its own, and
// the engine's continuous batching runs the streams of all of them together
// (so a request's tokens never depend on the others). At most `parallel`
// requests run at once, `queue` more wait; past that a request gets 503.
#pragma once

#include <cstdint>
#include <string>

namespace ember::server {

struct ServeOptions {
  std::string model_path;
  std::string host = "127.0.0.1";
  int port = 8080;                    // 0: any free port (printed when listening)
  std::string alias;                  // the model's id in the API ("" = the file name without .gguf)
  std::string api_key;                // "" = no authentication
  int parallel = 8;                   // requests generating at once
  int queue = 64;                     // requests waiting for a place; more get 503
  int threads = 0;                    // engine CPU threads (0 = adaptive)
  int ctx = 0;                        // tokens per request's session (0 = the model's context)
  uint64_t kv_memory_bytes = 0;       // KV pool (0 = the engine's default)
  int device = 0;                     // EMBER_DEVICE_*
  int pooling = 0;                    // EMBER_POOLING_* for /v1/embeddings
  int read_timeout_s = 30;            // a client that sends nothing this long is dropped
  int write_timeout_s = 30;           // a client that reads nothing this long is dropped (its stream cancelled)
  size_t max_body_bytes = 16u << 20;  // larger request bodies get 413
  bool quiet = false;                 // no request log on stderr
  // A model split across the ranks of an MPI job (`mpirun -np N ember serve
  // --tp N`): rank 0 serves, the others follow it (ember_engine_follow).
  int tp = 1, pp = 1;
  int comm_timeout_ms = 0;  // 0: the engine's default
  int comm = 0;             // EMBER_COMM_*
  int tp_exact = 1;         // ember_engine_params.tp_exact
  int kv_dtype = 0;         // EMBER_KV_* (--kv-type)
};

// Loads the model, listens and serves until SIGINT or SIGTERM. Prints
// "listening on http://HOST:PORT" on stderr once requests are accepted.
// Returns a process exit status (0 after a clean shutdown).
int serve(const ServeOptions& options);

}  // namespace ember::server
