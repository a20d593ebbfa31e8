// GGUF v2/v3 reader. Everything read from the file is untrusted: every read is
// bounds-checked, every count is capped by what the remaining bytes could
// possibly hold, and all offset/size arithmetic is overflow-checked before use.
#include "core/gguf/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <system_error>

#include "core/util/fault.h"
#include "core/util/huge_pages.h"
#include "core/util/status.h"

namespace ember::gguf {

static_assert(std::endian::native == std::endian::little, "the GGUF reader assumes a little-endian host");

namespace {

constexpr uint32_t kMaxArrayDepth = 8;             // nesting levels of ARRAY values
constexpr uint64_t kMaxMetadataValues = 1u << 24;  // all values incl. array elements (~1.3 GiB of Value)
constexpr uint64_t kMaxKeyLength = 65535;          // spec: keys are at most 2^16-1 bytes
constexpr uint64_t kMaxTensorName = 64;            // spec: tensor names are at most 64 bytes
constexpr uint32_t kMaxDims = 4;
constexpr size_t kDefaultAlignment = 32;

// Smallest possible encodings, used to reject counts no file could hold.
constexpr uint64_t kMinKvBytes = 8 + 1 + 4 + 1;                  // key len, 1-byte key, type, 1-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 1 + 4 + 8 + 4 + 8;  // name len, name, n_dims, 1 dim, type, offset

[[noreturn]] void bad(const std::string& msg) { fail(StatusCode::kBadFormat, "gguf: " + msg); }

std::string quote(std::string_view s) {
  std::string out = "'";
  for (char c : s.substr(0, 128)) {
    const auto u = static_cast<unsigned char>(c);
    out += (u >= 0x20 && u < 0x7F) ? c : '?';
  }
  if (s.size() > 128) out += "...";
  out += "'";
  return out;
}

bool valid_value_type(uint32_t t) { return t <= static_cast<uint32_t>(ValueType::FLOAT64); }

uint64_t min_value_bytes(ValueType t) {
  switch (t) {
    case ValueType::UINT8:
    case ValueType::INT8:
    case ValueType::BOOL: return 1;
    case ValueType::UINT16:
    case ValueType::INT16: return 2;
    case ValueType::UINT32:
    case ValueType::INT32:
    case ValueType::FLOAT32: return 4;
    case ValueType::UINT64:
    case ValueType::INT64:
    case ValueType::FLOAT64:
    case ValueType::STRING:  // u64 length
      return 8;
    case ValueType::ARRAY:  // u32 type + u64 count
      return 12;
  }
  return 1;
}

bool is_unsigned(ValueType t) {
  return t == ValueType::UINT8 || t == ValueType::UINT16 || t == ValueType::UINT32 || t == ValueType::UINT64;
}
bool is_signed(ValueType t) {
  return t == ValueType::INT8 || t == ValueType::INT16 || t == ValueType::INT32 || t == ValueType::INT64;
}
bool is_integer_type(ValueType t) { return is_unsigned(t) || is_signed(t); }
bool is_float_type(ValueType t) { return t == ValueType::FLOAT32 || t == ValueType::FLOAT64; }

// Overflow-safe helpers.
bool add_overflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_add_overflow(a, b, out); }
bool align_up(uint64_t x, uint64_t a, uint64_t* out) {  // a is a power of two
  uint64_t t;
  if (add_overflows(x, a - 1, &t)) return false;
  *out = t & ~(a - 1);
  return true;
}

class Reader {
 public:
  Reader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  size_t pos() const { return pos_; }
  size_t remaining() const { return n_ - pos_; }

  void need(uint64_t k, const char* what) const {
    if (k > remaining()) {
      bad(std::string("unexpected end of file reading ") + what + " at offset " + std::to_string(pos_) + " (need " +
          std::to_string(k) + " bytes, " + std::to_string(remaining()) + " left)");
    }
  }

