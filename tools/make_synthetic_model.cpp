// make_synthetic_model: writes a random-weight Llama-architecture GGUF of any
// shape and tensor type, loadable by Ember and by llama.cpp, for performance
// work and for tests that need a particular shape. Weights are produced
// tensor by tensor while the file is written (GgufWriter's streaming filler),
// so an 8B F16 file needs about one tensor (<= 1 GiB) of memory, not 16 GB.
//
//   make_synthetic_model --preset llama3-8b --type q4_0 --out /tmp/l3-8b-q4_0.gguf
//   make_synthetic_model --layers 2 --embd 64 --ff 128 --heads 4 --kv-heads 2
//       --vocab 384 --type f16 --out tiny.gguf --verify
//
// Types: q4_0 q4_1 q8_0 f16 bf16 f32 (random values on a grid) and q5_0 q5_1
// q2_k q3_k q4_k q5_k q6_k (uniform values through the plain quantizers below; K-quants
// need --embd / --ff multiples of 256); q4_k_m writes the Q4_K_M-style mix
// of tensor_type(): attn_v, ffn_down, token_embd and output in Q6_K, the other
// matrices in Q4_K (general.file_type 15).
//
// The vocabulary is a valid minimal GPT-2 byte-level BPE: the 256 byte
// tokens, a few dozen English merges, <|endoftext|> <|im_start|> <|im_end|>,
// padded with unused <|reserved_N|> tokens to the vocabulary size; a ChatML
// chat template is included.
//
// --pass-through-from N: layers N and above add nothing to the residual
// stream (attn_output and ffn_down are zero), so the first N layers with the
// final norm and head give exactly the whole model's logits: a model whose
// early exit at N agrees with it (self-speculation's best case).
// --output-norm F: the final norm's weights around F (default 1; larger
// gives more peaked next-token distributions).
//
// The file is written through core/gguf (GgufWriter) and core/tensor alone.
// --verify then loads it through the public C ABI (libember), as any program
// would: it checks the hyperparameters, the tokenizer and the chat template,
// generates three greedy tokens on the CPU (a prefill, then two decode
// steps) and scores the prompt with them (ember_engine_score): every logit
// finite, and the scored rows' argmax are the greedy tokens.
// --verify-device cuda[:N] additionally does the same on that device (the
// CUDA plugin) and compares its logits with the CPU's; the exit status is
// non-zero when they disagree.
//
// Adapter mode: a random LoRA adapter for an existing base model, in the
// GGUF layout llama.cpp's convert_lora_to_gguf.py writes and
// llama_adapter_lora_init (src/llama-adapter.cpp) reads:
//
//   make_synthetic_model --lora-for BASE.gguf --rank R --seed S --out FILE
//       [--alpha A] [--lora-type f16|f32] [--lora-magnitude M]
//
// Metadata: general.architecture (the base's), general.type "adapter",
// general.name "synthetic-lora", adapter.type "lora", adapter.lora.alpha
// (float32 A, default R: scale alpha / rank = 1). For every layer il and
// target in attn_q attn_k attn_v attn_output ffn_gate ffn_up ffn_down whose
// base tensor blk.il.target.weight exists with 2 dims ne = [K, N]:
// blk.il.target.weight.lora_a with ne = [K, R] and .lora_b with ne = [R, N],
// in F16 (default) or F32, so that W x becomes W x + scale * B (A x).
// Values are uniform on a grid, seeded by --seed: A in +-1/sqrt(K), B in
// +-M/sqrt(R) (M default 1.75, kLoraMagnitude: on SmolLM2-135M-Instruct Q4_1 a
// rank-16 adapter at scale 1 turns llama.cpp's greedy continuations within a
// few tokens while the text stays English-like). The same arguments give a
// byte-identical file. A base that is not a model (general.type "adapter",
// no general.architecture, no target tensor), a rank outside 1..1024 or no
// --out is refused (non-zero exit status).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/gguf/gguf.h"
#include "core/gguf/gguf_writer.h"
#include "core/tensor/types.h"
#include "core/tokenizer/unicode.h"
#include "core/util/status.h"
#include "ember/ember.h"

