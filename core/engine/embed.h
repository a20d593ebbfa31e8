// Embeddings: texts in, vectors out, through the engine's scheduler.
//
// Each text is run as its own private sequence (no prefix-cache hits: every
// row's hidden state is needed) in the engine's steps, beside the streams
// that are generating: its rows are prefill chunks under the same token
// budget, so a long document never holds a decoding stream back by more than
// a chunk. The vector is the hidden state after the model's final norm (the
// output head's input, llama.cpp's embeddings), pooled over the text's
// tokens: the mean, the last token's, or the first token's ("cls"), then
// optionally L2-normalised. Batch invariance makes it independent of what
// else the engine runs and of how the text was chunked.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ember {

class EngineOwner;

enum class Pooling : int32_t { kMean = 0, kLast = 1, kCls = 2 };

struct EmbedParams {
  Pooling pooling = Pooling::kMean;
  bool normalize = false;  // L2: each vector scaled to length 1
  // Texts: the model's BOS/EOS as its tokenizer adds them (llama.cpp's
  // embedding tokenization); special-token text parsed or not.
  bool parse_special = false;
  static constexpr size_t kMaxInputs = 4096;
};

// "mean", "last", "cls" (throws ember::Error kInvalidArgument otherwise).
Pooling parse_pooling(const std::string& name);
const char* pooling_name(Pooling p);

// One vector of the model's n_embd floats per input, in order. Throws
// ember::Error: kInvalidArgument (no inputs, an empty input, a token id out of
// range, too many inputs), kContextFull (an input longer than the model's
// context), kOutOfMemory (the KV pool cannot hold an input), kCancelled.
// Blocks until done; in manual-step mode it runs the engine's steps itself.
std::vector<std::vector<float>> embed_tokens(const std::shared_ptr<EngineOwner>& engine,
                                             const std::vector<std::vector<int32_t>>& inputs, const EmbedParams& p);
std::vector<std::vector<float>> embed_texts(const std::shared_ptr<EngineOwner>& engine,
                                            const std::vector<std::string>& texts, const EmbedParams& p);

}  // namespace ember