  template <class T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  // `what` names the string for error messages, e.g. "key", "value of key 'x'".
  std::string read_string(const std::string& what, uint64_t max_len = std::numeric_limits<uint64_t>::max()) {
    const uint64_t len = read<uint64_t>("string length");
    if (len > remaining()) {
      bad(what + ": string length " + std::to_string(len) + " at offset " + std::to_string(pos_ - 8) + " exceeds the " +
          std::to_string(remaining()) + " bytes left in the file");
    }
    if (len > max_len) {
      bad(what + ": string length " + std::to_string(len) + " exceeds the limit of " + std::to_string(max_len));
    }
    std::string s(reinterpret_cast<const char*>(p_ + pos_), static_cast<size_t>(len));
    pos_ += static_cast<size_t>(len);
    return s;
  }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
};

struct Parsed {
  uint32_t version = 0;
  size_t alignment = kDefaultAlignment;
  size_t data_offset = 0;
  std::vector<std::pair<std::string, Value>> kv;
  std::unordered_map<std::string, size_t> kv_index;
  std::vector<TensorInfo> tensors;
  std::unordered_map<std::string, size_t> tensor_index;
};

class Parser {
 public:
  Parser(const uint8_t* base, size_t size) : base_(base), size_(size), r_(base, size) {}

  Parsed run() {
    read_header();
    read_metadata();
    read_tensor_infos();
    place_tensors();
    return std::move(out_);
  }

 private:
  void read_header() {
    if (size_ < 4) bad("file too small (" + std::to_string(size_) + " bytes) to be a GGUF file");
    uint8_t magic[4];
    std::memcpy(magic, base_, 4);
    if (std::memcmp(magic, "GGUF", 4) != 0) {
      char hex[32];
      std::snprintf(hex, sizeof(hex), "%02x %02x %02x %02x", magic[0], magic[1], magic[2], magic[3]);
      bad(std::string("bad magic (") + hex + "): not a GGUF file");
    }
    r_.read<uint32_t>("magic");
    const uint32_t version = r_.read<uint32_t>("version");
    const uint32_t swapped = __builtin_bswap32(version);
    if ((version & 0xFFFFu) == 0 && swapped >= 1 && swapped <= 3) {
      fail(StatusCode::kUnsupported, "gguf: big-endian GGUF files are not supported (version field reads " +
                                         std::to_string(swapped) + " byte-swapped)");
    }
    if (version == 0) bad("invalid GGUF version 0");
    if (version == 1) {
      fail(StatusCode::kUnsupported, "gguf: GGUF version 1 is not supported (only versions 2 and 3)");
    }
    if (version != 2 && version != 3) {
      fail(StatusCode::kUnsupported,
           "gguf: unsupported GGUF version " + std::to_string(version) + " (only versions 2 and 3)");
    }
    out_.version = version;
    n_tensors_ = r_.read<uint64_t>("tensor count");
    n_kv_ = r_.read<uint64_t>("metadata count");
    const uint64_t rem = r_.remaining();
    if (n_kv_ > rem / kMinKvBytes) {
      bad("metadata count " + std::to_string(n_kv_) + " is impossible: only " + std::to_string(rem) +
          " bytes follow the header");
    }
    if (n_tensors_ > rem / kMinTensorInfoBytes) {
      bad("tensor count " + std::to_string(n_tensors_) + " is impossible: only " + std::to_string(rem) +
          " bytes follow the header");
    }
  }

  void read_metadata() {
    out_.kv.reserve(static_cast<size_t>(n_kv_));
    for (uint64_t i = 0; i < n_kv_; ++i) {
      std::string key = r_.read_string("metadata key #" + std::to_string(i), kMaxKeyLength);
      if (key.empty()) bad("metadata key #" + std::to_string(i) + " is empty");
      if (out_.kv_index.count(key) != 0) bad("duplicate metadata key " + quote(key));
      const std::string ctx = "key " + quote(key);
      const uint32_t vt = r_.read<uint32_t>("metadata value type");
      if (!valid_value_type(vt)) bad(ctx + ": unknown value type " + std::to_string(vt));
      Value v = read_value(static_cast<ValueType>(vt), ctx, 0);
      if (key == "general.alignment") set_alignment(v, ctx);
      out_.kv_index.emplace(key, out_.kv.size());
      out_.kv.emplace_back(std::move(key), std::move(v));
    }
  }

  void count_values(uint64_t n, const std::string& ctx) {
    if (n > kMaxMetadataValues - n_values_) {
      bad(ctx + ": more than " + std::to_string(kMaxMetadataValues) + " metadata values in the file");
    }
    n_values_ += n;
  }