namespace ember {
namespace {

struct Shape {
  std::string name = "custom";
  int64_t layers = 2, embd = 64, ff = 128, heads = 4, kv_heads = 2, vocab = 384, ctx = 2048;
  double rope_base = 10000.0;
  bool tied = false;
};

struct Options {
  Shape shape;
  // llama (also Mistral's layout), llama3 (+ rope_freqs: Llama 3.1 RoPE
  // scaling), qwen2 (QKV biases, NEOX RoPE), qwen3 (per-head QK norms, NEOX
  // RoPE), gemma3 (QK norms, post norms,
  // GeGLU, scaled embeddings, sliding-window layers of --window tokens).
  std::string arch = "llama";
  int64_t window = 64;
  DType type = DType::Q4_0;
  bool q4_k_m = false;  // --type q4_k_m: the Q4_K_M-style mix (tensor_type())
  std::string out;
  uint64_t seed = 1234;
  bool verify = false;
  std::string verify_device;
  double tolerance = 0.02;         // relative max logit difference allowed vs the CPU
  int64_t pass_through_from = -1;  // layers from here add nothing (-1: none)
  float output_norm = 1.0f;
  // Adapter mode (--lora-for): a LoRA adapter for that base instead of a model.
  std::string lora_for;
  int64_t lora_rank = 0;
  float lora_alpha = 0.0f;  // 0: the rank (scale 1)
  DType lora_type = DType::F16;
  float lora_magnitude = 0.0f;  // 0: kLoraMagnitude
};

// B's half-width times sqrt(rank) (--lora-magnitude's default): B A then has
// entries of RMS about M / (3 sqrt(K)) (0.024 for K = 576). Chosen on
// SmolLM2-135M-Instruct Q4_1 with a rank-16 seed-1 adapter at scale 1: the
// smallest of 0.25 0.5 0.75 1 1.25 1.5 1.75 2 at which llama.cpp's greedy
// continuation of each golden prompt leaves the base's at a step whose
// top1-top2 logit gap is >= 0.2, with no gap below 0.1 before it (there:
// steps 0, 2, 1; tests/golden/lora/README.md); the text stays English or code.
constexpr float kLoraMagnitude = 1.75f;

[[noreturn]] void usage(const char* msg) {
  if (msg) std::fprintf(stderr, "make_synthetic_model: %s\n\n", msg);
  std::fprintf(
      stderr,
      "usage: make_synthetic_model --out PATH [--preset llama3-8b|smollm2-135m|tiny]\n"
      "         [--layers N] [--embd N] [--ff N] [--heads N] [--kv-heads N] [--vocab N] [--ctx N]\n"
      "         [--type q4_0|q4_1|q5_0|q5_1|q8_0|q2_k|q3_k|q4_k|q5_k|q6_k|q4_k_m|f16|bf16|f32] [--rope-base F]\n"
      "         [--tied|--untied] [--seed N] [--arch llama|llama3|qwen2|qwen3|gemma3|mistral] [--window N]\n"
      "         [--pass-through-from N] [--output-norm F] [--verify] [--verify-device cuda[:N]] [--tolerance F]\n"
      "   or: make_synthetic_model --lora-for BASE.gguf --rank R --out PATH [--seed N] [--alpha F]\n"
      "         [--lora-type f16|f32] [--lora-magnitude F]\n");
  std::exit(2);
}

bool preset(const std::string& name, Shape* s) {
  if (name == "llama3-8b") {
    *s = Shape{"llama3-8b", 32, 4096, 14336, 32, 8, 128256, 8192, 500000.0, false};
  } else if (name == "smollm2-135m") {
    *s = Shape{"smollm2-135m", 30, 576, 1536, 9, 3, 49152, 8192, 100000.0, true};
  } else if (name == "tiny") {
    *s = Shape{"tiny", 2, 64, 128, 4, 2, 384, 2048, 10000.0, false};
  } else {
    return false;
  }
  return true;
}

DType parse_type(const std::string& t) {
  if (t == "q4_0") return DType::Q4_0;
  if (t == "q4_1") return DType::Q4_1;
  if (t == "q8_0") return DType::Q8_0;
  if (t == "q5_0") return DType::Q5_0;
  if (t == "q5_1") return DType::Q5_1;
  if (t == "q2_k") return DType::Q2_K;
  if (t == "q3_k") return DType::Q3_K;
  if (t == "q4_k" || t == "q4_k_m") return DType::Q4_K;
  if (t == "q5_k") return DType::Q5_K;
  if (t == "q6_k") return DType::Q6_K;
  if (t == "f16") return DType::F16;
  if (t == "bf16") return DType::BF16;
  if (t == "f32") return DType::F32;
  usage(("unknown --type '" + t + "'").c_str());
}

// llama.cpp's general.file_type (enum llama_ftype).
uint32_t file_type(DType t) {
  switch (t) {
    case DType::F32: return 0;
    case DType::F16: return 1;
    case DType::Q4_0: return 2;
    case DType::Q4_1: return 3;
    case DType::Q8_0: return 7;
    case DType::Q5_0: return 8;
    case DType::Q5_1: return 9;
    case DType::Q2_K: return 10;
    case DType::Q3_K: return 11;  // Q3_K_S
    case DType::Q4_K: return 14;  // Q4_K_S (15, Q4_K_M, for the mix: write_model)
    case DType::Q5_K: return 16;  // Q5_K_S
    case DType::Q6_K: return 18;
    case DType::BF16: return 32;
    default: return 0;
  }
}

Options parse(int argc, char** argv) {
  Options o;
  std::vector<std::pair<std::string, std::string>> overrides;
  bool model_only = false, lora_only = false;  // options of one mode only were given
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value after " + a).c_str());
      return argv[++i];
    };
    if (a == "--preset" || a == "--type" || a == "--arch" || a == "--window" || a == "--verify" ||
        a == "--verify-device" || a == "--tolerance" || a == "--pass-through-from" || a == "--output-norm" ||
        a == "--tied" || a == "--untied") {
      model_only = true;
    }
    if (a == "--rank" || a == "--alpha" || a == "--lora-type" || a == "--lora-magnitude") lora_only = true;
    if (a == "--lora-for") {
      o.lora_for = value();
    } else if (a == "--rank") {
      const std::string v = value();
      char* end = nullptr;
      o.lora_rank = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || o.lora_rank < 1 || o.lora_rank > 1024) {
        usage(("--rank must be an integer in 1..1024, not '" + v + "'").c_str());
      }
    } else if (a == "--alpha") {
      o.lora_alpha = static_cast<float>(std::atof(value().c_str()));
      if (!(o.lora_alpha > 0.0f) || !std::isfinite(o.lora_alpha)) usage("--alpha must be > 0");
    } else if (a == "--lora-type") {
      const std::string t = value();
      if (t == "f16") {
        o.lora_type = DType::F16;
      } else if (t == "f32") {
        o.lora_type = DType::F32;
      } else {
        usage(("--lora-type takes f16 or f32, not '" + t + "'").c_str());
      }
    } else if (a == "--lora-magnitude") {
      o.lora_magnitude = static_cast<float>(std::atof(value().c_str()));
      if (!(o.lora_magnitude > 0.0f) || !std::isfinite(o.lora_magnitude)) usage("--lora-magnitude must be > 0");
    } else if (a == "--preset") {
      if (!preset(value(), &o.shape)) usage(("unknown preset '" + std::string(argv[i]) + "'").c_str());
    } else if (a == "--layers" || a == "--embd" || a == "--ff" || a == "--heads" || a == "--kv-heads" ||
               a == "--vocab" || a == "--ctx" || a == "--rope-base") {
      overrides.emplace_back(a, value());
    } else if (a == "--tied" || a == "--untied") {
      overrides.emplace_back(a, "");
    } else if (a == "--type") {
      const std::string t = value();
      o.type = parse_type(t);
      o.q4_k_m = t == "q4_k_m";
    } else if (a == "--out") {
      o.out = value();
    } else if (a == "--arch") {
      o.arch = value();
      if (o.arch != "llama" && o.arch != "llama3" && o.arch != "qwen2" && o.arch != "qwen3" && o.arch != "gemma3" &&
          o.arch != "mistral") {
        usage(("unknown --arch '" + o.arch + "'").c_str());
      }
    } else if (a == "--window") {
      o.window = std::strtoll(value().c_str(), nullptr, 10);
    } else if (a == "--seed") {
      o.seed = std::strtoull(value().c_str(), nullptr, 10);
    } else if (a == "--verify") {
      o.verify = true;
    } else if (a == "--verify-device") {
      o.verify = true;
      o.verify_device = value();
    } else if (a == "--tolerance") {
      o.tolerance = std::atof(value().c_str());
    } else if (a == "--pass-through-from") {
      o.pass_through_from = std::strtoll(value().c_str(), nullptr, 10);
      if (o.pass_through_from < 0) usage("--pass-through-from must be >= 0");
    } else if (a == "--output-norm") {
      o.output_norm = static_cast<float>(std::atof(value().c_str()));
      if (!(o.output_norm > 0.0f) || !std::isfinite(o.output_norm)) usage("--output-norm must be > 0");
    } else if (a == "-h" || a == "--help") {
      usage(nullptr);
    } else {
      usage(("unknown argument '" + a + "'").c_str());
    }
  }
  // Explicit sizes override the preset wherever they appear on the line.
  for (const auto& [k, v] : overrides) {
    const long long n = std::atoll(v.c_str());
    Shape& s = o.shape;
    if (k == "--layers")
      s.layers = n;
    else if (k == "--embd")
      s.embd = n;
    else if (k == "--ff")
      s.ff = n;
    else if (k == "--heads")
      s.heads = n;
    else if (k == "--kv-heads")
      s.kv_heads = n;
    else if (k == "--vocab")
      s.vocab = n;
    else if (k == "--ctx")
      s.ctx = n;
    else if (k == "--rope-base")
      s.rope_base = std::atof(v.c_str());
    else if (k == "--tied")
      s.tied = true;
    else if (k == "--untied")
      s.tied = false;
    if (k != "--tied" && k != "--untied" && k != "--rope-base") s.name = "custom";
  }
  if (o.out.empty()) usage("--out is required");
  if (!o.lora_for.empty()) {
    if (model_only || !overrides.empty())
      usage("--lora-for writes an adapter: model options (shape, type, --verify) do not apply");
    if (o.lora_rank == 0) usage("--lora-for needs --rank R (1..1024)");
    if (o.lora_alpha == 0.0f) o.lora_alpha = static_cast<float>(o.lora_rank);
    if (o.lora_magnitude == 0.0f) o.lora_magnitude = kLoraMagnitude;
  } else if (lora_only) {
    usage("--rank, --alpha, --lora-type and --lora-magnitude need --lora-for BASE.gguf");
  }
  return o;
}

// ---------------------------------------------------------------- vocabulary

struct Vocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges;
  std::vector<float> scores;  // SentencePiece vocabularies only
  int32_t eos = 0;
  bool spm = false;
};

