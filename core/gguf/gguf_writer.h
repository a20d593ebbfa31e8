// A small GGUF (v2/v3) writer for tests and tools, e.g. writing synthetic
// random-weight models of any shape. Everything it writes is readable by
// GgufFile and by ggml/llama.cpp (same layout: tensor data in the order the
// tensors were added, each tensor padded to the alignment).
//
//   GgufWriter w;                       // version 3, alignment 32
//   w.add_string("general.architecture", "llama");
//   w.add_u32("llama.block_count", 30);
//   w.add_array("tokenizer.ggml.tokens", std::vector<std::string>{"a", "b"});
//   w.add_tensor("tok_embd.weight", DType::F32, {576, 2}, bytes.data(), bytes.size());
//   w.add_tensor("big.weight", DType::F16, {4096, 4096},
//                [](uint8_t* dst, size_t n) { /* fill n bytes */ });  // produced at write time
//   w.write_file("model.gguf");         // or: std::vector<uint8_t> img = w.write();
//
// Misuse (duplicate key/tensor, bad shape, size mismatch, ...) throws
// ember::Error(kInvalidArgument); I/O failures throw ember::Error(kNotFound).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <unordered_set>
#include <vector>

#include "core/gguf/gguf.h"

namespace ember::gguf {

// Value builders, following the reader's conventions: unsigned integers in
// u64, signed integers in i64, floats in f64, bools in b.
Value make_u8(uint8_t v);
Value make_i8(int8_t v);
Value make_u16(uint16_t v);
Value make_i16(int16_t v);
Value make_u32(uint32_t v);
Value make_i32(int32_t v);
Value make_u64(uint64_t v);
Value make_i64(int64_t v);
Value make_f32(float v);
Value make_f64(double v);
Value make_bool(bool v);
Value make_string(std::string v);
// Every element must have type elem_type (arrays of arrays nest this way).
Value make_array(ValueType elem_type, std::vector<Value> elems);

// Overloads used by the typed-vector helpers below.
inline Value make_value(uint8_t v) { return make_u8(v); }
inline Value make_value(int8_t v) { return make_i8(v); }
inline Value make_value(uint16_t v) { return make_u16(v); }
inline Value make_value(int16_t v) { return make_i16(v); }
inline Value make_value(uint32_t v) { return make_u32(v); }
inline Value make_value(int32_t v) { return make_i32(v); }
inline Value make_value(uint64_t v) { return make_u64(v); }
inline Value make_value(int64_t v) { return make_i64(v); }
inline Value make_value(float v) { return make_f32(v); }
inline Value make_value(double v) { return make_f64(v); }
inline Value make_value(bool v) { return make_bool(v); }
inline Value make_value(std::string v) { return make_string(std::move(v)); }

template <class T>
constexpr ValueType value_type_of() {
  if constexpr (std::is_same_v<T, uint8_t>)
    return ValueType::UINT8;
  else if constexpr (std::is_same_v<T, int8_t>)
    return ValueType::INT8;
  else if constexpr (std::is_same_v<T, uint16_t>)
    return ValueType::UINT16;
  else if constexpr (std::is_same_v<T, int16_t>)
    return ValueType::INT16;
  else if constexpr (std::is_same_v<T, uint32_t>)
    return ValueType::UINT32;
  else if constexpr (std::is_same_v<T, int32_t>)
    return ValueType::INT32;
  else if constexpr (std::is_same_v<T, uint64_t>)
    return ValueType::UINT64;
  else if constexpr (std::is_same_v<T, int64_t>)
    return ValueType::INT64;
  else if constexpr (std::is_same_v<T, float>)
    return ValueType::FLOAT32;
  else if constexpr (std::is_same_v<T, double>)
    return ValueType::FLOAT64;
  else if constexpr (std::is_same_v<T, bool>)
    return ValueType::BOOL;
  else if constexpr (std::is_same_v<T, std::string>)
    return ValueType::STRING;
  else
    static_assert(sizeof(T) == 0, "no GGUF value type for T");
}

// Array of scalars/strings from a typed vector, e.g. make_array(std::vector<float>{...}).
template <class T>
Value make_array(const std::vector<T>& values) {
  std::vector<Value> elems;
  elems.reserve(values.size());
  for (const auto& v : values) elems.push_back(make_value(static_cast<T>(v)));
  return make_array(value_type_of<T>(), std::move(elems));
}

class GgufWriter {
 public:
  // Fills exactly nbytes of tensor data at dst; called once, during write.
  using TensorFiller = std::function<void(uint8_t* dst, size_t nbytes)>;

