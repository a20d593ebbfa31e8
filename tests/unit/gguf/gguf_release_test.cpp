// Pages of a file's image released and read back (gguf.h: release_image_pages,
// ImagePin): the bytes come back exactly, pins keep pages resident, and a file
// changed or truncated since it was loaded is an error, never other bytes.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "core/gguf/gguf.h"
#include "core/gguf/gguf_writer.h"
#include "core/util/status.h"

namespace ember::gguf {
namespace {

std::string temp_path(const std::string& name) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/ember_release_test_" + std::to_string(::getpid()) + "_" + name;
}

constexpr size_t kTensorBytes = 64 * 4096;

// A file with one 256 KiB tensor of varied bytes.
std::string write_model(const std::string& name) {
  GgufWriter w(3);
  w.add_string("general.architecture", "llama");
  std::vector<uint8_t> data(kTensorBytes);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  w.add_tensor("blob", DType::F32, {static_cast<int64_t>(kTensorBytes / 4)}, data);
  const std::string path = temp_path(name);
  w.write_file(path);
  return path;
}

// Pages of [p, p + n) resident in this process (mincore).
size_t resident_pages(const void* p, size_t n) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const auto a = reinterpret_cast<uintptr_t>(p) / page * page;
  const size_t pages = (reinterpret_cast<uintptr_t>(p) + n - a + page - 1) / page;
  std::vector<unsigned char> v(pages);
  if (::mincore(reinterpret_cast<void*>(a), pages * page, v.data()) != 0) return SIZE_MAX;
  size_t r = 0;
  for (unsigned char c : v) r += c & 1;
  return r;
}

// The VmFlags of the mapping holding p (/proc/self/smaps), "" if not found.
std::string vma_flags(const void* p) {
  std::ifstream in("/proc/self/smaps");
  const auto a = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find('-') < line.find(' ')) {
      inside = a >= lo && a < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line.substr(8);
    }
  }
  return "";
}

class ReleaseTest : public ::testing::TestWithParam<GgufFile::Residency> {};

TEST_P(ReleaseTest, ReleasedPagesComeBackExactlyUnderAPin) {
  const std::string path = write_model("roundtrip");
  auto f = GgufFile::open(path, GetParam());
  const TensorInfo* t = f->find_tensor("blob");
  ASSERT_NE(t, nullptr);
  const std::vector<uint8_t> before(static_cast<const uint8_t*>(t->data),
                                    static_cast<const uint8_t*>(t->data) + t->nbytes);
  const size_t dropped = release_image_pages(t->data, t->nbytes);
  // Whole pages inside the tensor: all but at most the two it straddles.
  EXPECT_GE(dropped, t->nbytes - 2 * 4096);
  EXPECT_EQ(released_image_bytes(t->data, t->nbytes), dropped);
  EXPECT_EQ(release_image_pages(t->data, t->nbytes), 0u) << "released twice";
  if (GetParam() == GgufFile::Residency::kPrivateCopy) {
    EXPECT_LE(resident_pages(t->data, t->nbytes), 2u) << "a private copy's released pages must leave the process";
    // ... and stay out: khugepaged folds released pages of a huge-page
    // mapping back into zero-filled 2 MiB pages unless the run says no.
    EXPECT_NE(vma_flags(static_cast<const uint8_t*>(t->data) + 2 * 4096).find(" nh"), std::string::npos)
        << "a released run must be marked MADV_NOHUGEPAGE";
  }
  {
    ImagePin pin(t->data, t->nbytes);
    EXPECT_TRUE(pin.held());
    EXPECT_EQ(released_image_bytes(t->data, t->nbytes), 0u);
    EXPECT_EQ(std::memcmp(before.data(), t->data, t->nbytes), 0);
    // Pinned pages are not released.
    EXPECT_EQ(release_image_pages(t->data, t->nbytes), 0u);
  }
  // Part of it, then all: only what was not released already goes.
  const size_t half = release_image_pages(t->data, t->nbytes / 2);
  EXPECT_GT(half, 0u);
  EXPECT_EQ(release_image_pages(t->data, t->nbytes), dropped - half);
  // A pin over a few bytes brings back only the run holding them.
  {
    constexpr size_t kAt = 2 * 4096 + 100;  // inside the first half's run
    ImagePin pin(static_cast<const uint8_t*>(t->data) + kAt, 8);
    EXPECT_EQ(std::memcmp(before.data() + kAt, static_cast<const uint8_t*>(t->data) + kAt, 8), 0);
    EXPECT_EQ(released_image_bytes(t->data, t->nbytes), dropped - half);
  }
  ImagePin all(t->data, t->nbytes);
  EXPECT_EQ(std::memcmp(before.data(), t->data, t->nbytes), 0);
  all.reset();
  std::remove(path.c_str());
}

