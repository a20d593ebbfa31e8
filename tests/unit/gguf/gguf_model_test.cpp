// Opens the real SmolLM2-135M-Instruct Q4_1 GGUF when it is present
// ($EMBER_HOME, default ~/.cache/ember); skipped otherwise.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/gguf/gguf.h"

namespace ember::gguf {
namespace {

std::string model_path() {
  std::string home;
  if (const char* e = std::getenv("EMBER_HOME"); e && *e) {
    home = e;
  } else if (const char* h = std::getenv("HOME"); h && *h) {
    home = std::string(h) + "/.cache/ember";
  } else {
    return {};
  }
  return home + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

TEST(GgufRealModel, SmolLM2) {
  const std::string path = model_path();
  struct stat st {};
  if (path.empty() || ::stat(path.c_str(), &st) != 0) GTEST_SKIP() << "model not found: " << path;

  auto f = GgufFile::open(path);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->file_size(), static_cast<size_t>(st.st_size));
  EXPECT_EQ(f->tensors().size(), 272u);
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->get_int("llama.block_count"), 30);
  EXPECT_EQ(f->get_int("llama.embedding_length"), 576);
  const auto tokens = f->get_string_array("tokenizer.ggml.tokens");
  EXPECT_EQ(tokens.size(), 49152u);
  const auto scores = f->get_float_array("tokenizer.ggml.scores");
  EXPECT_TRUE(scores.empty() || scores.size() == 49152u) << scores.size();

  const TensorInfo* emb = f->find_tensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->type, DType::Q8_0);
  EXPECT_EQ(emb->n_dims, 2u);
  EXPECT_EQ(emb->ne[0], 576);
  EXPECT_EQ(emb->ne[1], 49152);
  EXPECT_EQ(emb->nbytes, 49152u * 18u * 34u);

  // Every tensor is inside the file and aligned; dequantize a row of each
  // type we can compute with and check it is finite and not all zero.
  for (const TensorInfo& t : f->tensors()) {
    EXPECT_EQ(t.offset % f->alignment(), 0u) << t.name;
    const auto* p = static_cast<const uint8_t*>(t.data);
    EXPECT_GE(p, f->data() + f->data_offset()) << t.name;
    EXPECT_LE(p + t.nbytes, f->data() + f->file_size()) << t.name;
    const TypeTraits* tt = type_traits(t.type);
    ASSERT_NE(tt, nullptr);
    if (tt->dequantize_row == nullptr) continue;
    std::vector<float> row(static_cast<size_t>(t.ne[0]));
    tt->dequantize_row(t.data, row.data(), t.ne[0]);
    bool finite = true, nonzero = false;
    for (float x : row) {
      finite &= std::isfinite(x);
      nonzero |= x != 0.0f;
    }
    EXPECT_TRUE(finite) << t.name;
    EXPECT_TRUE(nonzero) << t.name;
  }
}

}  // namespace
}  // namespace ember::gguf