  Value read_value(ValueType type, const std::string& ctx, uint32_t depth) {
    Value v;
    v.type = type;
    switch (type) {
      case ValueType::UINT8: v.u64 = r_.read<uint8_t>("uint8 value"); break;
      case ValueType::INT8: v.i64 = r_.read<int8_t>("int8 value"); break;
      case ValueType::UINT16: v.u64 = r_.read<uint16_t>("uint16 value"); break;
      case ValueType::INT16: v.i64 = r_.read<int16_t>("int16 value"); break;
      case ValueType::UINT32: v.u64 = r_.read<uint32_t>("uint32 value"); break;
      case ValueType::INT32: v.i64 = r_.read<int32_t>("int32 value"); break;
      case ValueType::UINT64: v.u64 = r_.read<uint64_t>("uint64 value"); break;
      case ValueType::INT64: v.i64 = r_.read<int64_t>("int64 value"); break;
      case ValueType::FLOAT32: v.f64 = r_.read<float>("float32 value"); break;
      case ValueType::FLOAT64: v.f64 = r_.read<double>("float64 value"); break;
      case ValueType::BOOL: {
        const uint8_t b = r_.read<uint8_t>("bool value");
        if (b > 1) bad(ctx + ": invalid bool byte " + std::to_string(b) + " (must be 0 or 1)");
        v.b = b != 0;
        break;
      }
      case ValueType::STRING: v.str = r_.read_string(ctx); break;
      case ValueType::ARRAY: {
        if (depth >= kMaxArrayDepth) {
          bad(ctx + ": arrays nested deeper than " + std::to_string(kMaxArrayDepth) + " levels");
        }
        const uint32_t et = r_.read<uint32_t>("array element type");
        if (!valid_value_type(et)) bad(ctx + ": unknown array element type " + std::to_string(et));
        const auto elem = static_cast<ValueType>(et);
        const uint64_t count = r_.read<uint64_t>("array length");
        if (count > r_.remaining() / min_value_bytes(elem)) {
          bad(ctx + ": array of " + std::to_string(count) + " " + value_type_name(elem) +
              " elements cannot fit in the " + std::to_string(r_.remaining()) + " bytes left in the file");
        }
        count_values(count, ctx);
        v.array_type = elem;
        v.array.reserve(static_cast<size_t>(count));
        for (uint64_t i = 0; i < count; ++i) v.array.push_back(read_value(elem, ctx, depth + 1));
        break;
      }
    }
    return v;
  }

  void set_alignment(const Value& v, const std::string& ctx) {
    uint64_t a = 0;
    if (is_unsigned(v.type)) {
      a = v.u64;
    } else if (is_signed(v.type) && v.i64 > 0) {
      a = static_cast<uint64_t>(v.i64);
    } else if (!is_signed(v.type)) {
      bad(ctx + ": must be an integer, not " + value_type_name(v.type));
    }
    if (a == 0 || (a & (a - 1)) != 0) {
      bad(ctx + ": alignment " + (is_signed(v.type) ? std::to_string(v.i64) : std::to_string(a)) +
          " is not a nonzero power of two");
    }
    if (a > std::numeric_limits<size_t>::max() / 2) bad(ctx + ": alignment " + std::to_string(a) + " is too large");
    out_.alignment = static_cast<size_t>(a);
  }