// Vocabularies too small for byte-level BPE (below 299 tokens, e.g. the
// 16-64 token models of the speculative-sampling distribution test): a
// SentencePiece vocabulary of <unk>, <s>, </s>, the word boundary and
// letters/digits, then two-character pieces ("llama" tokenizer; text outside
// it is <unk>).
Vocab make_small_vocab(int64_t n_vocab) {
  Vocab v;
  v.spm = true;
  v.tokens = {"<unk>", "<s>", "</s>", "\xe2\x96\x81"};  // U+2581, the SentencePiece space
  v.types = {2, 3, 3, 1};
  v.scores = {0.0f, 0.0f, 0.0f, -1.0f};
  v.eos = 2;
  const std::string chars = "abcdefghijklmnopqrstuvwxyz0123456789";
  for (size_t i = 0; static_cast<int64_t>(v.tokens.size()) < n_vocab; ++i) {
    std::string piece;
    if (i < chars.size()) {
      piece = chars.substr(i, 1);
    } else {
      const size_t k = i - chars.size();
      piece = chars.substr(k % 26, 1) + chars.substr((k / 26) % 26, 1);
    }
    v.tokens.push_back(piece);
    v.types.push_back(1);
    v.scores.push_back(-2.0f - static_cast<float>(i));
  }
  return v;
}

// Merges as "left|right" in plain text (' ' is the byte-level space); each
// result becomes a token. Later merges build on earlier results.
constexpr const char* kMerges[] = {
    " |t",  " |a", "h|e",  "i|n",  "r|e", "o|n", " t|he", "e|r", " |s",  "a|t", " |w",  " |o",  "e|n", " |c",
    "i|t",  "i|s", "a|n",  "o|r",  "e|s", " |b", "e|d",   " |f", "in|g", " |p", "o|u",  " a|n", "a|l", "a|r",
    " t|o", " |m", " o|f", " |in", " |d", " |h", " an|d", "l|l", " t|h", "i|c", " h|e", "o|m",
};

Vocab make_vocab(int64_t n_vocab) {
  if (n_vocab >= 8 && n_vocab < 299) return make_small_vocab(n_vocab);
  Vocab v;
  auto byte_level = [](const std::string& s) {
    std::string out;
    for (unsigned char c : s) out += unicode::byte_to_utf8(c);
    return out;
  };
  for (int b = 0; b < 256; ++b) {
    v.tokens.push_back(unicode::byte_to_utf8(static_cast<uint8_t>(b)));
    v.types.push_back(1);  // normal
  }
  for (const char* m : kMerges) {
    const std::string s = m;
    const size_t bar = s.find('|');
    const std::string left = s.substr(0, bar), right = s.substr(bar + 1);
    v.merges.push_back(byte_level(left) + " " + byte_level(right));
    const std::string merged = byte_level(left + right);
    if (std::find(v.tokens.begin(), v.tokens.end(), merged) == v.tokens.end()) {
      v.tokens.push_back(merged);
      v.types.push_back(1);
    }
  }
  v.eos = static_cast<int32_t>(v.tokens.size());
  for (const char* s : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    v.tokens.push_back(s);
    v.types.push_back(3);  // control
  }
  if (static_cast<int64_t>(v.tokens.size()) > n_vocab) {
    fail(StatusCode::kInvalidArgument, "--vocab must be at least " + std::to_string(v.tokens.size()));
  }
  for (int64_t i = 0; static_cast<int64_t>(v.tokens.size()) < n_vocab; ++i) {
    v.tokens.push_back("<|reserved_" + std::to_string(i) + "|>");
    v.types.push_back(5);  // unused
  }
  return v;
}

constexpr const char* kChatTemplate =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

// ---------------------------------------------------------------- weights

struct Rng {
  uint64_t s[4];
  explicit Rng(uint64_t seed) {
    for (auto& w : s) {  // splitmix64
      uint64_t z = (seed += 0x9E3779B97F4A7C15ull);
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      w = z ^ (z >> 31);
    }
  }
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t next() {  // xoshiro256**
    const uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
  }
};

// Uniform values in [-a, a] on a grid of 65536 levels, looked up from 16 random bits.
struct ValueTables {
  std::vector<float> f32;
  std::vector<uint16_t> f16, bf16;
  explicit ValueTables(float a) : f32(65536), f16(65536), bf16(65536) {
    for (int u = 0; u < 65536; ++u) {
      f32[u] = a * (2.0f * (static_cast<float>(u) + 0.5f) / 65536.0f - 1.0f);
      f16[u] = fp32_to_fp16(f32[u]);
      bf16[u] = fp32_to_bf16(f32[u]);
    }
  }
};

constexpr float kSigma = 0.02f;             // weight standard deviation
const float kA = kSigma * std::sqrt(3.0f);  // uniform half-width with that deviation

// ---------------------------------------------------------------- reference quantizers
//
// Plain round-to-nearest quantizers for the types written from f32 values
// (Q5_0, Q5_1, Q2_K ... Q6_K), one block at a time, in GGUF's layouts
// (core/tensor/types.h). Simple min/max scaling, not llama.cpp's
// error-minimizing search: any valid quantization loads the same in both.

int round_clamp(float v, int lo, int hi) {
  const int q = static_cast<int>(std::lrintf(v));
  return q < lo ? lo : q > hi ? hi : q;
}

void quantize_q5_0(const float* x, uint8_t* out) {  // 32 values
  float amax = 0.f, mx = 0.f;
  for (int i = 0; i < 32; ++i)
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      mx = x[i];
    }
  BlockQ5_0 b{};
  b.d = fp32_to_fp16(mx / -16.f);
  const float d = fp16_to_fp32(b.d), id = d != 0.f ? 1.f / d : 0.f;
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    const int q0 = round_clamp(x[j] * id + 16.f, 0, 31), q1 = round_clamp(x[j + 16] * id + 16.f, 0, 31);
    b.qs[j] = static_cast<uint8_t>((q0 & 0xF) | ((q1 & 0xF) << 4));
    qh |= static_cast<uint32_t>(q0 >> 4) << j;
    qh |= static_cast<uint32_t>(q1 >> 4) << (j + 16);
  }
  std::memcpy(b.qh, &qh, 4);
  std::memcpy(out, &b, sizeof(b));
}

void quantize_q5_1(const float* x, uint8_t* out) {  // 32 values
  float lo = x[0], hi = x[0];
  for (int i = 1; i < 32; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  BlockQ5_1 b{};
  b.d = fp32_to_fp16((hi - lo) / 31.f);
  b.m = fp32_to_fp16(lo);
  const float d = fp16_to_fp32(b.d), m = fp16_to_fp32(b.m), id = d != 0.f ? 1.f / d : 0.f;
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    const int q0 = round_clamp((x[j] - m) * id, 0, 31), q1 = round_clamp((x[j + 16] - m) * id, 0, 31);
    b.qs[j] = static_cast<uint8_t>((q0 & 0xF) | ((q1 & 0xF) << 4));
    qh |= static_cast<uint32_t>(q0 >> 4) << j;
    qh |= static_cast<uint32_t>(q1 >> 4) << (j + 16);
  }
  std::memcpy(b.qh, &qh, 4);
  std::memcpy(out, &b, sizeof(b));
}

