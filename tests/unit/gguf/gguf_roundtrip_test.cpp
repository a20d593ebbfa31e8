// Writer -> reader round trips: every value type, nested arrays, tensors,
// alignment, v2 and v3, in memory and through a file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/gguf/gguf.h"
#include "core/gguf/gguf_writer.h"
#include "core/util/status.h"
#include "gguf_test_util.h"

namespace ember::gguf {
namespace {

using testing::f32_bytes;

std::string temp_path(const std::string& name) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/ember_gguf_test_" + std::to_string(::getpid()) + "_" + name;
}

StatusCode code_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.code();
  }
  return StatusCode::kOk;
}

class RoundTrip : public ::testing::TestWithParam<uint32_t> {};

TEST_P(RoundTrip, EveryScalarType) {
  GgufWriter w(GetParam());
  w.add_u8("u8", 200);
  w.add_i8("i8", -100);
  w.add_u16("u16", 60000);
  w.add_i16("i16", -30000);
  w.add_u32("u32", 4000000000u);
  w.add_i32("i32", -2000000000);
  w.add_u64("u64", (1ull << 63) + 5);
  w.add_u64("u64small", 12345);
  w.add_i64("i64", -(1ll << 62));
  w.add_f32("f32", 1.5f);
  w.add_f64("f64", -2.25e100);
  w.add_bool("btrue", true);
  w.add_bool("bfalse", false);
  w.add_string("str", "h\xc3\xa9llo");
  w.add_string("empty", "");
  const std::vector<uint8_t> img = w.write();
  EXPECT_EQ(img.size(), w.file_size());

  auto f = GgufFile::from_memory(img.data(), img.size());
  EXPECT_EQ(f->version(), GetParam());
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->metadata().size(), 15u);
  EXPECT_TRUE(f->tensors().empty());

  // Order is preserved.
  EXPECT_EQ(f->metadata()[0].first, "u8");
  EXPECT_EQ(f->metadata()[14].first, "empty");

  EXPECT_EQ(f->find("u8")->type, ValueType::UINT8);
  EXPECT_EQ(f->find("u8")->u64, 200u);
  EXPECT_EQ(f->find("i8")->type, ValueType::INT8);
  EXPECT_EQ(f->find("i8")->i64, -100);
  EXPECT_EQ(f->find("u16")->u64, 60000u);
  EXPECT_EQ(f->find("i16")->i64, -30000);
  EXPECT_EQ(f->find("u32")->u64, 4000000000u);
  EXPECT_EQ(f->find("i32")->i64, -2000000000);
  EXPECT_EQ(f->find("u64")->u64, (1ull << 63) + 5);
  EXPECT_EQ(f->find("i64")->i64, -(1ll << 62));
  EXPECT_EQ(f->find("f32")->type, ValueType::FLOAT32);
  EXPECT_EQ(f->find("f32")->f64, 1.5);
  EXPECT_EQ(f->find("f64")->f64, -2.25e100);
  EXPECT_TRUE(f->find("btrue")->b);
  EXPECT_FALSE(f->find("bfalse")->b);
  EXPECT_EQ(f->find("str")->str, "h\xc3\xa9llo");
  EXPECT_EQ(f->find("empty")->str, "");
  EXPECT_EQ(f->find("missing"), nullptr);

  for (const char* k : {"u8", "i8", "u16", "i16", "u32", "i32", "u64", "i64"}) {
    EXPECT_TRUE(f->find(k)->is_integer()) << k;
    EXPECT_FALSE(f->find(k)->is_float()) << k;
  }
  EXPECT_TRUE(f->find("f32")->is_float());
  EXPECT_FALSE(f->find("btrue")->is_integer());

  // Typed getters.
  EXPECT_EQ(f->get_int("u8"), 200);
  EXPECT_EQ(f->get_int("i8"), -100);
  EXPECT_EQ(f->get_int("u32"), 4000000000ll);
  EXPECT_EQ(f->get_int("i64"), -(1ll << 62));
  EXPECT_EQ(f->get_int("u64small"), 12345);
  EXPECT_EQ(f->get_int("missing"), std::nullopt);
  EXPECT_EQ(code_of([&] { f->get_int("u64"); }), StatusCode::kBadFormat);  // > INT64_MAX
  EXPECT_EQ(code_of([&] { f->get_int("f32"); }), StatusCode::kBadFormat);
  EXPECT_EQ(code_of([&] { f->get_int("str"); }), StatusCode::kBadFormat);
  EXPECT_EQ(f->get_float("f32"), 1.5);
  EXPECT_EQ(f->get_float("f64"), -2.25e100);
  EXPECT_EQ(f->get_float("i16"), -30000.0);
  EXPECT_EQ(f->get_float("u64"), static_cast<double>((1ull << 63) + 5));
  EXPECT_EQ(f->get_float("missing"), std::nullopt);
  EXPECT_EQ(code_of([&] { f->get_float("btrue"); }), StatusCode::kBadFormat);
  EXPECT_EQ(f->get_bool("btrue"), true);
  EXPECT_EQ(f->get_bool("bfalse"), false);
  EXPECT_EQ(f->get_bool("missing"), std::nullopt);
  EXPECT_EQ(code_of([&] { f->get_bool("u8"); }), StatusCode::kBadFormat);
  EXPECT_EQ(f->get_string("str"), "h\xc3\xa9llo");
  EXPECT_EQ(f->get_string("missing"), std::nullopt);
  EXPECT_EQ(code_of([&] { f->get_string("u8"); }), StatusCode::kBadFormat);
  EXPECT_EQ(code_of([&] { f->get_string_array("str"); }), StatusCode::kBadFormat);
  EXPECT_TRUE(f->get_string_array("missing").empty());
}

