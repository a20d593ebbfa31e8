// libFuzzer target: the GGUF reader (GgufFile::from_memory), every typed
// getter on every key, every tensor's bytes, and what is built from a GGUF's
// metadata: the tokenizer (Tokenizer::from_gguf, then encode/decode) and the
// chat template (tokenizer.chat_template, parsed and rendered); and the
// input as a LoRA adapter (LoraAdapter::from_file) against a one-layer
// synthetic base written at start-up by tools/make_synthetic_model.
//
// Promise checked: any input is either parsed or rejected with ember::Error;
// no crash, sanitizer report, other exception, or tensor outside the image.
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/chat/chat_template.h"
#include "core/model/lora.h"
#include "core/model/model.h"
#include "core/gguf/gguf.h"
#include "core/gguf/gguf_writer.h"
#include "core/tensor/types.h"
#include "core/tokenizer/tokenizer.h"
#include "core/util/status.h"
#include "fuzz_util.h"
#include "fuzz_vocab.h"

namespace ember::fuzz {
namespace {

using gguf::GgufFile;
using gguf::GgufWriter;
using gguf::ValueType;

template <class F>
void expect_ok_or_error(F&& f) {
  try {
    f();
  } catch (const Error&) {
  }
}

void exercise_tokenizer(const GgufFile& f) {
  std::unique_ptr<Tokenizer> tok;
  try {
    tok = Tokenizer::from_gguf(f);
  } catch (const Error&) {
    return;
  }
  for (const char* text : {"Hello world, it's 123 \xC3\xA9t\xC3\xA9 <|im_start|>user\n\xE4\xB8\xAD", ""}) {
    for (bool special : {false, true}) {
      std::vector<int32_t> ids;
      expect_ok_or_error([&] { ids = tok->encode(text, special, special); });
      for (int32_t id : ids) EMBER_FUZZ_CHECK(id >= 0 && id < tok->n_vocab());
      expect_ok_or_error([&] { (void)tok->decode(ids); });
    }
  }
  StreamingDetokenizer detok(*tok);
  const int32_t n = std::min<int32_t>(tok->n_vocab(), 1024);
  for (int32_t id = 0; id < n; ++id) {
    (void)tok->token_to_piece(id);
    (void)tok->is_control(id);
    (void)tok->is_eog(id);
    (void)detok.feed(id);
  }
  (void)detok.flush();
}

void exercise_chat_template(const GgufFile& f) {
  std::optional<std::string> src;
  try {
    src = f.get_string("tokenizer.chat_template");
  } catch (const Error&) {
    return;
  }
  if (!src) return;
  expect_ok_or_error([&] {
    ChatTemplate t = ChatTemplate::parse(*src);
    ChatTemplateOptions opt;
    opt.bos_token = "<s>";
    opt.eos_token = "</s>";
    (void)t.apply({{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello"}, {"user", "Bye"}}, opt);
  });
}

void exercise(const GgufFile& f) {
  (void)f.version();
  (void)f.alignment();
  EMBER_FUZZ_CHECK(f.data_offset() <= f.file_size());
  for (const auto& kv : f.metadata()) {
    const std::string& key = kv.first;
    const gguf::Value& value = kv.second;
    EMBER_FUZZ_CHECK(f.find(key) != nullptr);
    (void)gguf::value_type_name(value.type);
    expect_ok_or_error([&] { (void)f.get_int(key); });
    expect_ok_or_error([&] { (void)f.get_float(key); });
    expect_ok_or_error([&] { (void)f.get_bool(key); });
    expect_ok_or_error([&] { (void)f.get_string(key); });
    expect_ok_or_error([&] { (void)f.get_string_array(key); });
    expect_ok_or_error([&] { (void)f.get_int_array(key); });
    expect_ok_or_error([&] { (void)f.get_float_array(key); });
  }
  const uint8_t* begin = f.data();
  const uint8_t* end = begin + f.file_size();
  volatile uint8_t sink = 0;
  for (const gguf::TensorInfo& t : f.tensors()) {
    EMBER_FUZZ_CHECK(f.find_tensor(t.name) != nullptr);
    EMBER_FUZZ_CHECK(t.n_dims >= 1 && t.n_dims <= 4);
    (void)type_name(static_cast<uint32_t>(t.type));
    if (t.nbytes == 0) continue;
    const auto* d = static_cast<const uint8_t*>(t.data);
    EMBER_FUZZ_CHECK(d >= begin && d < end && t.nbytes <= static_cast<size_t>(end - d));
    sink = sink + d[0] + d[t.nbytes - 1];  // ASan checks the exact-size copy
  }
  (void)sink;
  exercise_tokenizer(f);
  exercise_chat_template(f);
}

// ---------------------------------------------------------------- seeds

std::vector<uint8_t> seed_all_value_types(uint32_t version) {
  GgufWriter w(version);
  w.add_string("general.architecture", "llama");
  w.add_u8("t.u8", 200);
  w.add_i8("t.i8", -5);
  w.add_u16("t.u16", 60000);
  w.add_i16("t.i16", -30000);
  w.add_u32("t.u32", 4000000000u);
  w.add_i32("t.i32", -7);
  w.add_u64("t.u64", ~0ull);
  w.add_i64("t.i64", -1234567890123ll);
  w.add_f32("t.f32", 1.5f);
  w.add_f64("t.f64", -2.25);
  w.add_bool("t.bool", true);
  w.add_array("t.arr_str", std::vector<std::string>{"a", "bc", ""});
  w.add_array("t.arr_i32", std::vector<int32_t>{1, -2, 3});
  w.add_array("t.arr_f32", std::vector<float>{0.5f, 1e30f});
  w.add_array("t.arr_nested", ValueType::ARRAY,
              {gguf::make_array(std::vector<uint8_t>{1, 2}), gguf::make_array(std::vector<uint8_t>{})});
  w.add_u32("llama.block_count", 1);
  std::vector<uint8_t> f32(8 * 4, 0x3f);
  w.add_tensor("t.f32", DType::F32, {8}, f32);
  w.add_tensor("t.f16", DType::F16, {4, 2}, std::vector<uint8_t>(16, 0x3c));
  w.add_tensor("t.q4_0", DType::Q4_0, {32}, std::vector<uint8_t>(18, 0x11));
  w.add_tensor("t.q8_0", DType::Q8_0, {32, 1, 1, 1}, std::vector<uint8_t>(34, 0x22));
  return w.write();
}

std::vector<uint8_t> seed_tokenizer(const std::string& pre, bool with_template) {
  const Tokenizer::Vocab v = synthetic_vocab(pre);
  GgufWriter w;
  w.set_alignment(64);
  w.add_string("general.architecture", "llama");
  w.add_string("tokenizer.ggml.model", v.model);
  w.add_string("tokenizer.ggml.pre", *v.pre);
  w.add_array("tokenizer.ggml.tokens", v.tokens);
  w.add_array("tokenizer.ggml.token_type", v.token_types);
  w.add_array("tokenizer.ggml.merges", v.merges);
  w.add_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(*v.bos));
  w.add_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(*v.eos));
  w.add_u32("tokenizer.ggml.eot_token_id", static_cast<uint32_t>(*v.eot));
  w.add_u32("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(*v.unk));
  w.add_bool("tokenizer.ggml.add_bos_token", true);
  if (with_template) {
    w.add_string("tokenizer.chat_template",
                 "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                 "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' "
                 "}}{% endif %}");
  }
  w.add_tensor("token_embd.weight", DType::F16, {32, 1}, std::vector<uint8_t>(64, 0));
  return w.write();
}

// The base the inputs are tried against as adapters (the shape of
// seed_lora's): one layer, 64 wide, 4 heads of 16, 2 KV heads, FFN 128.
const Model* lora_base() {
  static std::shared_ptr<Model> base = [] {
    char dir[] = "/tmp/ember-fuzz-gguf-XXXXXX";
    if (!mkdtemp(dir)) return std::shared_ptr<Model>();
    const std::string path = std::string(dir) + "/base.gguf";
    std::shared_ptr<Model> m;
    if (make_synthetic_model({"--layers", "1", "--embd", "64", "--ff", "128", "--heads", "4", "--kv-heads", "2",
                              "--vocab", "384", "--ctx", "256", "--type", "q8_0", "--seed", "7", "--out", path})) {
      m = Model::load(path);  // a private copy: the file can go
    }
    std::remove(path.c_str());
    ::rmdir(dir);
    return m;
  }();
  return base.get();
}

void exercise_lora(std::unique_ptr<GgufFile> f) {
  const Model* base = lora_base();
  if (!base) return;
  std::shared_ptr<const LoraAdapter> a;
  try {
    a = LoraAdapter::from_file(std::move(f), "fuzz", *base);
  } catch (const Error&) {
    return;
  }
  EMBER_FUZZ_CHECK(a->n_pairs() > 0 && a->max_rank() >= 1 && a->fits(*base));
  size_t bytes = 0;
  for (int32_t il = 0; il < base->config().n_layers; ++il) {
    for (int32_t t = 0; t < kLoraLayerTargets; ++t) {
      const LoraAdapter::Pair* p = a->find(il, static_cast<LoraTarget>(t));
      if (!p) continue;
      EMBER_FUZZ_CHECK(p->rank >= 1 && p->a.rows == p->rank && p->b.cols == p->rank && p->a.host_data &&
                       p->b.host_data && std::isfinite(p->alpha_scale));
      bytes += static_cast<size_t>(p->a.rows) * row_bytes(p->a.type, p->a.cols) +
               static_cast<size_t>(p->b.rows) * row_bytes(p->b.type, p->b.cols);
    }
  }
  EMBER_FUZZ_CHECK(bytes == a->bytes());
  expect_ok_or_error([&] { (void)LoraSet::make({{a, 0.5f}, {a, -2.0f}}); });
}

// A rank-4 adapter for lora_base(): every matrix of layer 0, F16 and F32.
std::vector<uint8_t> seed_lora(bool with_alpha) {
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_string("general.type", "adapter");
  w.add_string("adapter.type", "lora");
  if (with_alpha) w.add_f32("adapter.lora.alpha", 8.0f);
  const int64_t r = 4;
  const struct {
    const char* name;
    int64_t k, n;
  } mats[] = {{"attn_q", 64, 64}, {"attn_k", 64, 32},  {"attn_v", 64, 32},  {"attn_output", 64, 64},
              {"ffn_gate", 64, 128}, {"ffn_up", 64, 128}, {"ffn_down", 128, 64}};
  int i = 0;
  for (const auto& m : mats) {
    const DType t = (i++ % 2) ? DType::F32 : DType::F16;
    const size_t es = t == DType::F32 ? 4 : 2;
    const std::string base = std::string("blk.0.") + m.name + ".weight";
    w.add_tensor(base + ".lora_a", t, {m.k, r}, std::vector<uint8_t>(static_cast<size_t>(m.k * r) * es, 0x1c));
    w.add_tensor(base + ".lora_b", t, {r, m.n}, std::vector<uint8_t>(static_cast<size_t>(m.n * r) * es, 0x1b));
  }
  return w.write();
}

void write_seeds(const std::string& dir) {
  write_seed(dir, "lora-alpha", seed_lora(true));
  write_seed(dir, "lora-plain", seed_lora(false));
  write_seed(dir, "values-v3", seed_all_value_types(3));
  write_seed(dir, "values-v2", seed_all_value_types(2));
  write_seed(dir, "tokenizer-gpt2-template", seed_tokenizer("gpt-2", true));
  write_seed(dir, "tokenizer-smollm", seed_tokenizer("smollm", false));
  write_seed(dir, "tokenizer-llama3", seed_tokenizer("llama3", false));
  GgufWriter empty;
  write_seed(dir, "empty", empty.write());
}

}  // namespace
}  // namespace ember::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  ember::fuzz::write_seeds_if_asked(ember::fuzz::write_seeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // An exactly-sized copy: any read past the end is an ASan report.
  std::unique_ptr<uint8_t[]> copy(new uint8_t[size == 0 ? 1 : size]);
  if (size) std::memcpy(copy.get(), data, size);
  try {
    auto f = ember::gguf::GgufFile::from_memory(size ? copy.get() : nullptr, size);
    ember::fuzz::exercise(*f);
    ember::fuzz::exercise_lora(ember::gguf::GgufFile::from_memory(copy.get(), size));
  } catch (const ember::Error&) {
  }
  return 0;
}