  void read_tensor_infos() {
    out_.tensors.reserve(static_cast<size_t>(n_tensors_));
    for (uint64_t i = 0; i < n_tensors_; ++i) {
      TensorInfo t;
      t.name = r_.read_string("tensor #" + std::to_string(i) + " name", kMaxTensorName);
      if (t.name.empty()) bad("tensor #" + std::to_string(i) + " has an empty name");
      const std::string ctx = "tensor " + quote(t.name);
      if (out_.tensor_index.count(t.name) != 0) bad("duplicate tensor name " + quote(t.name));

      t.n_dims = r_.read<uint32_t>("tensor n_dims");
      if (t.n_dims < 1 || t.n_dims > kMaxDims) {
        bad(ctx + ": n_dims " + std::to_string(t.n_dims) + " is not in 1.." + std::to_string(kMaxDims));
      }
      int64_t n_elements = 1;
      for (uint32_t d = 0; d < t.n_dims; ++d) {
        const uint64_t ne = r_.read<uint64_t>("tensor dimension");
        if (ne == 0) bad(ctx + ": dimension " + std::to_string(d) + " is 0");
        if (ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          bad(ctx + ": dimension " + std::to_string(d) + " (" + std::to_string(ne) + ") is too large");
        }
        t.ne[d] = static_cast<int64_t>(ne);
        if (__builtin_mul_overflow(n_elements, t.ne[d], &n_elements)) bad(ctx + ": element count overflows");
      }
      const uint32_t type_id = r_.read<uint32_t>("tensor type");
      const TypeTraits* tt = type_traits(type_id);
      if (tt == nullptr) bad(ctx + " has unknown type id " + std::to_string(type_id));
      t.type = tt->type;
      if (t.ne[0] % tt->block_size != 0) {
        bad(ctx + ": ne[0]=" + std::to_string(t.ne[0]) + " is not a multiple of the " + tt->name + " block size " +
            std::to_string(tt->block_size));
      }
      uint64_t nbytes = 0;
      if (__builtin_mul_overflow(static_cast<uint64_t>(n_elements) / tt->block_size, uint64_t{tt->type_size},
                                 &nbytes) ||
          nbytes > std::numeric_limits<size_t>::max()) {
        bad(ctx + ": byte size overflows");
      }
      t.nbytes = static_cast<size_t>(nbytes);
      t.offset = r_.read<uint64_t>("tensor offset");
      out_.tensor_index.emplace(t.name, out_.tensors.size());
      out_.tensors.push_back(std::move(t));
    }
  }

  void place_tensors() {
    const uint64_t a = out_.alignment;
    uint64_t data_start = 0;
    if (!align_up(r_.pos(), a, &data_start)) bad("data section offset overflows");
    if (out_.tensors.empty()) {
      // Nothing is read from the data section; tolerate a file that ends
      // without the padding.
      out_.data_offset = static_cast<size_t>(std::min<uint64_t>(data_start, size_));
      return;
    }
    if (data_start > size_) {
      bad("data section starts at " + std::to_string(data_start) + ", past the end of the file (size " +
          std::to_string(size_) + ")");
    }
    out_.data_offset = static_cast<size_t>(data_start);

    struct Span {
      uint64_t begin, end;
      size_t index;
    };
    std::vector<Span> spans;
    spans.reserve(out_.tensors.size());
    for (size_t i = 0; i < out_.tensors.size(); ++i) {
      TensorInfo& t = out_.tensors[i];
      const std::string ctx = "tensor " + quote(t.name);
      if (t.offset % a != 0) {
        bad(ctx + ": data offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
            std::to_string(a));
      }
      uint64_t begin = 0, end = 0;
      if (add_overflows(data_start, t.offset, &begin) || add_overflows(begin, t.nbytes, &end)) {
        bad(ctx + " data (offset " + std::to_string(t.offset) + ", " + std::to_string(t.nbytes) +
            " bytes) lies outside the file (size " + std::to_string(size_) + ")");
      }
      if (end > size_) {
        bad(ctx + " data [" + std::to_string(begin) + ", " + std::to_string(end) + ") lies outside the file (size " +
            std::to_string(size_) + ")");
      }
      t.data = base_ + begin;
      spans.push_back({begin, end, i});
    }
    std::sort(spans.begin(), spans.end(), [](const Span& x, const Span& y) { return x.begin < y.begin; });
    for (size_t i = 1; i < spans.size(); ++i) {
      if (spans[i].begin < spans[i - 1].end) {
        const TensorInfo& p = out_.tensors[spans[i - 1].index];
        const TensorInfo& q = out_.tensors[spans[i].index];
        bad("tensors " + quote(p.name) + " [" + std::to_string(spans[i - 1].begin) + ", " +
            std::to_string(spans[i - 1].end) + ") and " + quote(q.name) + " [" + std::to_string(spans[i].begin) + ", " +
            std::to_string(spans[i].end) + ") overlap");
      }
    }
  }