// The inverse of kquant_scale_min: 6-bit scale and min of sub-block j.
void pack_scale_min(uint8_t* s, int j, int sc, int m) {
  if (j < 4) {
    s[j] = static_cast<uint8_t>((s[j] & 0xC0) | sc);
    s[j + 4] = static_cast<uint8_t>((s[j + 4] & 0xC0) | m);
  } else {
    s[j + 4] = static_cast<uint8_t>((sc & 0xF) | ((m & 0xF) << 4));
    s[j - 4] = static_cast<uint8_t>((s[j - 4] & 0x3F) | ((sc >> 4) << 6));
    s[j] = static_cast<uint8_t>((s[j] & 0x3F) | ((m >> 4) << 6));
  }
}

// Per sub-block of `len` values (n of them): the asymmetric scale
// (hi - lo) / max_q and min -lo (lo <= 0 <= hi counted from 0), and their
// maxima over the super-block.
void subblock_scales_mins(const float* x, int n, int len, float max_q, float* scale, float* minv, float* max_scale,
                          float* max_min) {
  *max_scale = 0.f;
  *max_min = 0.f;
  for (int j = 0; j < n; ++j) {
    float lo = 0.f, hi = x[len * j];
    for (int i = 0; i < len; ++i) {
      lo = std::min(lo, x[len * j + i]);
      hi = std::max(hi, x[len * j + i]);
    }
    scale[j] = (hi - lo) / max_q;
    minv[j] = -lo;
    *max_scale = std::max(*max_scale, scale[j]);
    *max_min = std::max(*max_min, minv[j]);
  }
}

// Q4_K (kMaxQ 15) / Q5_K (31): x = d*sc*q - dmin*m per sub-block of 32.
template <int kMaxQ>
void quantize_q45_k(const float* x, uint8_t* out) {  // 256 values
  float scale[8], minv[8], max_scale, max_min;
  subblock_scales_mins(x, 8, 32, kMaxQ, scale, minv, &max_scale, &max_min);
  const uint16_t d16 = fp32_to_fp16(max_scale / 63.f), dmin16 = fp32_to_fp16(max_min / 63.f);
  const float d = fp16_to_fp32(d16), dmin = fp16_to_fp32(dmin16);
  uint8_t scales[12] = {};
  uint8_t q[256];
  for (int j = 0; j < 8; ++j) {
    const int ls = d > 0.f ? round_clamp(scale[j] / d, 0, 63) : 0;
    const int lm = dmin > 0.f ? round_clamp(minv[j] / dmin, 0, 63) : 0;
    pack_scale_min(scales, j, ls, lm);
    const float dl = d * static_cast<float>(ls), ml = dmin * static_cast<float>(lm);
    for (int i = 0; i < 32; ++i)
      q[32 * j + i] = static_cast<uint8_t>(dl > 0.f ? round_clamp((x[32 * j + i] + ml) / dl, 0, kMaxQ) : 0);
  }
  if constexpr (kMaxQ == 15) {
    BlockQ4_K b{};
    b.d = d16;
    b.dmin = dmin16;
    std::memcpy(b.scales, scales, 12);
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < 32; ++l) b.qs[32 * j + l] = static_cast<uint8_t>(q[64 * j + l] | (q[64 * j + 32 + l] << 4));
    std::memcpy(out, &b, sizeof(b));
  } else {
    BlockQ5_K b{};
    b.d = d16;
    b.dmin = dmin16;
    std::memcpy(b.scales, scales, 12);
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < 32; ++l) {
        const int lo = q[64 * j + l], hi = q[64 * j + 32 + l];
        b.qs[32 * j + l] = static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
        b.qh[l] = static_cast<uint8_t>(b.qh[l] | ((lo >> 4) << (2 * j)) | ((hi >> 4) << (2 * j + 1)));
      }
    std::memcpy(out, &b, sizeof(b));
  }
}

// Q2_K: x = d*sc*q - dmin*m per sub-block of 16, 4-bit sc and m, q 0..3.
void quantize_q2_k(const float* x, uint8_t* out) {  // 256 values
  float scale[16], minv[16], max_scale, max_min;
  subblock_scales_mins(x, 16, 16, 3.f, scale, minv, &max_scale, &max_min);
  BlockQ2_K b{};
  b.d = fp32_to_fp16(max_scale / 15.f);
  b.dmin = fp32_to_fp16(max_min / 15.f);
  const float d = fp16_to_fp32(b.d), dmin = fp16_to_fp32(b.dmin);
  for (int j = 0; j < 16; ++j) {
    const int ls = d > 0.f ? round_clamp(scale[j] / d, 0, 15) : 0;
    const int lm = dmin > 0.f ? round_clamp(minv[j] / dmin, 0, 15) : 0;
    b.scales[j] = static_cast<uint8_t>(ls | (lm << 4));
    const float dl = d * static_cast<float>(ls), ml = dmin * static_cast<float>(lm);
    for (int i = 0; i < 16; ++i) {
      const int e = 16 * j + i, q = dl > 0.f ? round_clamp((x[e] + ml) / dl, 0, 3) : 0;
      const int h = e / 128, r = e % 128;
      b.qs[32 * h + r % 32] = static_cast<uint8_t>(b.qs[32 * h + r % 32] | (q << (2 * (r / 32))));
    }
  }
  std::memcpy(out, &b, sizeof(b));
}

// Q3_K / Q6_K: per sub-block of 16, the scale that maps its largest
// magnitude value to `q_at_max` (the most negative level); returns the largest
// |scale|.
float signed_subblock_scales(const float* x, float q_at_max, float* scale) {
  float max_abs_scale = 0.f;
  for (int j = 0; j < 16; ++j) {
    float amax = 0.f, mx = 0.f;
    for (int i = 0; i < 16; ++i)
      if (std::fabs(x[16 * j + i]) > amax) {
        amax = std::fabs(x[16 * j + i]);
        mx = x[16 * j + i];
      }
    scale[j] = mx / q_at_max;
    max_abs_scale = std::max(max_abs_scale, std::fabs(scale[j]));
  }
  return max_abs_scale;
}

// Q3_K: x = d*sc*q per sub-block of 16, sc 6-bit signed (stored + 32), q -4..3.
void quantize_q3_k(const float* x, uint8_t* out) {  // 256 values
  float scale[16];
  const float max_abs_scale = signed_subblock_scales(x, -4.f, scale);
  BlockQ3_K b{};
  b.d = fp32_to_fp16(max_abs_scale / 31.f);
  const float d = fp16_to_fp32(b.d);
  for (int j = 0; j < 16; ++j) {
    const int ls = d > 0.f ? round_clamp(scale[j] / d, -32, 31) : 0;
    const int st = ls + 32;
    b.scales[j % 8] = static_cast<uint8_t>(b.scales[j % 8] | ((st & 0xF) << (4 * (j / 8))));
    b.scales[8 + j % 4] = static_cast<uint8_t>(b.scales[8 + j % 4] | ((st >> 4) << (2 * (j / 4))));
    const float dl = d * static_cast<float>(ls);
    for (int i = 0; i < 16; ++i) {
      const int e = 16 * j + i, q = (dl != 0.f ? round_clamp(x[e] / dl, -4, 3) : 0) + 4;
      const int h = e / 128, r = e % 128, l = r % 32;
      b.qs[32 * h + l] = static_cast<uint8_t>(b.qs[32 * h + l] | ((q & 3) << (2 * (r / 32))));
      if (q & 4) b.hmask[l] = static_cast<uint8_t>(b.hmask[l] | (1 << (4 * h + r / 32)));
    }
  }
  std::memcpy(out, &b, sizeof(b));
}