TEST_P(RoundTrip, ArraysOfEveryTypeAndNesting) {
  GgufWriter w(GetParam());
  w.add_array("a.u8", std::vector<uint8_t>{0, 1, 255});
  w.add_array("a.i8", std::vector<int8_t>{-128, 0, 127});
  w.add_array("a.u16", std::vector<uint16_t>{0, 65535});
  w.add_array("a.i16", std::vector<int16_t>{-32768, 32767});
  w.add_array("a.u32", std::vector<uint32_t>{0, 0xFFFFFFFFu});
  w.add_array("a.i32", std::vector<int32_t>{-5, 5, 1 << 30});
  w.add_array("a.u64", std::vector<uint64_t>{0, ~0ull});
  w.add_array("a.i64", std::vector<int64_t>{std::numeric_limits<int64_t>::min(), 3});
  w.add_array("a.f32", std::vector<float>{0.5f, -1.25f, 1e30f});
  w.add_array("a.f64", std::vector<double>{1e-300, -0.0});
  w.add_array("a.bool", std::vector<bool>{true, false, true});
  w.add_array("a.str", std::vector<std::string>{"a", "", "long string with spaces"});
  w.add_array("a.empty", std::vector<int32_t>{});
  w.add_array("a.empty_str", std::vector<std::string>{});
  // [[1,2],[],[3]]
  w.add_array("a.nested", ValueType::ARRAY,
              {make_array(std::vector<int32_t>{1, 2}), make_array(std::vector<int32_t>{}),
               make_array(std::vector<int32_t>{3})});
  // [[["x"]], [["y","z"], []]]
  w.add_array("a.nested3", ValueType::ARRAY,
              {make_array(ValueType::ARRAY, {make_array(std::vector<std::string>{"x"})}),
               make_array(ValueType::ARRAY,
                          {make_array(std::vector<std::string>{"y", "z"}), make_array(std::vector<std::string>{})})});
  // Array of arrays of different element types is legal GGUF.
  w.add_array("a.mixed", ValueType::ARRAY,
              {make_array(std::vector<float>{1.0f}), make_array(std::vector<std::string>{"s"})});
  // 8 levels of nesting: the maximum the reader accepts.
  Value deep = make_array(std::vector<uint8_t>{42});
  for (int i = 1; i < 8; ++i) deep = make_array(ValueType::ARRAY, {deep});
  w.add_kv("a.deep8", deep);
  const auto img = w.write();
  auto f = GgufFile::from_memory(img.data(), img.size());

  EXPECT_EQ(f->get_int_array("a.u8"), (std::vector<int64_t>{0, 1, 255}));
  EXPECT_EQ(f->get_int_array("a.i8"), (std::vector<int64_t>{-128, 0, 127}));
  EXPECT_EQ(f->get_int_array("a.u16"), (std::vector<int64_t>{0, 65535}));
  EXPECT_EQ(f->get_int_array("a.i16"), (std::vector<int64_t>{-32768, 32767}));
  EXPECT_EQ(f->get_int_array("a.u32"), (std::vector<int64_t>{0, 0xFFFFFFFFll}));
  EXPECT_EQ(f->get_int_array("a.i32"), (std::vector<int64_t>{-5, 5, 1 << 30}));
  EXPECT_EQ(code_of([&] { f->get_int_array("a.u64"); }), StatusCode::kBadFormat);  // ~0 out of range
  EXPECT_EQ(f->find("a.u64")->array[1].u64, ~0ull);
  EXPECT_EQ(f->get_int_array("a.i64"), (std::vector<int64_t>{std::numeric_limits<int64_t>::min(), 3}));
  EXPECT_EQ(f->get_float_array("a.f32"), (std::vector<float>{0.5f, -1.25f, 1e30f}));
  EXPECT_EQ(f->get_float_array("a.i32"), (std::vector<float>{-5.0f, 5.0f, static_cast<float>(1 << 30)}));
  const Value* f64 = f->find("a.f64");
  ASSERT_NE(f64, nullptr);
  EXPECT_EQ(f64->array_type, ValueType::FLOAT64);
  EXPECT_EQ(f64->array[0].f64, 1e-300);
  EXPECT_TRUE(std::signbit(f64->array[1].f64));
  const Value* b = f->find("a.bool");
  ASSERT_EQ(b->array.size(), 3u);
  EXPECT_EQ(b->array_type, ValueType::BOOL);
  EXPECT_TRUE(b->array[0].b);
  EXPECT_FALSE(b->array[1].b);
  EXPECT_EQ(f->get_string_array("a.str"), (std::vector<std::string>{"a", "", "long string with spaces"}));
  EXPECT_TRUE(f->get_int_array("a.empty").empty());
  EXPECT_EQ(f->find("a.empty")->array_type, ValueType::INT32);
  EXPECT_TRUE(f->get_string_array("a.empty_str").empty());
  EXPECT_EQ(code_of([&] { f->get_int_array("a.str"); }), StatusCode::kBadFormat);
  EXPECT_EQ(code_of([&] { f->get_string_array("a.i32"); }), StatusCode::kBadFormat);
  EXPECT_EQ(code_of([&] { f->get_float_array("a.str"); }), StatusCode::kBadFormat);
  EXPECT_EQ(code_of([&] { f->get_int_array("a.nested"); }), StatusCode::kBadFormat);

  const Value* n = f->find("a.nested");
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(n->type, ValueType::ARRAY);
  EXPECT_EQ(n->array_type, ValueType::ARRAY);
  ASSERT_EQ(n->array.size(), 3u);
  EXPECT_EQ(n->array[0].type, ValueType::ARRAY);
  EXPECT_EQ(n->array[0].array_type, ValueType::INT32);
  ASSERT_EQ(n->array[0].array.size(), 2u);
  EXPECT_EQ(n->array[0].array[1].i64, 2);
  EXPECT_TRUE(n->array[1].array.empty());
  EXPECT_EQ(n->array[2].array[0].i64, 3);

  const Value* n3 = f->find("a.nested3");
  ASSERT_EQ(n3->array.size(), 2u);
  EXPECT_EQ(n3->array[0].array[0].array[0].str, "x");
  EXPECT_EQ(n3->array[1].array[0].array[1].str, "z");
  EXPECT_TRUE(n3->array[1].array[1].array.empty());

  const Value* mixed = f->find("a.mixed");
  EXPECT_EQ(mixed->array[0].array_type, ValueType::FLOAT32);
  EXPECT_EQ(mixed->array[1].array[0].str, "s");

  const Value* d = f->find("a.deep8");
  for (int i = 0; i < 7; ++i) {
    ASSERT_EQ(d->type, ValueType::ARRAY);
    ASSERT_EQ(d->array.size(), 1u);
    d = &d->array[0];
  }
  EXPECT_EQ(d->array_type, ValueType::UINT8);
  EXPECT_EQ(d->array[0].u64, 42u);
}

