// Helpers shared by the GGUF tests.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/gguf/gguf.h"
#include "core/gguf/gguf_writer.h"

namespace ember::gguf::testing {

// Raw little-endian byte builder, for files the writer refuses to produce.
struct Raw {
  std::vector<uint8_t> b;

  template <class T>
  Raw& put(T v) {
    const size_t n = b.size();
    b.resize(n + sizeof(T));
    std::memcpy(b.data() + n, &v, sizeof(T));
    return *this;
  }
  Raw& u8(uint8_t v) { return put(v); }
  Raw& u32(uint32_t v) { return put(v); }
  Raw& u64(uint64_t v) { return put(v); }
  Raw& i32(int32_t v) { return put(v); }
  Raw& str(const std::string& s) {
    u64(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Raw& bytes(const std::string& s) {
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Raw& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    bytes("GGUF");
    u32(version);
    u64(n_tensors);
    return u64(n_kv);
  }
  // key + type + (caller appends the value)
  Raw& key(const std::string& k, ValueType t) { return str(k).u32(static_cast<uint32_t>(t)); }
  Raw& kv_u32(const std::string& k, uint32_t v) { return key(k, ValueType::UINT32).u32(v); }
  Raw& kv_str(const std::string& k, const std::string& v) { return key(k, ValueType::STRING).str(v); }
  Raw& tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
    str(name).u32(static_cast<uint32_t>(ne.size()));
    for (uint64_t d : ne) u64(d);
    return u32(type).u64(offset);
  }
  Raw& pad(size_t alignment) {
    while (b.size() % alignment != 0) b.push_back(0);
    return *this;
  }
  Raw& zeros(size_t n) {
    b.insert(b.end(), n, 0);
    return *this;
  }
};

inline std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * 4);
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// A small but representative valid file: scalars of every type, arrays
// (incl. nested and string arrays) and tensors of several types. The last
// tensor ends exactly at EOF, so every strict prefix of the file is invalid.
inline std::vector<uint8_t> small_valid_file(uint32_t version = 3) {
  GgufWriter w(version);
  w.add_string("general.architecture", "llama");
  w.add_u32("llama.block_count", 2);
  w.add_u8("t.u8", 7);
  w.add_i8("t.i8", -7);
  w.add_u16("t.u16", 700);
  w.add_i16("t.i16", -700);
  w.add_i32("t.i32", -70000);
  w.add_u64("t.u64", 1ull << 40);
  w.add_i64("t.i64", -(1ll << 40));
  w.add_f32("t.f32", 0.5f);
  w.add_f64("t.f64", 0.25);
  w.add_bool("t.bool", true);
  w.add_array("tokenizer.ggml.tokens", std::vector<std::string>{"<s>", "</s>", "hello", ""});
  w.add_array("t.scores", std::vector<float>{0.0f, -1.0f, 2.5f});
  w.add_array("t.nested", ValueType::ARRAY,
              {make_array(std::vector<int32_t>{1, 2}), make_array(std::vector<int32_t>{}),
               make_array(std::vector<int32_t>{3})});
  std::vector<uint8_t> q(2 * sizeof(BlockQ8_0));
  for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<uint8_t>(i * 7 + 1);
  q[0] = 0x00;
  q[1] = 0x3C;  // d = 1.0 for both blocks
  q[34] = 0x00;
  q[35] = 0x38;
  w.add_tensor("token_embd.weight", DType::Q8_0, {32, 2}, q);
  std::vector<uint8_t> q4(sizeof(BlockQ4_0) * 2, 0x5A);
  w.add_tensor("blk.0.attn_q.weight", DType::Q4_0, {64}, q4);
  std::vector<float> f(32);
  for (int i = 0; i < 32; ++i) f[static_cast<size_t>(i)] = static_cast<float>(i) - 3.5f;
  w.add_tensor("output_norm.weight", DType::F32, {8, 4}, f32_bytes(f));  // 128 bytes, a multiple of 32
  return w.write();
}

}  // namespace ember::gguf::testing
