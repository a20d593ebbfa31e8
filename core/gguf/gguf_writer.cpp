#include "core/gguf/gguf_writer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <system_error>

#include "core/util/status.h"

namespace ember::gguf {

namespace {

constexpr uint32_t kMaxArrayDepth = 8;  // matches the reader
constexpr size_t kMaxKeyLength = 65535;
constexpr size_t kMaxTensorName = 64;

[[noreturn]] void invalid(const std::string& msg) { fail(StatusCode::kInvalidArgument, "gguf writer: " + msg); }

bool is_unsigned(ValueType t) {
  return t == ValueType::UINT8 || t == ValueType::UINT16 || t == ValueType::UINT32 || t == ValueType::UINT64;
}
bool is_signed(ValueType t) {
  return t == ValueType::INT8 || t == ValueType::INT16 || t == ValueType::INT32 || t == ValueType::INT64;
}

Value scalar(ValueType t) {
  Value v;
  v.type = t;
  return v;
}

// Checks a value is encodable (and readable back): known types, integer
// ranges, homogeneous arrays, nesting depth.
void check_value(const Value& v, const std::string& key, uint32_t depth) {
  auto range = [&](bool ok) {
    if (!ok) invalid("key '" + key + "': value out of range for " + value_type_name(v.type));
  };
  switch (v.type) {
    case ValueType::UINT8: range(v.u64 <= 0xFF); break;
    case ValueType::UINT16: range(v.u64 <= 0xFFFF); break;
    case ValueType::UINT32: range(v.u64 <= 0xFFFFFFFFu); break;
    case ValueType::INT8: range(v.i64 >= -128 && v.i64 <= 127); break;
    case ValueType::INT16: range(v.i64 >= -32768 && v.i64 <= 32767); break;
    case ValueType::INT32:
      range(v.i64 >= std::numeric_limits<int32_t>::min() && v.i64 <= std::numeric_limits<int32_t>::max());
      break;
    case ValueType::UINT64:
    case ValueType::INT64:
    case ValueType::FLOAT32:
    case ValueType::FLOAT64:
    case ValueType::BOOL:
    case ValueType::STRING: break;
    case ValueType::ARRAY:
      if (depth >= kMaxArrayDepth) {
        invalid("key '" + key + "': arrays nested deeper than " + std::to_string(kMaxArrayDepth) + " levels");
      }
      if (static_cast<uint32_t>(v.array_type) > static_cast<uint32_t>(ValueType::FLOAT64)) {
        invalid("key '" + key + "': unknown array element type " + std::to_string(static_cast<uint32_t>(v.array_type)));
      }
      for (const Value& e : v.array) {
        if (e.type != v.array_type) {
          invalid("key '" + key + "': array of " + value_type_name(v.array_type) + " holds a " +
                  value_type_name(e.type) + " element");
        }
        check_value(e, key, depth + 1);
      }
      break;
    default: invalid("key '" + key + "': unknown value type " + std::to_string(static_cast<uint32_t>(v.type)));
  }
}

// Little-endian encoding into a byte vector (host is little-endian; the
// reader static_asserts the same).
template <class T>
void put(std::vector<uint8_t>& out, T v) {
  const size_t n = out.size();
  out.resize(n + sizeof(T));
  std::memcpy(out.data() + n, &v, sizeof(T));
}

void put_string(std::vector<uint8_t>& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

void put_value(std::vector<uint8_t>& out, const Value& v) {
  switch (v.type) {
    case ValueType::UINT8: put<uint8_t>(out, static_cast<uint8_t>(v.u64)); break;
    case ValueType::INT8: put<int8_t>(out, static_cast<int8_t>(v.i64)); break;
    case ValueType::UINT16: put<uint16_t>(out, static_cast<uint16_t>(v.u64)); break;
    case ValueType::INT16: put<int16_t>(out, static_cast<int16_t>(v.i64)); break;
    case ValueType::UINT32: put<uint32_t>(out, static_cast<uint32_t>(v.u64)); break;
    case ValueType::INT32: put<int32_t>(out, static_cast<int32_t>(v.i64)); break;
    case ValueType::UINT64: put<uint64_t>(out, v.u64); break;
    case ValueType::INT64: put<int64_t>(out, v.i64); break;
    case ValueType::FLOAT32: put<float>(out, static_cast<float>(v.f64)); break;
    case ValueType::FLOAT64: put<double>(out, v.f64); break;
    case ValueType::BOOL: put<uint8_t>(out, v.b ? 1 : 0); break;
    case ValueType::STRING: put_string(out, v.str); break;
    case ValueType::ARRAY:
      put<uint32_t>(out, static_cast<uint32_t>(v.array_type));
      put<uint64_t>(out, v.array.size());
      for (const Value& e : v.array) put_value(out, e);
      break;
  }
}

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) & ~(a - 1); }

}  // namespace