TEST_P(RoundTrip, TensorsAndDefaultAlignment) {
  GgufWriter w(GetParam());
  w.add_string("general.architecture", "llama");
  std::vector<float> a(16);
  for (int i = 0; i < 16; ++i) a[static_cast<size_t>(i)] = i * 0.5f;
  std::vector<uint16_t> h(32);
  for (int i = 0; i < 32; ++i) h[static_cast<size_t>(i)] = fp32_to_fp16(static_cast<float>(i));
  std::vector<uint8_t> q8(3 * 34), q4(2 * 18), q41(20), q5k(176), i8(5);
  for (size_t i = 0; i < q8.size(); ++i) q8[i] = static_cast<uint8_t>(i);
  for (size_t i = 0; i < q4.size(); ++i) q4[i] = static_cast<uint8_t>(i * 3);
  for (size_t i = 0; i < q41.size(); ++i) q41[i] = static_cast<uint8_t>(i * 5);
  for (size_t i = 0; i < q5k.size(); ++i) q5k[i] = static_cast<uint8_t>(i ^ 0x55);
  for (size_t i = 0; i < i8.size(); ++i) i8[i] = static_cast<uint8_t>(250 + i);
  q8[0] = 0x00, q8[1] = 0x3C;  // d of block 0 = 1.0
  w.add_tensor("a.f32", DType::F32, {8, 2}, a.data(), a.size() * 4);
  w.add_tensor("b.f16", DType::F16, {32}, h.data(), h.size() * 2);
  w.add_tensor("c.q8_0", DType::Q8_0, {32, 3}, q8);
  w.add_tensor("d.q4_0", DType::Q4_0, {64}, q4);
  w.add_tensor("e.q4_1.3d", DType::Q4_1, {32, 1, 1}, q41);
  w.add_tensor("f.q5_k", DType::Q5_K, {256}, q5k);
  w.add_tensor("g.i8.4d", DType::I8, {1, 5, 1, 1}, i8);
  const auto img = w.write();
  EXPECT_EQ(img.size(), w.file_size());
  EXPECT_EQ(img.size() % 32, 0u);  // ggml pads the last tensor too

  auto f = GgufFile::from_memory(img.data(), img.size());
  EXPECT_EQ(f->version(), GetParam());
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->data_offset() % 32, 0u);
  EXPECT_EQ(f->data(), img.data());
  EXPECT_EQ(f->file_size(), img.size());
  ASSERT_EQ(f->tensors().size(), 7u);
  EXPECT_EQ(f->tensors()[0].name, "a.f32");  // file order preserved
  EXPECT_EQ(f->tensors()[6].name, "g.i8.4d");
  for (const TensorInfo& t : f->tensors()) {
    EXPECT_EQ(t.offset % 32, 0u) << t.name;
    EXPECT_EQ(t.data, img.data() + f->data_offset() + t.offset) << t.name;
    EXPECT_EQ(f->find_tensor(t.name), &t);
  }
  EXPECT_EQ(f->find_tensor("nope"), nullptr);

  const TensorInfo* t = f->find_tensor("a.f32");
  EXPECT_EQ(t->n_dims, 2u);
  EXPECT_EQ(t->ne[0], 8);
  EXPECT_EQ(t->ne[1], 2);
  EXPECT_EQ(t->ne[2], 1);
  EXPECT_EQ(t->ne[3], 1);
  EXPECT_EQ(t->n_elements(), 16);
  EXPECT_EQ(t->type, DType::F32);
  EXPECT_EQ(t->nbytes, 64u);
  EXPECT_EQ(t->offset, 0u);
  EXPECT_EQ(std::memcmp(t->data, a.data(), 64), 0);

  t = f->find_tensor("b.f16");
  EXPECT_EQ(t->type, DType::F16);
  EXPECT_EQ(t->nbytes, 64u);
  EXPECT_EQ(t->offset, 64u);
  std::vector<float> y(32);
  type_traits(t->type)->dequantize_row(t->data, y.data(), 32);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[static_cast<size_t>(i)], static_cast<float>(i));

  t = f->find_tensor("c.q8_0");
  EXPECT_EQ(t->type, DType::Q8_0);
  EXPECT_EQ(t->nbytes, 102u);
  EXPECT_EQ(t->offset, 128u);
  EXPECT_EQ(std::memcmp(t->data, q8.data(), q8.size()), 0);
  type_traits(t->type)->dequantize_row(t->data, y.data(), 32);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[static_cast<size_t>(i)], static_cast<float>(2 + i));

  t = f->find_tensor("d.q4_0");
  EXPECT_EQ(t->offset, 256u);  // 128 + 102 -> aligned to 256
  EXPECT_EQ(t->nbytes, 36u);
  EXPECT_EQ(std::memcmp(t->data, q4.data(), q4.size()), 0);

  t = f->find_tensor("e.q4_1.3d");
  EXPECT_EQ(t->n_dims, 3u);
  EXPECT_EQ(t->type, DType::Q4_1);
  EXPECT_EQ(std::memcmp(t->data, q41.data(), q41.size()), 0);

  t = f->find_tensor("f.q5_k");
  EXPECT_EQ(t->type, DType::Q5_K);
  EXPECT_EQ(t->nbytes, 176u);
  EXPECT_NE(type_traits(t->type)->dequantize_row, nullptr);
  EXPECT_EQ(std::memcmp(t->data, q5k.data(), q5k.size()), 0);

  t = f->find_tensor("g.i8.4d");
  EXPECT_EQ(t->n_dims, 4u);
  EXPECT_EQ(t->ne[0], 1);
  EXPECT_EQ(t->ne[1], 5);
  EXPECT_EQ(t->n_elements(), 5);
  EXPECT_EQ(std::memcmp(t->data, i8.data(), 5), 0);
}

