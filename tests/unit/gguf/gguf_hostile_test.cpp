// Hostile inputs: every malformed file must be rejected with ember::Error
// (never a crash, hang, huge allocation or out-of-bounds read; run these
// under ASan+UBSan with -DEMBER_SANITIZE=ON).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/gguf/gguf.h"
#include "core/gguf/gguf_writer.h"
#include "core/util/status.h"
#include "gguf_test_util.h"

namespace ember::gguf {
namespace {

using testing::Raw;

constexpr uint32_t kF32 = 0, kQ4_0 = 2;

// Parses a copy of the bytes in an exactly-sized heap block, so any read past
// the end is caught by ASan.
std::unique_ptr<GgufFile> parse_exact(const uint8_t* p, size_t n) {
  std::unique_ptr<uint8_t[]> copy(new uint8_t[n == 0 ? 1 : n]);
  if (n) std::memcpy(copy.get(), p, n);
  auto f = GgufFile::from_memory(n ? copy.get() : nullptr, n);
  // Touch every tensor's first and last byte while the buffer is alive.
  volatile uint8_t sink = 0;
  for (const TensorInfo& t : f->tensors()) {
    const auto* d = static_cast<const uint8_t*>(t.data);
    sink = sink + d[0] + d[t.nbytes - 1];
  }
  (void)sink;
  return nullptr;  // the tensor pointers would dangle
}

// Expects a parse failure with the given code whose message contains `needle`.
void expect_error(const std::vector<uint8_t>& img, StatusCode code, const std::string& needle) {
  try {
    parse_exact(img.data(), img.size());
    ADD_FAILURE() << "parsed successfully; expected an error mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(static_cast<int>(e.code()), static_cast<int>(code)) << e.message();
    EXPECT_NE(e.message().find(needle), std::string::npos) << "message: " << e.message();
    EXPECT_EQ(e.message().rfind("gguf: ", 0), 0u) << e.message();
  }
}
void expect_bad(const std::vector<uint8_t>& img, const std::string& needle) {
  expect_error(img, StatusCode::kBadFormat, needle);
}

void expect_ok(const std::vector<uint8_t>& img) { EXPECT_NO_THROW(parse_exact(img.data(), img.size())); }

// One F32 tensor [n] at `offset`, followed by `data_bytes` of data.
std::vector<uint8_t> one_tensor(uint64_t n, uint32_t type, uint64_t offset, size_t data_bytes) {
  Raw r;
  r.header(1, 0).tensor("w", {n}, type, offset).pad(32).zeros(data_bytes);
  return r.b;
}

TEST(GgufHostile, SanityOfTheRawBuilder) {
  expect_ok(one_tensor(8, kF32, 0, 32));
  expect_ok(one_tensor(32, kQ4_0, 0, 18));
  Raw r;
  r.header(0, 1).kv_str("general.architecture", "llama");
  expect_ok(r.b);
}

TEST(GgufHostile, BadMagic) {
  auto img = testing::small_valid_file();
  img[3] = 'X';
  expect_bad(img, "magic");
  expect_bad({}, "too small");
  expect_bad({'G', 'G', 'U'}, "too small");
  expect_bad({'G', 'G', 'M', 'L', 3, 0, 0, 0}, "magic");
}

TEST(GgufHostile, BadVersion) {
  Raw v1, v0, v4, be;
  v1.header(0, 0, 1);
  expect_error(v1.b, StatusCode::kUnsupported, "version 1");
  v0.header(0, 0, 0);
  expect_bad(v0.b, "version 0");
  v4.header(0, 0, 4);
  expect_error(v4.b, StatusCode::kUnsupported, "version 4");
  be.header(0, 0, 0x03000000u);  // a big-endian v3 file read little-endian
  expect_error(be.b, StatusCode::kUnsupported, "big-endian");
  Raw be2;
  be2.header(0, 0, 0x02000000u);
  expect_error(be2.b, StatusCode::kUnsupported, "big-endian");
}

TEST(GgufHostile, HugeCounts) {
  Raw a, b, c, d;
  a.header(0, ~0ull);
  expect_bad(a.b, "metadata count");
  b.header(~0ull, 0);
  expect_bad(b.b, "tensor count");
  c.header(1ull << 62, 1ull << 62);
  expect_bad(c.b, "count");
  d.header(0, 2).kv_u32("a", 1);  // claims 2 kvs, holds 1 (and not enough bytes for another)
  expect_bad(d.b, "count");
}

TEST(GgufHostile, HugeStringLengths) {
  Raw key;
  key.header(0, 1).u64(1ull << 63).bytes("abc").u32(4).u32(0);
  expect_bad(key.b, "string length");
  Raw val;
  val.header(0, 1).key("k", ValueType::STRING).u64(~0ull).bytes("xyz");
  expect_bad(val.b, "'k': string length");
  Raw off_by_one;  // length one more than what is left
  off_by_one.header(0, 1).key("k", ValueType::STRING).u64(4).bytes("abc");
  expect_bad(off_by_one.b, "string length");
  Raw tname;
  tname.header(1, 0).u64(~0ull >> 1).bytes("w");
  tname.zeros(64);
  expect_bad(tname.b, "string length");
  Raw longkey;
  longkey.header(0, 1).str(std::string(70000, 'k')).u32(4).u32(0);
  expect_bad(longkey.b, "limit");
}

TEST(GgufHostile, HugeArrayCounts) {
  for (uint32_t et : {0u, 4u, 8u, 9u, 12u}) {
    SCOPED_TRACE(et);
    Raw r;
    r.header(0, 1).key("arr", ValueType::ARRAY).u32(et).u64(1ull << 60).zeros(64);
    expect_bad(r.b, "'arr': array of");
  }
  Raw max;
  max.header(0, 1).key("arr", ValueType::ARRAY).u32(0).u64(~0ull).zeros(16);
  expect_bad(max.b, "cannot fit");
  // Nested: the inner count is capped by the bytes left at that point.
  Raw nested;
  nested.header(0, 1).key("arr", ValueType::ARRAY).u32(9).u64(1).u32(0).u64(1000).zeros(999);
  expect_bad(nested.b, "cannot fit");
}

TEST(GgufHostile, BadValueTypes) {
  Raw r;
  r.header(0, 1).key("k", static_cast<ValueType>(13)).u32(0);
  expect_bad(r.b, "unknown value type 13");
  Raw a;
  a.header(0, 1).key("k", ValueType::ARRAY).u32(99).u64(0);
  expect_bad(a.b, "unknown array element type 99");
  Raw b;
  b.header(0, 1).key("flag", ValueType::BOOL).u8(2);
  expect_bad(b.b, "bool");
  Raw ba;
  ba.header(0, 1).key("flags", ValueType::ARRAY).u32(7).u64(3).u8(1).u8(0).u8(7);
  expect_bad(ba.b, "bool");
}

TEST(GgufHostile, EmptyKeyAndNames) {
  Raw k;
  k.header(0, 1).str("").u32(4).u32(0);
  expect_bad(k.b, "empty");
  Raw t;
  t.header(1, 0).tensor("", {8}, kF32, 0).pad(32).zeros(32);
  expect_bad(t.b, "empty name");
  Raw longname;
  longname.header(1, 0).tensor(std::string(65, 'n'), {8}, kF32, 0).pad(32).zeros(32);
  expect_bad(longname.b, "limit");
  Raw name64;
  name64.header(1, 0).tensor(std::string(64, 'n'), {8}, kF32, 0).pad(32).zeros(32);
  expect_ok(name64.b);
}

TEST(GgufHostile, DuplicateKeys) {
  Raw r;
  r.header(0, 2).kv_u32("llama.block_count", 1).kv_u32("llama.block_count", 2);
  expect_bad(r.b, "duplicate metadata key 'llama.block_count'");
}

TEST(GgufHostile, DuplicateTensorNames) {
  Raw r;
  r.header(2, 0).tensor("w", {8}, kF32, 0).tensor("w", {8}, kF32, 32).pad(32).zeros(64);
  expect_bad(r.b, "duplicate tensor name 'w'");
}

TEST(GgufHostile, BadTensorTypeId) {
  expect_bad(one_tensor(8, 99, 0, 32), "tensor 'w' has unknown type id 99");
  expect_bad(one_tensor(32, 4, 0, 32), "unknown type id 4");  // removed Q4_2
  expect_bad(one_tensor(32, 0xFFFFFFFFu, 0, 32), "unknown type id 4294967295");
}

TEST(GgufHostile, BadDims) {
  Raw nd0, nd5, zero, huge, overflow, ne0;
  nd0.header(1, 0).str("w").u32(0).u32(kF32).u64(0).pad(32).zeros(32);
  expect_bad(nd0.b, "n_dims 0");
  nd5.header(1, 0).tensor("w", {1, 1, 1, 1, 8}, kF32, 0).pad(32).zeros(32);
  expect_bad(nd5.b, "n_dims 5");
  Raw ndhuge;
  ndhuge.header(1, 0).str("w").u32(0xFFFFFFFFu).zeros(64);
  expect_bad(ndhuge.b, "n_dims");
  zero.header(1, 0).tensor("w", {8, 0}, kF32, 0).pad(32).zeros(32);
  expect_bad(zero.b, "dimension 1 is 0");
  huge.header(1, 0).tensor("w", {1ull << 63}, kF32, 0).pad(32).zeros(32);
  expect_bad(huge.b, "too large");
  overflow.header(1, 0).tensor("w", {1ull << 40, 1ull << 40}, kF32, 0).pad(32).zeros(32);
  expect_bad(overflow.b, "overflows");
  Raw bytes_overflow;  // element count fits in int64, byte size does not
  bytes_overflow.header(1, 0).tensor("w", {1ull << 31, 1ull << 31}, 27 /*I64*/, 0).pad(32).zeros(32);
  expect_bad(bytes_overflow.b, "overflows");
  expect_bad(one_tensor(16, kQ4_0, 0, 32), "not a multiple of the q4_0 block size 32");
}

TEST(GgufHostile, MisalignedOffset) {
  Raw r;
  r.header(2, 0).tensor("a", {8}, kF32, 0).tensor("b", {8}, kF32, 36).pad(32).zeros(96);
  expect_bad(r.b, "tensor 'b': data offset 36 is not a multiple of the alignment 32");
}

TEST(GgufHostile, DataPastEnd) {
  // Exactly fits.
  expect_ok(one_tensor(8, kF32, 0, 32));
  // One byte short.
  auto short_img = one_tensor(8, kF32, 0, 31);
  expect_bad(short_img, "tensor 'w' data [");
  expect_bad(short_img, "lies outside the file (size " + std::to_string(short_img.size()) + ")");
  // Offset far beyond the end, and offsets that overflow.
  expect_bad(one_tensor(8, kF32, 1ull << 40, 32), "lies outside the file");
  expect_bad(one_tensor(8, kF32, ~0ull & ~31ull, 32), "lies outside the file");
  // Data section itself starts past the end (file ends inside the padding).
  Raw r;
  r.header(1, 0).tensor("w", {8}, kF32, 0);
  expect_bad(r.b, "past the end");
}

TEST(GgufHostile, OverlappingTensors) {
  Raw r;
  r.header(2, 0).tensor("a", {16}, kF32, 0).tensor("b", {8}, kF32, 32).pad(32).zeros(64);
  expect_bad(r.b, "overlap");
  Raw same;
  same.header(2, 0).tensor("a", {8}, kF32, 0).tensor("b", {8}, kF32, 0).pad(32).zeros(32);
  expect_bad(same.b, "overlap");
  Raw reversed;  // file order differs from data order
  reversed.header(3, 0)
      .tensor("c", {8}, kF32, 64)
      .tensor("a", {8}, kF32, 0)
      .tensor("b", {9}, kF32, 32)
      .pad(32)
      .zeros(96);
  expect_bad(reversed.b, "'b' [");
  Raw adjacent;  // touching is fine
  adjacent.header(2, 0).tensor("b", {8}, kF32, 32).tensor("a", {8}, kF32, 0).pad(32).zeros(64);
  expect_ok(adjacent.b);
}

TEST(GgufHostile, BadAlignmentValue) {
  for (uint32_t a : {0u, 3u, 48u, 0x80000001u}) {
    SCOPED_TRACE(a);
    Raw r;
    r.header(0, 1).kv_u32("general.alignment", a);
    expect_bad(r.b, "general.alignment");
  }
  Raw s;
  s.header(0, 1).kv_str("general.alignment", "32");
  expect_bad(s.b, "must be an integer");
  Raw neg;
  neg.header(0, 1).key("general.alignment", ValueType::INT32).i32(-32);
  expect_bad(neg.b, "-32");
  Raw big;
  big.header(0, 1).key("general.alignment", ValueType::UINT64).u64(1ull << 63);
  expect_bad(big.b, "general.alignment");
  // A valid non-default alignment changes where the data section starts.
  Raw ok;
  ok.header(1, 1).kv_u32("general.alignment", 64).tensor("w", {8}, kF32, 0).pad(64).zeros(32);
  expect_ok(ok.b);
  Raw ok_misaligned;  // padded to 32 but not 64: the data section starts later, so the data runs past the end
  ok_misaligned.header(1, 1).kv_u32("general.alignment", 64).tensor("w", {8}, kF32, 0);
  while (ok_misaligned.b.size() % 64 != 32) ok_misaligned.u8(0);
  ok_misaligned.zeros(32);
  expect_bad(ok_misaligned.b, "outside the file");
}

TEST(GgufHostile, DeepNesting) {
  auto nested = [](int levels) {
    Raw r;
    r.header(0, 1).key("deep", ValueType::ARRAY);
    for (int i = 1; i < levels; ++i) r.u32(static_cast<uint32_t>(ValueType::ARRAY)).u64(1);
    r.u32(static_cast<uint32_t>(ValueType::UINT8)).u64(1).u8(7);
    return r.b;
  };
  expect_ok(nested(8));
  expect_bad(nested(9), "nested deeper than 8");
  expect_bad(nested(10000), "nested deeper than 8");  // would blow the stack without a cap
}

// Truncating a valid file at every byte position must throw, never crash.
TEST(GgufHostile, TruncatedAtEveryByte) {
  for (uint32_t version : {2u, 3u}) {
    const auto img = testing::small_valid_file(version);
    ASSERT_NO_THROW(parse_exact(img.data(), img.size()));
    for (size_t n = 0; n < img.size(); ++n) {
      try {
        parse_exact(img.data(), n);
        ADD_FAILURE() << "prefix of " << n << " of " << img.size() << " bytes parsed";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), StatusCode::kBadFormat) << n << ": " << e.message();
      }
    }
  }
}