Value make_u8(uint8_t v) {
  Value r = scalar(ValueType::UINT8);
  r.u64 = v;
  return r;
}
Value make_i8(int8_t v) {
  Value r = scalar(ValueType::INT8);
  r.i64 = v;
  return r;
}
Value make_u16(uint16_t v) {
  Value r = scalar(ValueType::UINT16);
  r.u64 = v;
  return r;
}
Value make_i16(int16_t v) {
  Value r = scalar(ValueType::INT16);
  r.i64 = v;
  return r;
}
Value make_u32(uint32_t v) {
  Value r = scalar(ValueType::UINT32);
  r.u64 = v;
  return r;
}
Value make_i32(int32_t v) {
  Value r = scalar(ValueType::INT32);
  r.i64 = v;
  return r;
}
Value make_u64(uint64_t v) {
  Value r = scalar(ValueType::UINT64);
  r.u64 = v;
  return r;
}
Value make_i64(int64_t v) {
  Value r = scalar(ValueType::INT64);
  r.i64 = v;
  return r;
}
Value make_f32(float v) {
  Value r = scalar(ValueType::FLOAT32);
  r.f64 = v;
  return r;
}
Value make_f64(double v) {
  Value r = scalar(ValueType::FLOAT64);
  r.f64 = v;
  return r;
}
Value make_bool(bool v) {
  Value r = scalar(ValueType::BOOL);
  r.b = v;
  return r;
}
Value make_string(std::string v) {
  Value r = scalar(ValueType::STRING);
  r.str = std::move(v);
  return r;
}
Value make_array(ValueType elem_type, std::vector<Value> elems) {
  Value r = scalar(ValueType::ARRAY);
  r.array_type = elem_type;
  r.array = std::move(elems);
  return r;
}

GgufWriter::GgufWriter(uint32_t version) { set_version(version); }

void GgufWriter::set_version(uint32_t version) {
  if (version != 2 && version != 3) invalid("version " + std::to_string(version) + " (only 2 and 3 can be written)");
  version_ = version;
}

void GgufWriter::set_alignment(size_t alignment) {
  if (!tensors_.empty()) invalid("the alignment must be set before adding tensors");
  if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > 0xFFFFFFFFu) {
    invalid("alignment " + std::to_string(alignment) + " is not a power of two that fits in uint32");
  }
  for (auto& [k, v] : kv_) {
    if (k == "general.alignment") {
      v = make_u32(static_cast<uint32_t>(alignment));
      alignment_ = alignment;
      return;
    }
  }
  add_kv("general.alignment", make_u32(static_cast<uint32_t>(alignment)));
}

void GgufWriter::add_kv(std::string key, Value value) {
  if (key.empty()) invalid("empty metadata key");
  if (key.size() > kMaxKeyLength) invalid("metadata key longer than " + std::to_string(kMaxKeyLength) + " bytes");
  if (keys_.count(key) != 0) invalid("duplicate metadata key '" + key + "'");
  check_value(value, key, 0);
  if (key == "general.alignment") {
    uint64_t a = 0;
    if (is_unsigned(value.type))
      a = value.u64;
    else if (is_signed(value.type) && value.i64 > 0)
      a = static_cast<uint64_t>(value.i64);
    if (a == 0 || (a & (a - 1)) != 0 || a > (uint64_t{1} << 31)) {
      invalid("general.alignment must be a power-of-two integer");
    }
    if (!tensors_.empty()) invalid("general.alignment must be set before adding tensors");
    alignment_ = static_cast<size_t>(a);
  }
  keys_.insert(key);
  kv_.emplace_back(std::move(key), std::move(value));
}