// Q6_K: x = d*sc*(q - 32) per sub-block of 16, int8 sc.
void quantize_q6_k(const float* x, uint8_t* out) {  // 256 values
  float scale[16];
  const float max_abs_scale = signed_subblock_scales(x, -32.f, scale);
  BlockQ6_K b{};
  b.d = fp32_to_fp16(max_abs_scale / 127.f);
  const float d = fp16_to_fp32(b.d);
  for (int j = 0; j < 16; ++j) b.scales[j] = static_cast<int8_t>(d > 0.f ? round_clamp(scale[j] / d, -128, 127) : 0);
  for (int e = 0; e < 256; ++e) {
    const float dl = d * static_cast<float>(b.scales[e / 16]);
    const int q = dl != 0.f ? round_clamp(x[e] / dl + 32.f, 0, 63) : 32;
    const int h = e / 128, r = e % 128, quarter = r / 32, l = r % 32;
    const int qli = 64 * h + l + 32 * (quarter & 1);
    b.ql[qli] = static_cast<uint8_t>(b.ql[qli] | ((q & 0xF) << (4 * (quarter >> 1))));
    b.qh[32 * h + l] = static_cast<uint8_t>(b.qh[32 * h + l] | ((q >> 4) << (2 * quarter)));
  }
  std::memcpy(out, &b, sizeof(b));
}

// The Q4_K_M-style mix of --type q4_k_m, a documented simplification of
// llama.cpp's (which gives Q6_K to attn_v / ffn_down in only some layers
// and may fall back per tensor): attn_v, ffn_down, token_embd and output in
// Q6_K, every other matrix Q4_K.
DType tensor_type(const Options& o, const std::string& name) {
  if (!o.q4_k_m) return o.type;
  const bool six = name.find("attn_v.") != std::string::npos || name.find("ffn_down.") != std::string::npos ||
                   name == "token_embd.weight" || name == "output.weight";
  return six ? DType::Q6_K : DType::Q4_K;
}

// Fills a matrix of `type` (n bytes) with random values.
void fill_matrix(DType type, uint8_t* dst, size_t n, uint64_t seed, const ValueTables& vt) {
  Rng rng(seed);
  auto random_bytes = [&](uint8_t* p, size_t len) {
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
      const uint64_t r = rng.next();
      std::memcpy(p + i, &r, 8);
    }
    if (i < len) {
      const uint64_t r = rng.next();
      std::memcpy(p + i, &r, len - i);
    }
  };
  switch (type) {
    case DType::F32: {
      auto* f = reinterpret_cast<float*>(dst);
      const size_t count = n / 4;
      for (size_t i = 0; i < count; i += 4) {
        const uint64_t r = rng.next();
        for (size_t j = 0; j < 4 && i + j < count; ++j) f[i + j] = vt.f32[(r >> (16 * j)) & 0xFFFF];
      }
      break;
    }
    case DType::F16:
    case DType::BF16: {
      const auto& table = type == DType::F16 ? vt.f16 : vt.bf16;
      const size_t count = n / 2;
      for (size_t i = 0; i < count; i += 4) {
        const uint64_t r = rng.next();
        for (size_t j = 0; j < 4 && i + j < count; ++j) {
          const uint16_t h = table[(r >> (16 * j)) & 0xFFFF];
          std::memcpy(dst + 2 * (i + j), &h, 2);
        }
      }
      break;
    }
    case DType::Q4_0: {
      const uint16_t d = fp32_to_fp16(kA / 8.0f);
      for (size_t off = 0; off + sizeof(BlockQ4_0) <= n; off += sizeof(BlockQ4_0)) {
        std::memcpy(dst + off, &d, 2);
        random_bytes(dst + off + 2, 16);
      }
      break;
    }
    case DType::Q4_1: {
      const uint16_t d = fp32_to_fp16(2.0f * kA / 15.0f), m = fp32_to_fp16(-kA);
      for (size_t off = 0; off + sizeof(BlockQ4_1) <= n; off += sizeof(BlockQ4_1)) {
        std::memcpy(dst + off, &d, 2);
        std::memcpy(dst + off + 2, &m, 2);
        random_bytes(dst + off + 4, 16);
      }
      break;
    }
    case DType::Q8_0: {
      const uint16_t d = fp32_to_fp16(kA / 127.0f);
      for (size_t off = 0; off + sizeof(BlockQ8_0) <= n; off += sizeof(BlockQ8_0)) {
        std::memcpy(dst + off, &d, 2);
        random_bytes(dst + off + 2, 32);
        for (int j = 0; j < 32; ++j) {
          if (dst[off + 2 + j] == 0x80) dst[off + 2 + j] = 0x81;  // keep q in [-127, 127]
        }
      }
      break;
    }
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K: {  // uniform f32 values through the reference quantizers
      const TypeTraits* tt = type_traits(type);
      float x[256];
      for (size_t off = 0; off + tt->type_size <= n; off += tt->type_size) {
        for (uint32_t i = 0; i < tt->block_size; i += 4) {
          const uint64_t r = rng.next();
          for (uint32_t j = 0; j < 4; ++j) x[i + j] = vt.f32[(r >> (16 * j)) & 0xFFFF];
        }
        switch (type) {
          case DType::Q5_0: quantize_q5_0(x, dst + off); break;
          case DType::Q5_1: quantize_q5_1(x, dst + off); break;
          case DType::Q2_K: quantize_q2_k(x, dst + off); break;
          case DType::Q3_K: quantize_q3_k(x, dst + off); break;
          case DType::Q4_K: quantize_q45_k<15>(x, dst + off); break;
          case DType::Q5_K: quantize_q45_k<31>(x, dst + off); break;
          default: quantize_q6_k(x, dst + off); break;
        }
      }
      break;
    }
    default: fail(StatusCode::kUnsupported, "unsupported tensor type");
  }
}

void check_shape(const Options& o) {
  const Shape& s = o.shape;
  auto need = [](bool ok, const std::string& msg) {
    if (!ok) fail(StatusCode::kInvalidArgument, msg);
  };
  need(s.layers >= 1 && s.embd >= 8 && s.ff >= 1 && s.heads >= 1 && s.kv_heads >= 1 && s.ctx >= 1,
       "sizes must be positive");
  need(s.embd % s.heads == 0, "--embd must be a multiple of --heads");
  need(s.heads % s.kv_heads == 0, "--heads must be a multiple of --kv-heads");
  const int64_t hd = s.embd / s.heads;
  need(hd % 8 == 0 && hd <= 256, "head_dim (embd / heads) must be a multiple of 8 and at most 256");
  need(s.heads / s.kv_heads <= 16, "at most 16 query heads per kv head");
  const TypeTraits* tt = type_traits(o.type);
  need(s.embd % tt->block_size == 0 && s.ff % tt->block_size == 0,
       std::string("--embd and --ff must be multiples of the ") + tt->name + " block size " +
           std::to_string(tt->block_size));
}