  explicit GgufWriter(uint32_t version = 3);

  void set_version(uint32_t version);  // 2 or 3
  // Power of two. Stored as the uint32 key general.alignment (added or
  // replaced); adding general.alignment with add_kv has the same effect.
  void set_alignment(size_t alignment);
  size_t alignment() const { return alignment_; }
  // Pad the last tensor's data to the alignment too (ggml does; default on).
  void set_pad_end(bool pad) { pad_end_ = pad; }

  // Metadata, written in insertion order. Keys must be unique.
  void add_kv(std::string key, Value value);
  void add_u8(std::string key, uint8_t v) { add_kv(std::move(key), make_u8(v)); }
  void add_i8(std::string key, int8_t v) { add_kv(std::move(key), make_i8(v)); }
  void add_u16(std::string key, uint16_t v) { add_kv(std::move(key), make_u16(v)); }
  void add_i16(std::string key, int16_t v) { add_kv(std::move(key), make_i16(v)); }
  void add_u32(std::string key, uint32_t v) { add_kv(std::move(key), make_u32(v)); }
  void add_i32(std::string key, int32_t v) { add_kv(std::move(key), make_i32(v)); }
  void add_u64(std::string key, uint64_t v) { add_kv(std::move(key), make_u64(v)); }
  void add_i64(std::string key, int64_t v) { add_kv(std::move(key), make_i64(v)); }
  void add_f32(std::string key, float v) { add_kv(std::move(key), make_f32(v)); }
  void add_f64(std::string key, double v) { add_kv(std::move(key), make_f64(v)); }
  void add_bool(std::string key, bool v) { add_kv(std::move(key), make_bool(v)); }
  void add_string(std::string key, std::string v) { add_kv(std::move(key), make_string(std::move(v))); }
  void add_array(std::string key, ValueType elem_type, std::vector<Value> elems) {
    add_kv(std::move(key), make_array(elem_type, std::move(elems)));
  }
  template <class T>
  void add_array(std::string key, const std::vector<T>& values) {
    add_kv(std::move(key), make_array(values));
  }

  // Tensors. ne is innermost-first (ne[0] contiguous), 1..4 dims, each > 0,
  // ne[0] a multiple of the type's block size; nbytes must equal the
  // tensor's size. Names must be unique and at most 64 bytes.
  void add_tensor(std::string name, DType type, std::vector<int64_t> ne, const void* data, size_t nbytes);
  void add_tensor(std::string name, DType type, std::vector<int64_t> ne, std::vector<uint8_t> data);
  void add_tensor(std::string name, DType type, std::vector<int64_t> ne, TensorFiller fill);

  size_t kv_count() const { return kv_.size(); }
  size_t tensor_count() const { return tensors_.size(); }
  // Size of the file write() would produce.
  uint64_t file_size() const;

  std::vector<uint8_t> write() const;
  // Streams to path (tensor data produced one tensor at a time, so a filler
  // never needs more than one tensor in memory). Removes the file on failure.
  void write_file(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    DType type;
    std::vector<int64_t> ne;
    size_t nbytes = 0;
    uint64_t offset = 0;         // relative to the data section
    std::vector<uint8_t> bytes;  // when not produced by fill
    TensorFiller fill;
  };
  using WriteFn = std::function<void(const uint8_t*, size_t)>;

  void check_tensor(const std::string& name, DType type, const std::vector<int64_t>& ne, size_t* nbytes) const;
  void push_tensor(Tensor t);
  uint64_t header_size() const;
  void emit(const WriteFn& write_bytes) const;

  uint32_t version_ = 3;
  size_t alignment_ = 32;
  bool pad_end_ = true;
  std::vector<std::pair<std::string, Value>> kv_;
  std::unordered_set<std::string> keys_;
  std::vector<Tensor> tensors_;
  std::unordered_set<std::string> tensor_names_;
  uint64_t data_size_ = 0;  // unpadded end of the last tensor, relative to the data section
};

}  // namespace ember::gguf