TEST_P(RoundTrip, CustomAlignment) {
  for (size_t align : {1u, 8u, 64u, 4096u}) {
    SCOPED_TRACE(align);
    GgufWriter w(GetParam());
    w.set_alignment(align);
    w.set_alignment(align);  // setting twice replaces, never duplicates
    w.add_string("k", "v");
    std::vector<float> x(3, 1.0f), y(5, 2.0f);
    w.add_tensor("x", DType::F32, {3}, f32_bytes(x));
    w.add_tensor("y", DType::F32, {5}, f32_bytes(y));
    const auto img = w.write();
    EXPECT_EQ(img.size(), w.file_size());
    auto f = GgufFile::from_memory(img.data(), img.size());
    EXPECT_EQ(f->alignment(), align);
    EXPECT_EQ(f->get_int("general.alignment"), static_cast<int64_t>(align));
    EXPECT_EQ(f->metadata().size(), 2u);
    EXPECT_EQ(f->data_offset() % align, 0u);
    const TensorInfo* ty = f->find_tensor("y");
    EXPECT_EQ(ty->offset % align, 0u);
    EXPECT_EQ(ty->offset, (12 + align - 1) / align * align);
    EXPECT_EQ(std::memcmp(ty->data, y.data(), 20), 0);
  }
}