void GgufWriter::check_tensor(const std::string& name, DType type, const std::vector<int64_t>& ne,
                              size_t* nbytes) const {
  if (name.empty()) invalid("empty tensor name");
  if (name.size() > kMaxTensorName) {
    invalid("tensor name '" + name + "' is longer than " + std::to_string(kMaxTensorName) + " bytes");
  }
  if (tensor_names_.count(name) != 0) invalid("duplicate tensor '" + name + "'");
  const TypeTraits* tt = type_traits(type);
  if (tt == nullptr) invalid("tensor '" + name + "': unknown type id " + std::to_string(static_cast<uint32_t>(type)));
  if (ne.empty() || ne.size() > 4) invalid("tensor '" + name + "': needs 1..4 dimensions");
  int64_t n = 1;
  for (int64_t d : ne) {
    if (d <= 0) invalid("tensor '" + name + "': dimensions must be > 0");
    if (__builtin_mul_overflow(n, d, &n)) invalid("tensor '" + name + "': element count overflows");
  }
  if (ne[0] % tt->block_size != 0) {
    invalid("tensor '" + name + "': ne[0]=" + std::to_string(ne[0]) + " is not a multiple of the " + tt->name +
            " block size " + std::to_string(tt->block_size));
  }
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(n) / tt->block_size, uint64_t{tt->type_size}, &bytes) ||
      bytes > std::numeric_limits<size_t>::max() / 2) {
    invalid("tensor '" + name + "': size overflows");
  }
  *nbytes = static_cast<size_t>(bytes);
}

void GgufWriter::push_tensor(Tensor t) {
  t.offset = align_up(data_size_, alignment_);
  data_size_ = t.offset + t.nbytes;
  tensor_names_.insert(t.name);
  tensors_.push_back(std::move(t));
}

void GgufWriter::add_tensor(std::string name, DType type, std::vector<int64_t> ne, const void* data, size_t nbytes) {
  size_t expected = 0;
  check_tensor(name, type, ne, &expected);
  if (nbytes != expected) {
    invalid("tensor '" + name + "': got " + std::to_string(nbytes) + " bytes of data, its shape needs " +
            std::to_string(expected));
  }
  if (data == nullptr && nbytes != 0) invalid("tensor '" + name + "': null data");
  Tensor t;
  t.name = std::move(name);
  t.type = type;
  t.ne = std::move(ne);
  t.nbytes = expected;
  const auto* p = static_cast<const uint8_t*>(data);
  t.bytes.assign(p, p + nbytes);
  push_tensor(std::move(t));
}

void GgufWriter::add_tensor(std::string name, DType type, std::vector<int64_t> ne, std::vector<uint8_t> data) {
  size_t expected = 0;
  check_tensor(name, type, ne, &expected);
  if (data.size() != expected) {
    invalid("tensor '" + name + "': got " + std::to_string(data.size()) + " bytes of data, its shape needs " +
            std::to_string(expected));
  }
  Tensor t;
  t.name = std::move(name);
  t.type = type;
  t.ne = std::move(ne);
  t.nbytes = expected;
  t.bytes = std::move(data);
  push_tensor(std::move(t));
}

void GgufWriter::add_tensor(std::string name, DType type, std::vector<int64_t> ne, TensorFiller fill) {
  size_t expected = 0;
  check_tensor(name, type, ne, &expected);
  if (!fill) invalid("tensor '" + name + "': empty filler");
  Tensor t;
  t.name = std::move(name);
  t.type = type;
  t.ne = std::move(ne);
  t.nbytes = expected;
  t.fill = std::move(fill);
  push_tensor(std::move(t));
}