// Random byte flips: any outcome but success or ember::Error is a bug.
TEST(GgufHostile, ByteFlipFuzz) {
  const auto base = testing::small_valid_file();
  // Offset where tensor data begins; flips there are harmless, so aim most at the header.
  size_t data_offset = 0;
  {
    auto f = GgufFile::from_memory(base.data(), base.size());
    data_offset = f->data_offset();
  }
  std::mt19937_64 rng(0xE3BE5EEDull);
  int ok = 0, errors = 0;
  const uint8_t interesting[] = {0x00, 0x01, 0x02, 0x04, 0x08, 0x09, 0x0C, 0x0D,
                                 0x1F, 0x20, 0x3F, 0x40, 0x7F, 0x80, 0xFE, 0xFF};
  for (int iter = 0; iter < 5000; ++iter) {
    auto img = base;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) {
      const size_t limit = (rng() % 8 == 0) ? img.size() : data_offset;
      const size_t pos = rng() % limit;
      switch (rng() % 3) {
        case 0: img[pos] ^= static_cast<uint8_t>(1u << (rng() % 8)); break;
        case 1: img[pos] = interesting[rng() % sizeof(interesting)]; break;
        default: img[pos] = static_cast<uint8_t>(rng()); break;
      }
    }
    if (rng() % 10 == 0) img.resize(rng() % img.size());  // sometimes truncate too
    try {
      parse_exact(img.data(), img.size());
      ++ok;
    } catch (const Error&) {
      ++errors;
    } catch (const std::exception& e) {
      FAIL() << "iteration " << iter << ": non-ember exception: " << e.what();
    } catch (...) {
      FAIL() << "iteration " << iter << ": unknown exception";
    }
  }
  std::printf("byte-flip fuzz: %d parsed, %d rejected\n", ok, errors);
  EXPECT_EQ(ok + errors, 5000);
  EXPECT_GT(errors, 1000);  // the flips do hit the structure
  EXPECT_GT(ok, 10);        // and some land in harmless places (string bytes, data)
}

}  // namespace
}  // namespace ember::gguf