INSTANTIATE_TEST_SUITE_P(Residency, ReleaseTest,
                         ::testing::Values(GgufFile::Residency::kPrivateCopy, GgufFile::Residency::kSharedMapping));

TEST(ImageRelease, AFileChangedSinceLoadingIsAnErrorNotOtherBytes) {
  const std::string path = write_model("changed");
  auto f = GgufFile::open(path, GgufFile::Residency::kPrivateCopy);
  const TensorInfo* t = f->find_tensor("blob");
  ASSERT_NE(t, nullptr);
  ASSERT_GT(release_image_pages(t->data, t->nbytes), 0u);
  {  // one byte in the middle of the tensor, changed in place
    std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
    const auto off = static_cast<std::streamoff>(f->data_offset() + t->offset + t->nbytes / 2);
    io.seekg(off);
    const char c = static_cast<char>(io.get());
    io.seekp(off);
    io.put(static_cast<char>(c ^ 1));
  }
  try {
    ImagePin pin(t->data, t->nbytes);
    FAIL() << "a changed file was read back";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kBadFormat);
    EXPECT_NE(std::string(e.what()).find("changed"), std::string::npos) << e.what();
  }
  // Still released (not the changed bytes), and still an error next time.
  EXPECT_GT(released_image_bytes(t->data, t->nbytes), 0u);
  EXPECT_THROW(ImagePin(t->data, t->nbytes), Error);
  // Truncated: an error too.
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(f->data_offset() + t->offset + 10)), 0);
  EXPECT_THROW(ImagePin(t->data, t->nbytes), Error);
  std::remove(path.c_str());
}

TEST(ImageRelease, ADeletedFileIsStillReadBack) {
  const std::string path = write_model("deleted");
  auto f = GgufFile::open(path, GgufFile::Residency::kPrivateCopy);
  const TensorInfo* t = f->find_tensor("blob");
  const std::vector<uint8_t> before(static_cast<const uint8_t*>(t->data),
                                    static_cast<const uint8_t*>(t->data) + t->nbytes);
  ASSERT_GT(release_image_pages(t->data, t->nbytes), 0u);
  std::remove(path.c_str());  // (replaced by a rename, or deleted: the open file is read)
  ImagePin pin(t->data, t->nbytes);
  EXPECT_EQ(std::memcmp(before.data(), t->data, t->nbytes), 0);
}

TEST(ImageRelease, MemoryThatIsNoImageIsLeftAlone) {
  std::vector<uint8_t> buf(3 * kTensorBytes, 7);
  EXPECT_EQ(release_image_pages(buf.data(), buf.size()), 0u);
  ImagePin pin(buf.data(), buf.size());
  EXPECT_FALSE(pin.held());
  EXPECT_EQ(buf[kTensorBytes], 7);
  EXPECT_EQ(release_image_pages(nullptr, 10), 0u);
  const std::string path = write_model("closed");
  const void* data = nullptr;
  size_t n = 0;
  {
    auto f = GgufFile::open(path, GgufFile::Residency::kPrivateCopy);
    data = f->find_tensor("blob")->data;
    n = f->find_tensor("blob")->nbytes;
    ImagePin outlives(data, n);
    f.reset();  // the file goes first: the pin's end is harmless
  }
  EXPECT_EQ(released_image_bytes(data, n), 0u);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace ember::gguf
