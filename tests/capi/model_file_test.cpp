// Bad model files: a missing file is NOT_FOUND; garbage, empty, truncated or
// corrupted copies of the real model are rejected with a status (BAD_FORMAT
// for anything malformed) and never crash the host.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "capi/capi_test_util.h"

using namespace capi_test;

namespace {

// A fresh directory under $TMPDIR (or /tmp), removed with its files at the end.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string templ = std::string(base && *base ? base : "/tmp") + "/ember_capi_XXXXXX";
    std::vector<char> buf(templ.begin(), templ.end());
    buf.push_back('\0');
    if (mkdtemp(buf.data())) path_ = buf.data();
  }
  ~TempDir() {
    for (const auto& f : files_) std::remove(f.c_str());
    if (!path_.empty()) rmdir(path_.c_str());
  }
  bool ok() const { return !path_.empty(); }
  const std::string& path() const { return path_; }
  std::string write(const std::string& name, const char* data, size_t size) {
    const std::string p = path_ + "/" + name;
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(data, static_cast<std::streamsize>(size));
    files_.push_back(p);
    return p;
  }

 private:
  std::string path_;
  std::vector<std::string> files_;
};

std::vector<char> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Loads `path`; a model that does load is destroyed again.
ember_status try_load(const std::string& path) {
  ember_model* m = nullptr;
  const ember_status st = ember_model_load(path.c_str(), nullptr, &m);
  if (st == EMBER_OK) {
    EXPECT_NE(m, nullptr);
  } else {
    EXPECT_EQ(m, nullptr);
    EXPECT_STRNE(ember_last_error(), "");
  }
  ember_model_destroy(m);
  return st;
}

}  // namespace

TEST(CapiModelFile, MissingFileIsNotFound) {
  EXPECT_EQ(try_load("/nonexistent/dir/model.gguf"), EMBER_ERR_NOT_FOUND);
  EXPECT_EQ(try_load(""), EMBER_ERR_NOT_FOUND);
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  EXPECT_EQ(try_load(dir.path()), EMBER_ERR_NOT_FOUND) << "a directory is not a model file";
  EXPECT_EQ(try_load(dir.path() + "/absent.gguf"), EMBER_ERR_NOT_FOUND);
}

TEST(CapiModelFile, GarbageAndEmptyFilesAreBadFormat) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  EXPECT_EQ(try_load(dir.write("empty.gguf", "", 0)), EMBER_ERR_BAD_FORMAT);
  std::mt19937 rng(42);
  std::vector<char> junk(1 << 16);
  for (auto& c : junk) c = static_cast<char>(rng());
  EXPECT_EQ(try_load(dir.write("junk.gguf", junk.data(), junk.size())), EMBER_ERR_BAD_FORMAT);
  // The right magic followed by junk.
  std::memcpy(junk.data(), "GGUF\x03\x00\x00\x00", 8);
  EXPECT_EQ(try_load(dir.write("magic_junk.gguf", junk.data(), junk.size())), EMBER_ERR_BAD_FORMAT);
  const char text[] = "this is not a model\n";
  EXPECT_EQ(try_load(dir.write("text.gguf", text, sizeof text - 1)), EMBER_ERR_BAD_FORMAT);
}

TEST(CapiModelFile, TruncatedCopiesAreBadFormat) {
  EMBER_REQUIRE_MODEL();
  const std::vector<char> full = read_all(ember::test::default_model_path());
  ASSERT_GT(full.size(), 1u << 20);
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const size_t lengths[] = {
      3, 4, 8, 16, 24, 40, 100, 1000, 4096, 65536, 1u << 20, full.size() / 2, full.size() - 4096, full.size() - 1};
  for (size_t len : lengths) {
    SCOPED_TRACE("truncated to " + std::to_string(len) + " bytes");
    EXPECT_EQ(try_load(dir.write("truncated.gguf", full.data(), len)), EMBER_ERR_BAD_FORMAT);
  }
}

// Corrupts bytes of the header (counts, lengths, types) in a full-size copy.
// Some corruptions are harmless (a changed letter in a string); every other
// one must come back as a status, never as a crash or an INTERNAL error.
TEST(CapiModelFile, CorruptedHeadersNeverCrash) {
  EMBER_REQUIRE_MODEL();
  std::vector<char> data = read_all(ember::test::default_model_path());
  ASSERT_GT(data.size(), 1u << 20);
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.write("corrupt.gguf", data.data(), data.size());

  auto patch_and_load = [&](size_t offset, const std::vector<unsigned char>& bytes) {
    std::vector<char> saved(data.begin() + offset, data.begin() + offset + bytes.size());
    {
      std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
      f.seekp(static_cast<std::streamoff>(offset));
      f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    }
    const ember_status st = try_load(path);
    {
      std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
      f.seekp(static_cast<std::streamoff>(offset));
      f.write(saved.data(), static_cast<std::streamsize>(saved.size()));
    }
    return st;
  };
  const std::vector<unsigned char> ff8(8, 0xFF), big_count = {0, 0, 0, 0, 0, 0, 0, 0x10};

  // Well-known header fields (GGUF v3: magic, u32 version, u64 n_tensors, u64 n_kv).
  EXPECT_EQ(patch_and_load(0, {'G', 'G', 'U', 'X'}), EMBER_ERR_BAD_FORMAT);
  EXPECT_EQ(patch_and_load(4, {99, 0, 0, 0}), EMBER_ERR_UNSUPPORTED);
  const ember_status tensors = patch_and_load(8, ff8);
  EXPECT_TRUE(tensors == EMBER_ERR_BAD_FORMAT || tensors == EMBER_ERR_OUT_OF_MEMORY) << ember_status_string(tensors);
  EXPECT_EQ(patch_and_load(16, ff8), EMBER_ERR_BAD_FORMAT);
  EXPECT_EQ(patch_and_load(16, big_count), EMBER_ERR_BAD_FORMAT);
  // First key length (u64 at 24) and first value type (after the key).
  EXPECT_EQ(patch_and_load(24, ff8), EMBER_ERR_BAD_FORMAT);

  // Random corruption of the metadata / tensor-info region.
  std::mt19937 rng(1234);
  const size_t region = std::min<size_t>(data.size(), 1u << 20);
  for (int trial = 0; trial < 24; ++trial) {
    const size_t at = 24 + rng() % (region - 32);
    std::vector<unsigned char> bytes(1 + rng() % 8);
    for (auto& b : bytes) b = static_cast<unsigned char>(rng());
    SCOPED_TRACE("trial " + std::to_string(trial) + " at offset " + std::to_string(at));
    const ember_status st = patch_and_load(at, bytes);
    EXPECT_TRUE(st == EMBER_OK || st == EMBER_ERR_BAD_FORMAT || st == EMBER_ERR_UNSUPPORTED ||
                st == EMBER_ERR_OUT_OF_MEMORY)
        << ember_status_string(st) << ": " << ember_last_error();
  }
  // The restored copy loads again.
  EXPECT_EQ(try_load(path), EMBER_OK);
}