TEST_P(RoundTrip, SmallValidFile) {
  const auto img = testing::small_valid_file(GetParam());
  auto f = GgufFile::from_memory(img.data(), img.size());
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens").size(), 4u);
  EXPECT_EQ(f->tensors().size(), 3u);
  const TensorInfo* last = f->find_tensor("output_norm.weight");
  EXPECT_EQ(f->data_offset() + last->offset + last->nbytes, img.size());  // ends exactly at EOF
}

INSTANTIATE_TEST_SUITE_P(Versions, RoundTrip, ::testing::Values(2u, 3u),
                         [](const ::testing::TestParamInfo<uint32_t>& info) {
                           return std::string(info.param == 2 ? "v2" : "v3");
                         });

TEST(GgufWriter, NoTensorsAndNoMetadata) {
  GgufWriter w;
  const auto img = w.write();
  EXPECT_EQ(img.size(), 32u);  // 24-byte header padded to the alignment
  auto f = GgufFile::from_memory(img.data(), img.size());
  EXPECT_EQ(f->version(), 3u);
  EXPECT_TRUE(f->metadata().empty());
  EXPECT_TRUE(f->tensors().empty());
  // Without tensors the padding is optional.
  auto g = GgufFile::from_memory(img.data(), 24);
  EXPECT_TRUE(g->tensors().empty());
}

TEST(GgufWriter, PadEndOff) {
  GgufWriter w;
  w.set_pad_end(false);
  std::vector<float> x(3, 1.0f);
  w.add_tensor("x", DType::F32, {3}, f32_bytes(x));
  const auto img = w.write();
  EXPECT_EQ(img.size(), w.file_size());
  auto f = GgufFile::from_memory(img.data(), img.size());
  EXPECT_EQ(f->data_offset() + 12, img.size());
}

TEST(GgufWriter, FileRoundTripWithFillers) {
  const std::string path = temp_path("fill.gguf");
  GgufWriter w(2);
  w.set_alignment(64);
  w.add_string("general.architecture", "llama");
  int calls = 0;
  w.add_tensor("big", DType::F16, {256, 64}, [&](uint8_t* dst, size_t n) {
    ++calls;
    ASSERT_EQ(n, 256u * 64u * 2u);
    for (size_t i = 0; i < n; ++i) dst[i] = static_cast<uint8_t>(i % 251);
  });
  w.add_tensor("small", DType::Q8_0, {32}, std::vector<uint8_t>(34, 9));
  w.write_file(path);
  EXPECT_EQ(calls, 1);
  {
    auto f = GgufFile::open(path);
    EXPECT_EQ(f->version(), 2u);
    EXPECT_EQ(f->alignment(), 64u);
    EXPECT_EQ(f->file_size(), w.file_size());
    const TensorInfo* big = f->find_tensor("big");
    ASSERT_NE(big, nullptr);
    const auto* p = static_cast<const uint8_t*>(big->data);
    bool ok = true;
    for (size_t i = 0; i < big->nbytes; ++i) ok &= p[i] == static_cast<uint8_t>(i % 251);
    EXPECT_TRUE(ok);
    EXPECT_EQ(static_cast<const uint8_t*>(f->find_tensor("small")->data)[33], 9);
    // Identical to the in-memory image.
    const auto img = w.write();
    ASSERT_EQ(img.size(), f->file_size());
    EXPECT_EQ(std::memcmp(img.data(), f->data(), img.size()), 0);
  }
  std::remove(path.c_str());
}