  const uint8_t* base_;
  size_t size_;
  Reader r_;
  uint64_t n_tensors_ = 0;
  uint64_t n_kv_ = 0;
  uint64_t n_values_ = 0;
  Parsed out_;
};

[[noreturn]] void wrong_type(std::string_view key, const Value& v, const char* expected) {
  bad("key " + quote(key) + " has type " + value_type_name(v.type) +
      (v.type == ValueType::ARRAY ? std::string("[") + value_type_name(v.array_type) + "]" : std::string()) +
      ", expected " + expected);
}

int64_t as_int(std::string_view key, const Value& v) {
  if (is_signed(v.type)) return v.i64;
  if (v.u64 > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    bad("key " + quote(key) + ": value " + std::to_string(v.u64) + " is out of range");
  }
  return static_cast<int64_t>(v.u64);
}

double as_double(const Value& v) {
  if (is_float_type(v.type)) return v.f64;
  if (is_signed(v.type)) return static_cast<double>(v.i64);
  return static_cast<double>(v.u64);
}

}  // namespace

const char* value_type_name(ValueType t) {
  switch (t) {
    case ValueType::UINT8: return "uint8";
    case ValueType::INT8: return "int8";
    case ValueType::UINT16: return "uint16";
    case ValueType::INT16: return "int16";
    case ValueType::UINT32: return "uint32";
    case ValueType::INT32: return "int32";
    case ValueType::FLOAT32: return "float32";
    case ValueType::BOOL: return "bool";
    case ValueType::STRING: return "string";
    case ValueType::ARRAY: return "array";
    case ValueType::UINT64: return "uint64";
    case ValueType::INT64: return "int64";
    case ValueType::FLOAT64: return "float64";
  }
  return "unknown";
}

bool Value::is_integer() const { return is_integer_type(type); }
bool Value::is_float() const { return is_float_type(type); }

namespace {
// The whole file in private anonymous memory, read with pread: unlike a copy
// from a mapping, a file truncated meanwhile gives a short read (an error),
// never SIGBUS. Page-aligned, so tensor data keeps the file's alignment.
void* read_private_copy(int fd, size_t size, const std::string& path) {
  // (Huge pages: weights read in place are streamed whole for every token.)
  void* p = testing::inject_alloc_failure(testing::AllocSite::kModelFile) ? nullptr : map_huge(size);
  if (!p) {
    fail(StatusCode::kOutOfMemory, "gguf: cannot allocate " + std::to_string(size) + " bytes for '" + path + "'");
  }
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  auto* dst = static_cast<uint8_t*>(p);
  size_t done = 0;
  while (done < size) {
    const size_t want = std::min<size_t>(size - done, size_t{1} << 30);
    const ssize_t n = ::pread(fd, dst + done, want, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      map_huge_free(p, size);
      if (n == 0) fail(StatusCode::kBadFormat, "gguf: '" + path + "' shrank while it was being read");
      fail(StatusCode::kNotFound, "gguf: cannot read '" + path + "': " + std::system_category().message(err));
    }
    done += static_cast<size_t>(n);
  }
  ::mprotect(p, size, PROT_READ);  // immutable from here on, as the mapping was
  return p;
}
}  // namespace

namespace {

// ---- The registry of open images and their released pages (gguf.h) ----

struct ReleasedRun {
  size_t end = 0;     // [key, end): offsets in the image, whole pages
  uint64_t hash = 0;  // of the bytes released (private copies)
};

struct Image {
  const GgufFile* file = nullptr;
  uint8_t* base = nullptr;
  size_t size = 0;
  int fd = -1;  // the file, for a private copy: released pages are read back from it
  std::map<size_t, ReleasedRun> released;
  std::vector<std::pair<size_t, size_t>> pins;  // [begin, end) offsets, page-rounded outwards
};

// Never destroyed: a model may be freed after main returns (an engine's
// worker thread ending last), when static objects are gone.
std::mutex& registry_mutex() {
  static std::mutex* m = new std::mutex();
  return *m;
}
std::vector<Image>& registry() {
  static std::vector<Image>* images = new std::vector<Image>();
  return *images;
}

size_t page_size() {
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

// EMBER_DEBUG_RELEASED_PAGES=1: released pages are also made inaccessible,
// so a reader that holds no ImagePin faults at once instead of reading zeros
// (the test suite runs with it).
bool protect_released() {
  static const bool on = [] {
    const char* v = std::getenv("EMBER_DEBUG_RELEASED_PAGES");
    return v && *v && std::strcmp(v, "0") != 0;
  }();
  return on;
}

// Four independent multiply-xorshift lanes over 8-byte words: memory speed.
uint64_t run_hash(const uint8_t* p, size_t n) {
  uint64_t h[4] = {0x9E3779B97F4A7C15ull, 0xC2B2AE3D27D4EB4Full, 0x165667B19E3779F9ull, 0x27D4EB2F165667C5ull};
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int l = 0; l < 4; ++l) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * l, 8);
      h[l] = (h[l] ^ w) * 0xff51afd7ed558ccdull;
      h[l] ^= h[l] >> 29;
    }
  }
  for (; i < n; ++i) h[0] = (h[0] ^ p[i]) * 0x100000001b3ull;
  return h[0] ^ (h[1] * 3) ^ (h[2] * 5) ^ (h[3] * 7) ^ n;
}