void write_model(const Options& o) {
  const Shape& s = o.shape;
  check_shape(o);
  const int64_t hd = s.embd / s.heads;
  const int64_t q_dim = s.heads * hd, kv_dim = s.kv_heads * hd;
  const Vocab vocab = make_vocab(s.vocab);

  // Mistral's files are "llama" with a sliding_window key (v0.1: 4096) that
  // llama.cpp does not apply to this architecture, and neither does Ember.
  const std::string arch = o.arch == "llama3" || o.arch == "mistral" ? "llama" : o.arch;
  const std::string a = arch + ".";
  gguf::GgufWriter w;
  w.add_string("general.architecture", arch);
  w.add_string("general.name", "synthetic " + s.name + " " + o.arch + " " + type_name(static_cast<uint32_t>(o.type)));
  w.add_u32("general.file_type", o.q4_k_m ? 15 : file_type(o.type));  // 15: LLAMA_FTYPE_MOSTLY_Q4_K_M
  w.add_u32(a + "context_length", static_cast<uint32_t>(s.ctx));
  w.add_u32(a + "embedding_length", static_cast<uint32_t>(s.embd));
  w.add_u32(a + "block_count", static_cast<uint32_t>(s.layers));
  w.add_u32(a + "feed_forward_length", static_cast<uint32_t>(s.ff));
  w.add_u32(a + "attention.head_count", static_cast<uint32_t>(s.heads));
  w.add_u32(a + "attention.head_count_kv", static_cast<uint32_t>(s.kv_heads));
  w.add_u32(a + "rope.dimension_count", static_cast<uint32_t>(hd));
  w.add_f32(a + "rope.freq_base", static_cast<float>(s.rope_base));
  w.add_f32(a + "attention.layer_norm_rms_epsilon", 1e-5f);
  w.add_u32(a + "vocab_size", static_cast<uint32_t>(s.vocab));
  if (o.arch == "mistral") w.add_u32(a + "attention.sliding_window", 4096);
  if (o.arch == "gemma3") {
    w.add_u32(a + "attention.key_length", static_cast<uint32_t>(hd));
    w.add_u32(a + "attention.value_length", static_cast<uint32_t>(hd));
    w.add_u32(a + "attention.sliding_window", static_cast<uint32_t>(o.window));
  }
  if (vocab.spm) {
    w.add_string("tokenizer.ggml.model", "llama");
    w.add_array("tokenizer.ggml.tokens", vocab.tokens);
    w.add_array("tokenizer.ggml.scores", vocab.scores);
    w.add_array("tokenizer.ggml.token_type", vocab.types);
    w.add_u32("tokenizer.ggml.bos_token_id", 1);
    w.add_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(vocab.eos));
    w.add_u32("tokenizer.ggml.unknown_token_id", 0);
    w.add_bool("tokenizer.ggml.add_bos_token", false);
  } else {
    w.add_string("tokenizer.ggml.model", "gpt2");
    w.add_string("tokenizer.ggml.pre", "gpt-2");
    w.add_array("tokenizer.ggml.tokens", vocab.tokens);
    w.add_array("tokenizer.ggml.token_type", vocab.types);
    w.add_array("tokenizer.ggml.merges", vocab.merges);
    w.add_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(vocab.eos));
    w.add_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(vocab.eos));
    w.add_bool("tokenizer.ggml.add_bos_token", false);
    w.add_string("tokenizer.chat_template", kChatTemplate);
  }

  auto vt = std::make_shared<ValueTables>(kA);
  uint64_t tensor_seed = o.seed * 1000003ull;
  auto matrix = [&](const std::string& name, int64_t cols, int64_t rows) {
    const DType t = tensor_type(o, name);
    const uint64_t seed = ++tensor_seed;
    w.add_tensor(name, t, {cols, rows}, [t, seed, vt](uint8_t* dst, size_t n) { fill_matrix(t, dst, n, seed, *vt); });
  };
  // F32 vectors: center +- spread (norm weights around 1, biases around 0).
  auto vec = [&](const std::string& name, int64_t n, float center, float spread) {
    const uint64_t seed = ++tensor_seed;
    w.add_tensor(name, DType::F32, {n}, [seed, center, spread](uint8_t* dst, size_t bytes) {
      Rng rng(seed);
      for (size_t i = 0; i < bytes / 4; ++i) {
        const float v = center + spread * (static_cast<float>(rng.next() >> 40) / 16777216.0f * 2.0f - 1.0f);
        std::memcpy(dst + 4 * i, &v, 4);
      }
    });
  };
  auto norm = [&](const std::string& name) { vec(name, s.embd, 1.0f, 0.1f); };
  // All zero: exactly zero in every type (scales and values 0).
  auto zero_matrix = [&](const std::string& name, int64_t cols, int64_t rows) {
    ++tensor_seed;  // (the other tensors keep their values)
    w.add_tensor(name, tensor_type(o, name), {cols, rows}, [](uint8_t* dst, size_t n) { std::memset(dst, 0, n); });
  };
  if (o.arch == "llama3") {
    // Llama 3.1's scaling (factor 8, low/high frequency factors 1 and 4,
    // original context 8192) as its converter writes rope_freqs.
    std::vector<float> f(static_cast<size_t>(hd / 2));
    const double factor = 8.0, low = 1.0, high = 4.0, orig = 8192.0;
    for (size_t i = 0; i < f.size(); ++i) {
      const double freq = 1.0 / std::pow(s.rope_base, 2.0 * static_cast<double>(i) / static_cast<double>(hd));
      const double wavelen = 2.0 * M_PI / freq, low_wl = orig / low, high_wl = orig / high;
      if (wavelen < high_wl) {
        f[i] = 1.0f;
      } else if (wavelen > low_wl) {
        f[i] = static_cast<float>(factor);
      } else {
        const double smooth = (orig / wavelen - low) / (high - low);
        f[i] = static_cast<float>(1.0 / ((1.0 - smooth) / factor + smooth));
      }
    }
    w.add_tensor("rope_freqs.weight", DType::F32, {hd / 2},
                 [f](uint8_t* dst, size_t bytes) { std::memcpy(dst, f.data(), std::min(bytes, f.size() * 4)); });
  }
  matrix("token_embd.weight", s.embd, s.vocab);
  vec("output_norm.weight", s.embd, o.output_norm, 0.1f * o.output_norm);
  if (!s.tied) matrix("output.weight", s.embd, s.vocab);
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    norm(p + "attn_norm.weight");
    matrix(p + "attn_q.weight", s.embd, q_dim);
    matrix(p + "attn_k.weight", s.embd, kv_dim);
    matrix(p + "attn_v.weight", s.embd, kv_dim);
    const bool pass = o.pass_through_from >= 0 && l >= o.pass_through_from;
    if (pass) {
      zero_matrix(p + "attn_output.weight", q_dim, s.embd);
    } else {
      matrix(p + "attn_output.weight", q_dim, s.embd);
    }
    if (o.arch == "qwen2") {
      vec(p + "attn_q.bias", q_dim, 0.0f, 0.5f);
      vec(p + "attn_k.bias", kv_dim, 0.0f, 0.5f);
      vec(p + "attn_v.bias", kv_dim, 0.0f, 0.5f);
    }
    if (o.arch == "gemma3" || o.arch == "qwen3") {
      vec(p + "attn_q_norm.weight", hd, 1.0f, 0.1f);
      vec(p + "attn_k_norm.weight", hd, 1.0f, 0.1f);
    }
    if (o.arch == "gemma3") {
      norm(p + "post_attention_norm.weight");
      norm(p + "post_ffw_norm.weight");
    }
    norm(p + "ffn_norm.weight");
    matrix(p + "ffn_gate.weight", s.embd, s.ff);
    matrix(p + "ffn_up.weight", s.embd, s.ff);
    if (pass) {
      zero_matrix(p + "ffn_down.weight", s.ff, s.embd);
    } else {
      matrix(p + "ffn_down.weight", s.ff, s.embd);
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  w.write_file(o.out);
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("wrote %s: %s %s, %lld layers, embd %lld, ff %lld, heads %lld/%lld, vocab %lld, %.1f MiB in %.1f s\n",
              o.out.c_str(), s.name.c_str(), type_name(static_cast<uint32_t>(o.type)), static_cast<long long>(s.layers),
              static_cast<long long>(s.embd), static_cast<long long>(s.ff), static_cast<long long>(s.heads),
              static_cast<long long>(s.kv_heads), static_cast<long long>(s.vocab),
              static_cast<double>(w.file_size()) / (1 << 20), sec);
}

