// GGUF reader (versions 2 and 3). The file is memory-mapped (or copied into
// private memory, Residency::kPrivateCopy); every offset,
// size, count and type is validated before use, and any problem is reported
// as ember::Error(kBadFormat / kNotFound / kUnsupported) naming the problem.
// Spec: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/tensor/types.h"

namespace ember::gguf {

enum class ValueType : uint32_t {
  UINT8 = 0,
  INT8 = 1,
  UINT16 = 2,
  INT16 = 3,
  UINT32 = 4,
  INT32 = 5,
  FLOAT32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  UINT64 = 10,
  INT64 = 11,
  FLOAT64 = 12,
};
const char* value_type_name(ValueType t);

// One metadata value. Scalars live in the union-like fields; arrays hold their
// elements (arrays may nest).
struct Value {
  ValueType type = ValueType::UINT8;
  union {
    uint64_t u64;
    int64_t i64;
    double f64;
    bool b;
  };
  std::string str;                          // STRING
  ValueType array_type = ValueType::UINT8;  // ARRAY: element type
  std::vector<Value> array;                 // ARRAY
  Value() : u64(0) {}
  bool is_integer() const;
  bool is_float() const;
};

struct TensorInfo {
  std::string name;
  uint32_t n_dims = 0;
  int64_t ne[4] = {1, 1, 1, 1};  // ne[0] is the contiguous (innermost) dimension
  DType type = DType::F32;
  uint64_t offset = 0;  // relative to the start of the data section
  size_t nbytes = 0;
  const void* data = nullptr;  // inside the mapping; valid while the file lives
  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
};

class GgufFile {
 public:
  // How open() holds the file's bytes.
  enum class Residency {
    // Mapped read-only in place: no copy, pages shared with other processes
    // through the page cache. If the file is truncated while this object
    // lives, touching the lost pages raises SIGBUS.
    kSharedMapping,
    // Read once into private anonymous memory: the file may then be changed,
    // truncated or deleted without affecting this object (a file that
    // shrinks while it is being read is reported as kBadFormat).
    kPrivateCopy,
  };
  // Maps (or reads) and validates the file. Throws ember::Error.
  static std::unique_ptr<GgufFile> open(const std::string& path, Residency residency = Residency::kSharedMapping);
  // Parses an in-memory image (the caller keeps it alive). Throws ember::Error.
  static std::unique_ptr<GgufFile> from_memory(const void* data, size_t size);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  size_t alignment() const { return alignment_; }
  size_t file_size() const { return size_; }
  // Byte offset of the data section (tensor offsets are relative to it).
  size_t data_offset() const { return data_offset_; }
  // Start of the file image (the mapping, or the caller's buffer).
  const uint8_t* data() const { return base_; }

  const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }
  const Value* find(std::string_view key) const;  // nullptr when absent

  // Typed getters: nullopt when the key is absent; ember::Error(kBadFormat)
  // when it is present with an incompatible type. Integers accept any integer
  // type (range-checked); floats accept floats and integers.
  std::optional<int64_t> get_int(std::string_view key) const;
  std::optional<double> get_float(std::string_view key) const;
  std::optional<bool> get_bool(std::string_view key) const;
  std::optional<std::string> get_string(std::string_view key) const;
  // Empty when absent; kBadFormat when not an array of the right element type.
  std::vector<std::string> get_string_array(std::string_view key) const;
  std::vector<int64_t> get_int_array(std::string_view key) const;
  std::vector<float> get_float_array(std::string_view key) const;

  // Frees the parsed metadata (metadata() is empty after, every getter
  // finds nothing) and releases the image's pages before the data section
  // (the raw metadata; read back under an ImagePin if ever read). A model
  // calls it once its tokenizer and config are built: a 262k-token
  // vocabulary's parsed strings are ~100 MB.
  void release_metadata();

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;  // nullptr when absent

 private:
  GgufFile() = default;
  void parse();
  void parse_named(const std::string& path);  // parse(), with the path in any error

  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  void* mapping_ = nullptr;   // non-null when we own an mmap (of the file, or the private copy)
  bool file_mapped_ = false;  // mapping_ maps the file itself (kSharedMapping)
  int fd_ = -1;               // the file, kept open to read released pages back (kPrivateCopy)
  uint32_t version_ = 0;
  size_t alignment_ = 32;
  size_t data_offset_ = 0;
  std::vector<std::pair<std::string, Value>> kv_;
  std::unordered_map<std::string, size_t> kv_index_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

// ---- Pages of a file's image that another copy replaced ----
//
// An opened file's image (its mapping, or its private copy) is registered
// while the GgufFile lives. When the CPU backend has packed a weight into the
// layout its kernels read, the weight's pages in the image are dropped
// (release_image_pages): the model then costs its file size once, not twice.
// Whatever reads an image's bytes after that holds an ImagePin over them while
// it reads; the pin first brings released pages back (a private copy reads
// them again from the file, which was kept open; a mapping faults them in)
// and keeps them from being released while it lives.
//
// Reading them back checks that they are what was released (a 64-bit hash
// of every released run): a file changed in place since it was loaded gives
// kBadFormat, a truncated one kBadFormat, never different weights or SIGBUS
// (a private copy; a mapping of a truncated file raises SIGBUS as before).

// Drops the pages wholly inside [p, p + n) of a registered image, except
// pages an ImagePin covers now and pages already released. Nothing for
// memory that is not an image (a caller's buffer, a shard's copy). Returns the
// bytes dropped. Thread-safe.
size_t release_image_pages(const void* p, size_t n);

// Bytes of [p, p + n) released now (for tests and statistics).
size_t released_image_bytes(const void* p, size_t n);

// Keeps [p, p + n) of an image resident while it lives (see above). Throws
// ember::Error when released pages cannot be read back. Inert for memory that
// is not an image. Thread-safe; movable.
class ImagePin {
 public:
  ImagePin() = default;
  ImagePin(const void* p, size_t n);
  ~ImagePin() { reset(); }
  ImagePin(ImagePin&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  ImagePin& operator=(ImagePin&& o) noexcept;
  ImagePin(const ImagePin&) = delete;
  ImagePin& operator=(const ImagePin&) = delete;
  void reset();
  bool held() const { return p_ != nullptr; }

 private:
  const void* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace ember::gguf