// The image holding [p, p + n), or null. Under the registry mutex.
Image* find_image(const void* p, size_t n) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  for (Image& im : registry()) {
    const auto b = reinterpret_cast<uintptr_t>(im.base);
    if (a >= b && a - b <= im.size && n <= im.size - (a - b)) return &im;
  }
  return nullptr;
}

void release_run(Image& im, size_t b, size_t e) {
  ReleasedRun run{e, im.fd >= 0 ? run_hash(im.base + b, e - b) : 0};
  if (protect_released()) ::mprotect(im.base + b, e - b, PROT_NONE);
  // No huge pages there first: a private copy is mapped with MADV_HUGEPAGE,
  // and khugepaged (max_ptes_none 511, the kernel's default) would otherwise
  // fold a released run back into zero-filled 2 MiB pages within a minute,
  // so the memory came back while nothing read it (measured: SmolLM2's
  // image 94 MB resident again after one reply).
  ::madvise(im.base + b, e - b, MADV_NOHUGEPAGE);
  ::madvise(im.base + b, e - b, MADV_DONTNEED);
  im.released.emplace(b, run);
}

// Brings the released run at `it` back. Under the registry mutex.
void restore_run(Image& im, std::map<size_t, ReleasedRun>::iterator it) {
  const size_t b = it->first, e = it->second.end;
  uint8_t* dst = im.base + b;
  if (im.fd < 0) {  // a mapping of the file: the pages fault in again
    if (protect_released()) ::mprotect(dst, e - b, PROT_READ);
    im.released.erase(it);
    return;
  }
  ::mprotect(dst, e - b, PROT_READ | PROT_WRITE);
  size_t done = 0;
  const char* problem = nullptr;
  while (done < e - b) {
    const ssize_t n = ::pread(im.fd, dst + done, e - b - done, static_cast<off_t>(b + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      problem = n == 0 ? "is shorter than when it was loaded" : "cannot be read";
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (!problem && run_hash(dst, e - b) != it->second.hash) problem = "was changed since it was loaded";
  if (problem) {  // released again, as it was
    ::madvise(dst, e - b, MADV_DONTNEED);
    ::mprotect(dst, e - b, protect_released() ? PROT_NONE : PROT_READ);
    fail(StatusCode::kBadFormat,
         std::string("gguf: the model file ") + problem + ": weights whose pages were released cannot be read back");
  }
  ::mprotect(dst, e - b, PROT_READ);
  im.released.erase(it);
}

void register_image(const GgufFile* f, const void* base, size_t size, int fd) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry().push_back(Image{f, static_cast<uint8_t*>(const_cast<void*>(base)), size, fd, {}, {}});
}

void unregister_image(const GgufFile* f) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto& r = registry();
  r.erase(std::remove_if(r.begin(), r.end(), [f](const Image& im) { return im.file == f; }), r.end());
}

}  // namespace