TEST(GgufWriter, RejectsMisuse) {
  GgufWriter w;
  w.add_u32("a", 1);
  EXPECT_EQ(code_of([&] { w.add_u32("a", 2); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { w.add_u32("", 2); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { GgufWriter bad(1); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { w.set_alignment(48); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { w.set_alignment(0); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { w.add_string("general.alignment", "x"); }), StatusCode::kInvalidArgument);
  // Heterogeneous arrays, out-of-range scalars and too-deep nesting.
  EXPECT_EQ(code_of([&] {
              w.add_array("h", ValueType::INT32, {make_i32(1), make_u8(2)});
            }),
            StatusCode::kInvalidArgument);
  Value v = make_u8(1);
  v.u64 = 256;
  EXPECT_EQ(code_of([&] { w.add_kv("r", v); }), StatusCode::kInvalidArgument);
  Value deep = make_array(std::vector<uint8_t>{1});
  for (int i = 1; i < 9; ++i) deep = make_array(ValueType::ARRAY, {deep});
  EXPECT_EQ(code_of([&] { w.add_kv("deep", deep); }), StatusCode::kInvalidArgument);

  std::vector<uint8_t> d(64);
  w.add_tensor("t", DType::F32, {16}, d);
  EXPECT_EQ(code_of([&] { w.add_tensor("t", DType::F32, {16}, d); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { w.add_tensor("u", DType::F32, {15}, d); }), StatusCode::kInvalidArgument);  // size
  EXPECT_EQ(code_of([&] { w.add_tensor("u", DType::F32, {}, d); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { w.add_tensor("u", DType::F32, {1, 1, 1, 1, 16}, d); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { w.add_tensor("u", DType::F32, {16, 0}, d); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { w.add_tensor("u", DType::Q4_0, {16}, std::vector<uint8_t>(9)); }),
            StatusCode::kInvalidArgument);  // ne[0] % 32
  EXPECT_EQ(code_of([&] { w.add_tensor("u", static_cast<DType>(4), {16}, d); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { w.add_tensor(std::string(65, 'n'), DType::F32, {16}, d); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { w.set_alignment(64); }), StatusCode::kInvalidArgument);  // after tensors
  EXPECT_EQ(code_of([&] { w.write_file("/nonexistent-dir/x.gguf"); }), StatusCode::kNotFound);
  // The writer is still usable after rejected calls.
  const auto img = w.write();
  auto f = GgufFile::from_memory(img.data(), img.size());
  EXPECT_EQ(f->tensors().size(), 1u);
  EXPECT_EQ(f->metadata().size(), 1u);
}

TEST(GgufOpen, MissingFileIsNotFoundAndNamesThePath) {
  const std::string path = "/nonexistent/dir/model-xyz.gguf";
  try {
    GgufFile::open(path);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kNotFound);
    EXPECT_NE(e.message().find(path), std::string::npos) << e.message();
  }
  EXPECT_EQ(code_of([] { GgufFile::open("/tmp"); }), StatusCode::kNotFound);  // a directory
}

TEST(GgufOpen, BadFileNamesThePathAndTheProblem) {
  const std::string path = temp_path("bad.gguf");
  {
    std::FILE* fp = std::fopen(path.c_str(), "wb");
    ASSERT_NE(fp, nullptr);
    std::fputs("NOTAGGUF-------------------------", fp);
    std::fclose(fp);
  }
  try {
    GgufFile::open(path);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kBadFormat);
    EXPECT_NE(e.message().find(path), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("magic"), std::string::npos) << e.message();
  }
  {
    std::FILE* fp = std::fopen(path.c_str(), "wb");  // empty file
    std::fclose(fp);
  }
  EXPECT_EQ(code_of([&] { GgufFile::open(path); }), StatusCode::kBadFormat);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace ember::gguf