// ---------------------------------------------------------------- LoRA adapter

void write_lora(const Options& o) {
  std::unique_ptr<gguf::GgufFile> base;
  try {
    base = gguf::GgufFile::open(o.lora_for);
  } catch (const Error& e) {
    fail(StatusCode::kInvalidArgument, "--lora-for: cannot read the base model: " + std::string(e.what()));
  }
  const std::string what = "--lora-for " + o.lora_for + ": ";
  const std::optional<std::string> type = base->get_string("general.type");
  if (type && *type != "model")
    fail(StatusCode::kInvalidArgument, what + "general.type is '" + *type + "', not a model");
  const std::optional<std::string> arch = base->get_string("general.architecture");
  if (!arch || arch->empty()) fail(StatusCode::kInvalidArgument, what + "no general.architecture: not a model");
  const std::optional<int64_t> layers = base->get_int(*arch + ".block_count");
  if (!layers || *layers < 1) fail(StatusCode::kInvalidArgument, what + "no " + *arch + ".block_count: not a model");

  const int64_t R = o.lora_rank;
  gguf::GgufWriter w;
  w.add_string("general.architecture", *arch);
  w.add_string("general.type", "adapter");
  w.add_string("general.name", "synthetic-lora");
  w.add_u32("general.file_type", file_type(o.lora_type));
  w.add_string("adapter.type", "lora");
  w.add_f32("adapter.lora.alpha", o.lora_alpha);

  // Streams of their own: an adapter and a model of the same --seed share none.
  uint64_t tensor_seed = o.seed * 1000003ull ^ 0x4C6F5241ull;  // "LoRA"
  auto b_values = std::make_shared<ValueTables>(o.lora_magnitude / std::sqrt(static_cast<float>(R)));
  std::vector<std::pair<int64_t, std::shared_ptr<ValueTables>>> by_k;  // A's values by K (a few widths)
  auto table_for = [&](int64_t K) {
    for (const auto& [k, t] : by_k)
      if (k == K) return t;
    by_k.emplace_back(K, std::make_shared<ValueTables>(1.0f / std::sqrt(static_cast<float>(K))));
    return by_k.back().second;
  };
  const DType t = o.lora_type;
  int pairs = 0;
  uint64_t params = 0;
  for (int64_t il = 0; il < *layers; ++il) {
    for (const char* target : {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"}) {
      const std::string name = "blk." + std::to_string(il) + "." + target + ".weight";
      const gguf::TensorInfo* ti = base->find_tensor(name);
      tensor_seed += 2;  // per target whether present or not: one layer's values do not depend on another's
      if (!ti || ti->n_dims != 2) continue;
      const int64_t K = ti->ne[0], N = ti->ne[1];
      const uint64_t seed_a = tensor_seed - 1, seed_b = tensor_seed;
      auto va = table_for(K);
      w.add_tensor(name + ".lora_a", t, {K, R},
                   [t, seed_a, va](uint8_t* dst, size_t n) { fill_matrix(t, dst, n, seed_a, *va); });
      w.add_tensor(name + ".lora_b", t, {R, N},
                   [t, seed_b, b_values](uint8_t* dst, size_t n) { fill_matrix(t, dst, n, seed_b, *b_values); });
      ++pairs;
      params += static_cast<uint64_t>(R) * static_cast<uint64_t>(K + N);
    }
  }
  if (pairs == 0)
    fail(StatusCode::kInvalidArgument, what + "no 2-D blk.N.{attn_q,...,ffn_down}.weight tensor: not a model");
  w.write_file(o.out);
  std::printf(
      "wrote %s: LoRA for %s (%s, %lld layers), rank %lld, alpha %g, %s, magnitude %g, %d pairs, %llu parameters, %.2f "
      "MiB\n",
      o.out.c_str(), o.lora_for.c_str(), arch->c_str(), static_cast<long long>(*layers), static_cast<long long>(R),
      static_cast<double>(o.lora_alpha), type_name(static_cast<uint32_t>(t)), static_cast<double>(o.lora_magnitude),
      pairs, static_cast<unsigned long long>(params), static_cast<double>(w.file_size()) / (1 << 20));
}

// ---------------------------------------------------------------- verification
//
// Through the public C ABI (include/ember/ember.h) alone, as any program
// that loads the file would.

void check(ember_status st, const char* what) {
  if (st != EMBER_OK) {
    fail(StatusCode::kInternal,
         std::string("verify: ") + what + ": " + ember_status_string(st) + ": " + ember_last_error());
  }
}

using ModelPtr = std::unique_ptr<ember_model, decltype(&ember_model_destroy)>;
using EnginePtr = std::unique_ptr<ember_engine, decltype(&ember_engine_destroy)>;
using SessionPtr = std::unique_ptr<ember_session, decltype(&ember_session_destroy)>;
using StreamPtr = std::unique_ptr<ember_stream, decltype(&ember_stream_destroy)>;

std::vector<int32_t> tokenize(ember_model* model, const std::string& text, bool parse_special) {
  std::vector<int32_t> ids(text.size() + 8);
  size_t n = 0;
  check(ember_tokenize(model, text.c_str(), 0, parse_special, ids.data(), ids.size(), &n), "tokenize");
  ids.resize(n);
  return ids;
}

std::string detokenize(ember_model* model, const std::vector<int32_t>& ids) {
  std::string text(ids.size() * 16 + 16, '\0');
  size_t len = 0;
  check(ember_detokenize(model, ids.data(), ids.size(), text.data(), text.size(), &len), "detokenize");
  text.resize(len);
  return text;
}

SessionPtr new_session(ember_engine* engine) {
  ember_session_params sp;
  ember_session_params_init(&sp);
  ember_session* session = nullptr;
  check(ember_session_create(engine, &sp, &session), "session");
  return SessionPtr(session, ember_session_destroy);
}

// Starts a greedy stream of n tokens (EOS ignored) and returns its tokens.
std::vector<int32_t> greedy(ember_session* session, int32_t n) {
  ember_stream_params p;
  ember_stream_params_init(&p);
  p.max_tokens = n;
  p.temperature = 0.0f;
  p.ignore_eos = 1;
  ember_stream* raw = nullptr;
  check(ember_stream_start(session, &p, &raw), "stream");
  StreamPtr stream(raw, ember_stream_destroy);
  std::vector<int32_t> out;
  for (;;) {
    ember_event e;
    std::memset(&e, 0, sizeof e);
    e.size = sizeof e;
    check(ember_stream_next(stream.get(), &e, -1), "stream event");
    if (e.type == EMBER_EVENT_TEXT) out.insert(out.end(), e.tokens, e.tokens + e.n_tokens);
    if (e.type == EMBER_EVENT_ERROR) check(e.status, "generation");
    if (e.type != EMBER_EVENT_TEXT) break;
  }
  return out;
}

struct Run {
  std::string backend;          // the engine's backend name
  std::vector<int32_t> greedy;  // 3 greedy tokens after the prompt: a prefill, then two decode steps
  std::vector<float> logits;    // every row of the prompt and the first two greedy tokens, scored
  double ms = 0;
};

// One engine on `device`: the greedy continuation of `prompt` from a stream,
// then ember_engine_score's logits over the prompt and that continuation.
Run run(ember_model* model, int32_t device, const std::vector<int32_t>& prompt) {
  const auto t0 = std::chrono::steady_clock::now();
  ember_engine_params ep;
  ember_engine_params_init(&ep);
  ep.device = device;
  ember_engine* raw = nullptr;
  check(ember_engine_create(model, &ep, &raw), "engine");
  EnginePtr engine(raw, ember_engine_destroy);
  ember_engine_info_t info;
  std::memset(&info, 0, sizeof info);
  info.size = sizeof info;
  check(ember_engine_info(engine.get(), &info), "engine info");
  Run r;
  r.backend = info.backend_name ? info.backend_name : "";
  if (device == EMBER_DEVICE_CPU && info.device != EMBER_DEVICE_CPU) {
    fail(StatusCode::kInvalidArgument, "verify: the CPU reference runs on " + r.backend + ": unset EMBER_FORCE_DEVICE");
  }
  {
    SessionPtr session = new_session(engine.get());
    check(ember_session_add_tokens(session.get(), prompt.data(), prompt.size()), "add tokens");
    r.greedy = greedy(session.get(), 3);
  }
  if (r.greedy.size() != 3) fail(StatusCode::kInternal, "verify: the greedy stream did not give 3 tokens");
  std::vector<int32_t> scored = prompt;
  scored.insert(scored.end(), r.greedy.begin(), r.greedy.end() - 1);
  ember_model_info_t mi;
  std::memset(&mi, 0, sizeof mi);
  mi.size = sizeof mi;
  check(ember_model_info(model, &mi), "model info");
  std::vector<float> logprobs(scored.size());
  r.logits.resize(scored.size() * static_cast<size_t>(mi.vocab_size));
  check(ember_engine_score(engine.get(), scored.data(), scored.size(), logprobs.data(), r.logits.data()), "score");
  r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

int verify(const Options& o) {
  const Shape& s = o.shape;
  if (!o.verify_device.empty() && o.verify_device != "cuda" && o.verify_device.rfind("cuda:", 0) != 0) {
    usage(("--verify-device takes cuda or cuda:N, not '" + o.verify_device + "'").c_str());
  }
  ember_model* raw = nullptr;
  check(ember_model_load(o.out.c_str(), nullptr, &raw), "load");
  ModelPtr model(raw, ember_model_destroy);
  ember_model_info_t info;
  std::memset(&info, 0, sizeof info);
  info.size = sizeof info;
  check(ember_model_info(model.get(), &info), "model info");
  auto expect = [](bool ok, const std::string& what) {
    if (!ok) fail(StatusCode::kInternal, "verify: " + what);
  };
  expect(info.n_layers == s.layers && info.n_embd == s.embd && info.n_heads == s.heads &&
             info.n_kv_heads == s.kv_heads && info.vocab_size == s.vocab && info.context_length == s.ctx,
         "hyperparameters differ from the ones written");
  const std::string text = "the cat sat on the mat, and then it ran; \xC3\xA9t\xC3\xA9 <|im_end|>";
  const std::vector<int32_t> ids = tokenize(model.get(), text, true);
  expect(detokenize(model.get(), ids) == text, "tokenizer round trip");
  auto contains_the_one_token_of = [&](const std::string& piece, bool parse_special) {
    const std::vector<int32_t> t = tokenize(model.get(), piece, parse_special);
    return t.size() == 1 && std::find(ids.begin(), ids.end(), t[0]) != ids.end();
  };
  expect(contains_the_one_token_of("<|im_end|>", true), "special token parsed");
  expect(contains_the_one_token_of(" the", false), "merges applied");

  std::vector<int32_t> prompt(ids.begin(), ids.begin() + std::min<size_t>(ids.size(), 20));
  const Run cpu = run(model.get(), EMBER_DEVICE_CPU, prompt);
  {
    // The chat template renders (a chat stream starts).
    ember_engine_params ep;
    ember_engine_params_init(&ep);
    ember_engine* e = nullptr;
    check(ember_engine_create(model.get(), &ep, &e), "engine");
    EnginePtr engine(e, ember_engine_destroy);
    SessionPtr session = new_session(engine.get());
    check(ember_session_add_message(session.get(), "user", "hello"), "chat template");
    greedy(session.get(), 1);
  }
  const int32_t V = info.vocab_size;
  const size_t rows = cpu.logits.size() / static_cast<size_t>(V);
  auto argmax = [V](const float* row) { return static_cast<int32_t>(std::max_element(row, row + V) - row); };
  float max_abs = 0.0f;
  for (float v : cpu.logits) {
    expect(std::isfinite(v), "non-finite logit on the CPU");
    max_abs = std::max(max_abs, std::fabs(v));
  }
  // Scored rows and decode steps agree (batch invariance): the last three
  // rows' argmax are the greedy tokens.
  for (size_t i = 0; i < 3; ++i) {
    expect(argmax(cpu.logits.data() + (rows - 3 + i) * V) == cpu.greedy[i],
           "greedy decoding disagrees with the scored logits");
  }
  std::printf(
      "verify: loaded OK (%s), tokenizer OK, chat template OK, CPU forward OK (%s, %zu prompt tokens + 2 decodes, "
      "%.0f ms, max |logit| %.3f), greedy tokens:",
      info.name, cpu.backend.c_str(), prompt.size(), cpu.ms, max_abs);
  for (int32_t t : cpu.greedy) std::printf(" %d", t);
  std::printf("\n");
  if (o.verify_device.empty()) return 0;

  // In a build tree the plugin sits next to libember.so, where the loader
  // looks. The C ABI names a GPU other than the first through
  // EMBER_FORCE_DEVICE alone (the CPU reference has run).
  if (o.verify_device != "cuda") setenv("EMBER_FORCE_DEVICE", o.verify_device.c_str(), 1);
  ember_capabilities_t caps;
  std::memset(&caps, 0, sizeof caps);
  caps.size = sizeof caps;
  check(ember_capabilities(&caps), "capabilities");
  const Run dev = run(model.get(), EMBER_DEVICE_CUDA, prompt);
  std::printf("verify: device %s (%s)\n", dev.backend.c_str(), caps.cuda_plugin_path ? caps.cuda_plugin_path : "");
  double max_diff = 0.0;
  size_t top1_same = 0;
  for (size_t r = 0; r < rows; ++r) {
    const float* a = cpu.logits.data() + r * V;
    const float* b = dev.logits.data() + r * V;
    for (int32_t i = 0; i < V; ++i) {
      if (!std::isfinite(b[i])) fail(StatusCode::kInternal, "verify: non-finite logit on " + o.verify_device);
      max_diff = std::max(max_diff, static_cast<double>(std::fabs(a[i] - b[i])));
    }
    top1_same += argmax(a) == argmax(b);
  }
  size_t greedy_same = 0;
  for (size_t i = 0; i < 3; ++i) greedy_same += cpu.greedy[i] == dev.greedy[i];
  const double rel = max_diff / std::max(1e-6f, max_abs);
  std::printf(
      "verify: %s vs cpu: max |diff| %.4g (%.3g of max |logit|), top-1 agreement %zu/%zu rows, greedy tokens %zu/3 "
      "equal, %.0f ms\n",
      o.verify_device.c_str(), max_diff, rel, top1_same, rows, greedy_same, dev.ms);
  if (rel > o.tolerance) {
    std::fprintf(stderr, "verify: FAILED: logits differ by more than %.3g of max |logit|\n", o.tolerance);
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace ember

int main(int argc, char** argv) {
  const ember::Options o = ember::parse(argc, argv);
  try {
    if (!o.lora_for.empty()) {
      ember::write_lora(o);
      return 0;
    }
    ember::write_model(o);
    if (o.verify) return ember::verify(o);
  } catch (const ember::Error& e) {
    std::fprintf(stderr, "make_synthetic_model: %s\n", e.what());
    return 1;
  }
  return 0;
}