size_t release_image_pages(const void* p, size_t n) {
  if (!p || n == 0) return 0;
  std::lock_guard<std::mutex> lock(registry_mutex());
  Image* im = find_image(p, n);
  if (!im) return 0;
  const size_t page = page_size();
  const size_t off = static_cast<size_t>(static_cast<const uint8_t*>(p) - im->base);
  const size_t b = (off + page - 1) / page * page, e = (off + n) / page * page;
  if (e <= b) return 0;
  // What must stay: pins and runs released already, inside [b, e).
  std::vector<std::pair<size_t, size_t>> keep;
  for (const auto& pin : im->pins)
    if (pin.first < e && pin.second > b) keep.push_back(pin);
  for (auto it = im->released.upper_bound(b); it != im->released.begin();) {  // a run starting before b
    --it;
    if (it->second.end > b) keep.emplace_back(it->first, it->second.end);
    break;
  }
  for (auto it = im->released.lower_bound(b); it != im->released.end() && it->first < e; ++it)
    keep.emplace_back(it->first, it->second.end);
  std::sort(keep.begin(), keep.end());
  size_t dropped = 0, cur = b;
  for (const auto& k : keep) {
    if (k.first > cur) {
      const size_t stop = std::min(k.first, e);
      release_run(*im, cur, stop);
      dropped += stop - cur;
    }
    cur = std::max(cur, k.second);
    if (cur >= e) break;
  }
  if (cur < e) {
    release_run(*im, cur, e);
    dropped += e - cur;
  }
  return dropped;
}

size_t released_image_bytes(const void* p, size_t n) {
  if (!p || n == 0) return 0;
  std::lock_guard<std::mutex> lock(registry_mutex());
  Image* im = find_image(p, n);
  if (!im) return 0;
  const size_t b = static_cast<size_t>(static_cast<const uint8_t*>(p) - im->base), e = b + n;
  size_t total = 0;
  for (const auto& [rb, run] : im->released) {
    const size_t lo = std::max(rb, b), hi = std::min(run.end, e);
    if (lo < hi) total += hi - lo;
  }
  return total;
}

ImagePin::ImagePin(const void* p, size_t n) {
  if (!p || n == 0) return;
  std::lock_guard<std::mutex> lock(registry_mutex());
  Image* im = find_image(p, n);
  if (!im) return;
  const size_t page = page_size();
  const size_t off = static_cast<size_t>(static_cast<const uint8_t*>(p) - im->base);
  const size_t b = off / page * page, e = std::min(im->size, (off + n + page - 1) / page * page);
  auto it = im->released.upper_bound(b);
  if (it != im->released.begin() && std::prev(it)->second.end > b) --it;
  while (it != im->released.end() && it->first < e) {
    auto next = std::next(it);
    restore_run(*im, it);
    it = next;
  }
  im->pins.emplace_back(b, e);
  p_ = p;
  n_ = n;
}

ImagePin& ImagePin::operator=(ImagePin&& o) noexcept {
  if (this != &o) {
    reset();
    p_ = o.p_;
    n_ = o.n_;
    o.p_ = nullptr;
    o.n_ = 0;
  }
  return *this;
}

void ImagePin::reset() {
  if (!p_) return;
  std::lock_guard<std::mutex> lock(registry_mutex());
  if (Image* im = find_image(p_, n_)) {
    const size_t page = page_size();
    const size_t off = static_cast<size_t>(static_cast<const uint8_t*>(p_) - im->base);
    const std::pair<size_t, size_t> key(off / page * page, std::min(im->size, (off + n_ + page - 1) / page * page));
    auto it = std::find(im->pins.begin(), im->pins.end(), key);
    if (it != im->pins.end()) im->pins.erase(it);
  }
  p_ = nullptr;
  n_ = 0;
}