uint64_t GgufWriter::header_size() const {
  uint64_t n = 4 + 4 + 8 + 8;
  std::vector<uint8_t> tmp;
  for (const auto& [k, v] : kv_) {
    tmp.clear();
    put_value(tmp, v);
    n += 8 + k.size() + 4 + tmp.size();
  }
  for (const Tensor& t : tensors_) n += 8 + t.name.size() + 4 + 8 * t.ne.size() + 4 + 8;
  return n;
}

uint64_t GgufWriter::file_size() const {
  const uint64_t data_start = align_up(header_size(), alignment_);
  if (tensors_.empty()) return data_start;
  return data_start + (pad_end_ ? align_up(data_size_, alignment_) : data_size_);
}

void GgufWriter::emit(const WriteFn& write_bytes) const {
  static const uint8_t kZero[256] = {};
  auto zeros = [&](uint64_t n) {
    while (n > 0) {
      const size_t k = n < sizeof(kZero) ? static_cast<size_t>(n) : sizeof(kZero);
      write_bytes(kZero, k);
      n -= k;
    }
  };
  std::vector<uint8_t> buf;
  buf.reserve(static_cast<size_t>(header_size()));
  put<uint32_t>(buf, 0x46554747u);  // 'G' 'G' 'U' 'F' little-endian
  put<uint32_t>(buf, version_);
  put<uint64_t>(buf, tensors_.size());
  put<uint64_t>(buf, kv_.size());
  for (const auto& [k, v] : kv_) {
    put_string(buf, k);
    put<uint32_t>(buf, static_cast<uint32_t>(v.type));
    put_value(buf, v);
  }
  for (const Tensor& t : tensors_) {
    put_string(buf, t.name);
    put<uint32_t>(buf, static_cast<uint32_t>(t.ne.size()));
    for (int64_t d : t.ne) put<uint64_t>(buf, static_cast<uint64_t>(d));
    put<uint32_t>(buf, static_cast<uint32_t>(t.type));
    put<uint64_t>(buf, t.offset);
  }
  write_bytes(buf.data(), buf.size());
  uint64_t pos = buf.size();
  const uint64_t data_start = align_up(pos, alignment_);
  zeros((data_start - pos));
  buf.clear();
  buf.shrink_to_fit();

  uint64_t rel = 0;  // position relative to the data section
  std::vector<uint8_t> scratch;
  for (const Tensor& t : tensors_) {
    zeros((t.offset - rel));
    if (t.fill) {
      scratch.assign(t.nbytes, 0);
      t.fill(scratch.data(), scratch.size());
      write_bytes(scratch.data(), scratch.size());
      scratch.clear();
      scratch.shrink_to_fit();
    } else {
      write_bytes(t.bytes.data(), t.bytes.size());
    }
    rel = t.offset + t.nbytes;
  }
  if (!tensors_.empty() && pad_end_) zeros((align_up(rel, alignment_) - rel));
}

std::vector<uint8_t> GgufWriter::write() const {
  std::vector<uint8_t> out;
  out.reserve(static_cast<size_t>(file_size()));
  emit([&out](const uint8_t* p, size_t n) { out.insert(out.end(), p, p + n); });
  return out;
}

void GgufWriter::write_file(const std::string& path) const {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    const int err = errno;
    fail(StatusCode::kNotFound, "gguf writer: cannot create '" + path + "': " + std::system_category().message(err));
  }
  try {
    emit([&](const uint8_t* p, size_t n) {
      if (n != 0 && std::fwrite(p, 1, n, f) != n) {
        const int err = errno;
        fail(StatusCode::kNotFound,
             "gguf writer: write to '" + path + "' failed: " + std::system_category().message(err));
      }
    });
  } catch (...) {
    std::fclose(f);
    std::remove(path.c_str());
    throw;
  }
  if (std::fclose(f) != 0) {
    const int err = errno;
    std::remove(path.c_str());
    fail(StatusCode::kNotFound, "gguf writer: closing '" + path + "' failed: " + std::system_category().message(err));
  }
}

}  // namespace ember::gguf