std::unique_ptr<GgufFile> GgufFile::open(const std::string& path, Residency residency) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    fail(StatusCode::kNotFound, "gguf: cannot open '" + path + "': " + std::system_category().message(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail(StatusCode::kNotFound, "gguf: cannot stat '" + path + "': " + std::system_category().message(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(StatusCode::kNotFound, "gguf: '" + path + "' is not a regular file");
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    fail(StatusCode::kBadFormat, "gguf: '" + path + "' is empty");
  }
  if (size > std::numeric_limits<size_t>::max()) {
    ::close(fd);
    fail(StatusCode::kUnsupported, "gguf: '" + path + "' is too large to map");
  }
  if (residency == Residency::kPrivateCopy) {
    void* copy = nullptr;
    try {
      copy = read_private_copy(fd, static_cast<size_t>(size), path);
    } catch (...) {
      ::close(fd);
      throw;
    }
    std::unique_ptr<GgufFile> f(new GgufFile());
    f->mapping_ = copy;
    f->fd_ = fd;  // kept to read released pages back
    f->base_ = static_cast<const uint8_t*>(copy);
    f->size_ = static_cast<size_t>(size);
    f->parse_named(path);
    register_image(f.get(), copy, f->size_, fd);
    return f;
  }
  void* p = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) {
    fail(err == ENOMEM ? StatusCode::kOutOfMemory : StatusCode::kNotFound,
         "gguf: cannot map '" + path + "': " + std::system_category().message(err));
  }
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->mapping_ = p;
  f->file_mapped_ = true;
  f->base_ = static_cast<const uint8_t*>(p);
  f->size_ = static_cast<size_t>(size);
  f->parse_named(path);
  register_image(f.get(), p, f->size_, -1);
  return f;
}

void GgufFile::parse_named(const std::string& path) {
  try {
    parse();
  } catch (const Error& e) {
    // Name the file: "gguf: <path>: <problem>".
    std::string msg = e.message();
    const std::string prefix = "gguf: ";
    if (msg.compare(0, prefix.size(), prefix) == 0) msg.erase(0, prefix.size());
    throw Error(e.code(), prefix + path + ": " + msg);
  }
}

std::unique_ptr<GgufFile> GgufFile::from_memory(const void* data, size_t size) {
  if (data == nullptr && size != 0) fail(StatusCode::kInvalidArgument, "gguf: from_memory: null data");
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->base_ = static_cast<const uint8_t*>(data);
  f->size_ = size;
  f->parse();
  return f;
}

void GgufFile::release_metadata() {
  std::vector<std::pair<std::string, Value>>().swap(kv_);
  std::unordered_map<std::string, size_t>().swap(kv_index_);
  if (mapping_ != nullptr) release_image_pages(base_, data_offset_);
}

GgufFile::~GgufFile() {
  if (mapping_ != nullptr) {
    unregister_image(this);
    ::munmap(mapping_, size_);
  }
  if (fd_ >= 0) ::close(fd_);
}

void GgufFile::parse() {
  static const uint8_t kEmpty[1] = {0};
  Parser parser(base_ != nullptr ? base_ : kEmpty, base_ != nullptr ? size_ : 0);
  Parsed p = parser.run();
  version_ = p.version;
  alignment_ = p.alignment;
  data_offset_ = p.data_offset;
  kv_ = std::move(p.kv);
  kv_index_ = std::move(p.kv_index);
  tensors_ = std::move(p.tensors);
  tensor_index_ = std::move(p.tensor_index);
}

const Value* GgufFile::find(std::string_view key) const {
  const auto it = kv_index_.find(std::string(key));
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const TensorInfo* GgufFile::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::optional<int64_t> GgufFile::get_int(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_integer()) wrong_type(key, *v, "an integer");
  return as_int(key, *v);
}

std::optional<double> GgufFile::get_float(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_float() && !v->is_integer()) wrong_type(key, *v, "a number");
  return as_double(*v);
}

std::optional<bool> GgufFile::get_bool(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (v->type != ValueType::BOOL) wrong_type(key, *v, "bool");
  return v->b;
}

std::optional<std::string> GgufFile::get_string(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (v->type != ValueType::STRING) wrong_type(key, *v, "string");
  return v->str;
}

std::vector<std::string> GgufFile::get_string_array(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return {};
  if (v->type != ValueType::ARRAY || v->array_type != ValueType::STRING) wrong_type(key, *v, "array of string");
  std::vector<std::string> out;
  out.reserve(v->array.size());
  for (const Value& e : v->array) out.push_back(e.str);
  return out;
}

std::vector<int64_t> GgufFile::get_int_array(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return {};
  if (v->type != ValueType::ARRAY || !is_integer_type(v->array_type)) wrong_type(key, *v, "array of integer");
  std::vector<int64_t> out;
  out.reserve(v->array.size());
  for (const Value& e : v->array) out.push_back(as_int(key, e));
  return out;
}

std::vector<float> GgufFile::get_float_array(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return {};
  if (v->type != ValueType::ARRAY || !(is_float_type(v->array_type) || is_integer_type(v->array_type))) {
    wrong_type(key, *v, "array of number");
  }
  std::vector<float> out;
  out.reserve(v->array.size());
  for (const Value& e : v->array) out.push_back(static_cast<float>(as_double(e)));
  return out;
}

}  // namespace ember::gguf
