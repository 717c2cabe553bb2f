#include "core/ckpt_format.h"

#include <malloc.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fixtures.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

// ---------------------------------------------------------------------------------------------
// Hand-built wire bytes, independent of the code under test.

std::string Varint(uint64_t v) {
  std::string out;
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
  return out;
}

// A length-delimited field.
std::string LenField(int field, std::string_view payload) {
  return Varint(static_cast<uint64_t>(field) << 3 | 2) + Varint(payload.size()) +
         std::string(payload);
}

std::string VarintField(int field, uint64_t v) {
  return Varint(static_cast<uint64_t>(field) << 3) + Varint(v);
}

std::string TensorProtoBytes(const std::vector<int64_t>& dims, std::string_view type,
                             std::string_view content, bool packed_dims = false) {
  std::string out;
  if (packed_dims) {
    std::string packed;
    for (int64_t d : dims) packed += Varint(static_cast<uint64_t>(d));
    out += LenField(1, packed);
  } else {
    for (int64_t d : dims) out += VarintField(1, static_cast<uint64_t>(d));
  }
  out += LenField(2, type);
  out += LenField(3, content);
  return out;
}

// One top-level record holding Value{tag, tensor}.
std::string Record(std::string_view tag, std::string_view tensor_proto) {
  return LenField(1, LenField(1, tag) + LenField(2, tensor_proto));
}

// Bitwise CRC-32 (zlib polynomial), to check the codec's use of zlib independently.
uint32_t ReferenceCrc32(std::string_view bytes) {
  uint32_t crc = 0xffffffffu;
  for (unsigned char c : bytes) {
    crc ^= c;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

// Offsets where top-level records start, plus the end of the last one; stops at a trailer.
std::vector<size_t> RecordBoundaries(std::string_view file) {
  std::vector<size_t> out = {0};
  size_t pos = 0;
  while (pos < file.size() && file[pos] == 0x0a) {
    ++pos;
    uint64_t len = 0;
    int shift = 0;
    unsigned char c;
    do {
      c = static_cast<unsigned char>(file[pos++]);
      len |= uint64_t{c & 0x7fu} << shift;
      shift += 7;
    } while (c & 0x80);
    pos += len;
    out.push_back(pos);
  }
  return out;
}

std::string RandomBytes(std::mt19937_64& rng, size_t n) {
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(rng());
  return out;
}

std::string Utf32Le(const std::u32string& s) {
  std::string out;
  for (char32_t c : s) {
    for (int k = 0; k < 4; ++k) out.push_back(static_cast<char>((c >> (8 * k)) & 0xff));
  }
  return out;
}

CkptTensor MakeTensor(std::string name, DType dtype, std::vector<int64_t> dims, std::string data) {
  CkptTensor t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.dims = std::move(dims);
  t.data = std::move(data);
  return t;
}

void ExpectSameTensor(const CkptTensor& got, const CkptTensor& want) {
  EXPECT_EQ(got.name, want.name);
  EXPECT_EQ(got.dtype, want.dtype) << want.name;
  EXPECT_EQ(got.dims, want.dims) << want.name;
  EXPECT_EQ(got.data, want.data) << want.name;
}

// Heap bytes in use (glibc); 0 where another allocator (e.g. a sanitizer's) replaces malloc.
size_t HeapBytesInUse() {
  const struct mallinfo2 info = ::mallinfo2();
  return info.uordblks + info.hblkhd;
}

// Records the largest read it was asked for and the heap in use while the reader reads: together
// they show whether the reader allocated a claimed length before the bytes arrived.
class CountingSource : public ByteSource {
 public:
  explicit CountingSource(std::string_view data) : inner_(data) {}
  absl::StatusOr<size_t> Read(char* buf, size_t n) override {
    max_request_ = std::max(max_request_, n);
    max_heap_ = std::max(max_heap_, HeapBytesInUse());
    return inner_.Read(buf, n);
  }
  std::string Describe() const override { return "<counting>"; }
  size_t max_request() const { return max_request_; }
  size_t max_heap() const { return max_heap_; }

 private:
  MemoryByteSource inner_;
  size_t max_request_ = 0;
  size_t max_heap_ = 0;
};

// A small file exercising several dtypes, a chunked tensor, a scalar and a string.
std::vector<CkptTensor> SampleTensors() {
  std::mt19937_64 rng(7);
  return {
      MakeTensor("w", DType::kFloat32, {3, 2}, RandomBytes(rng, 24)),
      MakeTensor("global_step", DType::kInt32, {}, RandomBytes(rng, 4)),
      MakeTensor("big", DType::kBFloat16, {5, 3}, RandomBytes(rng, 30)),
      MakeTensor("name", DType::kStr, {0}, Utf32Le(U"ab")),
  };
}

// ---------------------------------------------------------------------------------------------
// CkptTensor

TEST(CkptTensorTest, ShapeMapsScalarEncodings) {
  EXPECT_EQ(MakeTensor("a", DType::kFloat32, {4, 16}, "").shape(), (Shape{4, 16}));
  EXPECT_EQ(MakeTensor("a", DType::kFloat32, {}, "").shape(), Shape{});
  EXPECT_EQ(MakeTensor("a", DType::kInt64, {0}, "").shape(), Shape{});
  EXPECT_EQ(MakeTensor("a", DType::kInt64, {0, 3}, "").shape(), (Shape{0, 3}));
  EXPECT_EQ(MakeTensor("a", DType::kStr, {0}, "").shape(), Shape{});
  EXPECT_EQ(MakeTensor("a", DType::kStr, {7}, "").shape(), Shape{});
}

TEST(CkptTensorTest, StringValueDecodesUtf32) {
  const std::u32string text = U"lr \u00e9\u4e2d\U0001d11e";
  CkptTensor t = MakeTensor("s", DType::kStr, {0}, Utf32Le(text));
  absl::StatusOr<std::string> s = t.StringValue();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, "lr \xc3\xa9\xe4\xb8\xad\xf0\x9d\x84\x9e");
  EXPECT_EQ(*MakeTensor("e", DType::kStr, {0}, "").StringValue(), "");
}

TEST(CkptTensorTest, StringValueRejectsInvalidContent) {
  absl::StatusOr<std::string> surrogate =
      MakeTensor("s", DType::kStr, {0}, Utf32Le(U"a") + std::string("\x00\xd8\x00\x00", 4))
          .StringValue();
  EXPECT_EQ(surrogate.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(surrogate.status().message()), HasSubstr("character 1"));
  EXPECT_THAT(std::string(surrogate.status().message()), HasSubstr("\"s\""));

  absl::StatusOr<std::string> too_big =
      MakeTensor("s", DType::kStr, {0}, std::string("\x00\x00\x11\x00", 4)).StringValue();
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kInvalidArgument);

  absl::StatusOr<std::string> odd = MakeTensor("s", DType::kStr, {0}, "abc").StringValue();
  EXPECT_EQ(odd.status().code(), absl::StatusCode::kInvalidArgument);

  absl::StatusOr<std::string> not_str = MakeTensor("f", DType::kFloat32, {}, "abcd").StringValue();
  EXPECT_EQ(not_str.status().code(), absl::StatusCode::kFailedPrecondition);
}

// ---------------------------------------------------------------------------------------------
// Round trips and exact wire bytes

TEST(CkptRoundTripTest, EveryDtypeWithShapesAndScalars) {
  std::mt19937_64 rng(1);
  std::vector<CkptTensor> tensors;
  const DType kAll[] = {DType::kBool,     DType::kInt8,    DType::kUInt8,   DType::kInt16,
                        DType::kUInt16,   DType::kInt32,   DType::kUInt32,  DType::kInt64,
                        DType::kUInt64,   DType::kFloat16, DType::kFloat32, DType::kFloat64,
                        DType::kBFloat16, DType::kInt4,    DType::kStr};
  for (DType dtype : kAll) {
    const std::string base(DTypeName(dtype));
    if (dtype == DType::kStr) {
      tensors.push_back(MakeTensor(base, dtype, {0}, Utf32Le(U"x\u00e9")));
      continue;
    }
    const std::vector<int64_t> dims = {2, 3, 2};
    tensors.push_back(
        MakeTensor(base + ".matrix", dtype, dims, RandomBytes(rng, *ByteSizeOf(dtype, 12))));
    if (dtype != DType::kInt4) {  // an Int4 scalar cannot be packed in whole bytes
      tensors.push_back(
          MakeTensor(base + ".scalar", dtype, {}, RandomBytes(rng, *ByteSizeOf(dtype, 1))));
      tensors.push_back(
          MakeTensor(base + ".scalar0", dtype, {0}, RandomBytes(rng, *ByteSizeOf(dtype, 1))));
    }
  }
  absl::StatusOr<std::string> file = EncodeCkpt(tensors);
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<std::vector<CkptTensor>> decoded = DecodeCkpt(*file);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_EQ(decoded->size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) ExpectSameTensor((*decoded)[i], tensors[i]);
  absl::StatusOr<std::string> again = EncodeCkpt(*decoded);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *file);
}

TEST(CkptRoundTripTest, StrTensorDecodesToText) {
  std::vector<CkptTensor> in = {
      MakeTensor("optimizer", DType::kStr, {0}, Utf32Le(U"Adam\u00fc")),
      MakeTensor("empty", DType::kStr, {0}, ""),
  };
  absl::StatusOr<std::string> file = EncodeCkpt(in);
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<std::vector<CkptTensor>> out = DecodeCkpt(*file);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 2u);
  EXPECT_EQ((*out)[0].dims, (std::vector<int64_t>{0}));
  EXPECT_EQ((*out)[0].shape(), Shape{});
  EXPECT_EQ(*(*out)[0].StringValue(), "Adam\xc3\xbc");
  EXPECT_EQ(*(*out)[1].StringValue(), "");
}

TEST(CkptRoundTripTest, ZeroElementTensorsHaveEmptyContent) {
  std::vector<CkptTensor> in = {
      MakeTensor("rows0", DType::kFloat32, {0, 4}, ""),
      MakeTensor("cols0", DType::kInt4, {3, 0}, ""),
      MakeTensor("after", DType::kUInt8, {2}, "xy"),
  };
  absl::StatusOr<std::string> file = EncodeCkpt(in, {.slice_bytes = 1});
  ASSERT_TRUE(file.ok()) << file.status();
  // Each empty tensor is still one Value (with an empty tensor_content field).
  EXPECT_THAT(*file, HasSubstr(std::string("\x1a\x00", 2)));
  absl::StatusOr<std::vector<CkptTensor>> out = DecodeCkpt(*file);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 3u);
  for (size_t i = 0; i < 3; ++i) ExpectSameTensor((*out)[i], in[i]);
}

TEST(CkptRoundTripTest, WriterEmitsMindSporeWireBytes) {
  const std::string data("\x01\x02\x03\x04\x05\x06\x07\x08", 8);
  StringByteSink sink;
  CkptWriter writer(&sink);
  ASSERT_TRUE(writer.WriteTensor("a.b", DType::kFloat16, {2, 2}, data).ok());
  ASSERT_TRUE(writer.WriteTensor("s", DType::kStr, {0}, "").ok());
  ASSERT_TRUE(writer.Finish().ok());
  const std::string want = Record("a.b", TensorProtoBytes({2, 2}, "Float16", data)) +
                           Record("s", TensorProtoBytes({0}, "str", ""));
  EXPECT_EQ(sink.data(), want);
  EXPECT_EQ(writer.bytes_written(), static_cast<int64_t>(want.size()));
  // Unpacked dims, as MindSpore writes them.
  EXPECT_THAT(sink.data(), HasSubstr(std::string("\x08\x02\x08\x02", 4)));
}

TEST(CkptRoundTripTest, EmptyInputHasNoTensors) {
  absl::StatusOr<std::vector<CkptTensor>> out = DecodeCkpt("");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(out->empty());
  EXPECT_EQ(*EncodeCkpt({}), "");
}

// ---------------------------------------------------------------------------------------------
// Reader: accepted variants and rejected input

TEST(CkptReaderTest, AcceptsPackedDims) {
  const std::string data(24, '\x11');
  const std::string file = Record("p", TensorProtoBytes({2, 3}, "Int32", data, true));
  absl::StatusOr<std::vector<CkptTensor>> out = DecodeCkpt(file);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 1u);
  EXPECT_EQ((*out)[0].dims, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ((*out)[0].data, data);
  // Re-encoding normalizes to MindSpore's unpacked form.
  EXPECT_EQ(*EncodeCkpt(*out), Record("p", TensorProtoBytes({2, 3}, "Int32", data)));
}

TEST(CkptReaderTest, SkipsUnknownFields) {
  // Fields a newer MindSpore might add: varint, fixed64, fixed32 and bytes, in Value and tensor.
  const std::string unknown = VarintField(9, 300) + Varint(10 << 3 | 1) + std::string(8, 'q') +
                              Varint(11 << 3 | 5) + std::string(4, 'r') + LenField(12, "zz");
  const std::string tensor = TensorProtoBytes({2}, "UInt8", "hi") + unknown;
  const std::string file = LenField(1, LenField(1, "u") + unknown + LenField(2, tensor));
  absl::StatusOr<std::vector<CkptTensor>> out = DecodeCkpt(file);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 1u);
  EXPECT_EQ((*out)[0].data, "hi");
}

TEST(CkptReaderTest, RejectsUnknownDtype) {
  const std::string file = Record("w", TensorProtoBytes({1}, "Float8", "x"));
  absl::StatusOr<std::vector<CkptTensor>> out = DecodeCkpt(file);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("Float8"));
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("\"w\""));
}

TEST(CkptReaderTest, MapTensorIsUnimplemented) {
  const std::string map = LenField(1, TensorProtoBytes({1}, "int64", std::string(8, '\0')));
  const std::string file = LenField(1, LenField(1, "embedding.table") + LenField(3, map));
  absl::StatusOr<std::vector<CkptTensor>> out = DecodeCkpt(file);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("embedding.table"));
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("map tensor"));
}

TEST(CkptReaderTest, RejectsMismatchedChunkDims) {
  const std::string file = Record("m", TensorProtoBytes({2, 2}, "UInt8", "ab")) +
                           Record("m", TensorProtoBytes({4, 1}, "UInt8", "cd"));
  absl::StatusOr<std::vector<CkptTensor>> out = DecodeCkpt(file);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("\"m\""));
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("chunk 2"));
}

TEST(CkptReaderTest, RejectsMismatchedChunkDtype) {
  const std::string file = Record("m", TensorProtoBytes({2}, "UInt8", "a")) +
                           Record("m", TensorProtoBytes({2}, "Int8", "b"));
  absl::StatusOr<std::vector<CkptTensor>> out = DecodeCkpt(file);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("Int8"));
}

TEST(CkptReaderTest, RejectsContentSizeMismatch) {
  absl::StatusOr<std::vector<CkptTensor>> short_content =
      DecodeCkpt(Record("w", TensorProtoBytes({4, 16}, "Float32", std::string(255, 'x'))));
  EXPECT_EQ(short_content.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(short_content.status().message()), HasSubstr("\"w\""));
  EXPECT_THAT(std::string(short_content.status().message()), HasSubstr("256"));

  // dims [0] is a scalar: one element, not zero.
  absl::StatusOr<std::vector<CkptTensor>> empty_scalar =
      DecodeCkpt(Record("step", TensorProtoBytes({0}, "Int64", "")));
  EXPECT_EQ(empty_scalar.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(empty_scalar.status().message()), HasSubstr("scalar"));
  absl::StatusOr<std::vector<CkptTensor>> scalar =
      DecodeCkpt(Record("step", TensorProtoBytes({0}, "Int64", std::string(8, '\1'))));
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_EQ((*scalar)[0].shape(), Shape{});

  absl::StatusOr<std::vector<CkptTensor>> odd_str =
      DecodeCkpt(Record("s", TensorProtoBytes({0}, "str", "abcde")));
  EXPECT_EQ(odd_str.status().code(), absl::StatusCode::kInvalidArgument);

  absl::StatusOr<std::vector<CkptTensor>> negative =
      DecodeCkpt(Record("n", TensorProtoBytes({-1, 2}, "UInt8", "")));
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(negative.status().message()), HasSubstr("negative"));
}

TEST(CkptReaderTest, RejectsMissingRequiredFields) {
  const std::string tensor = TensorProtoBytes({1}, "UInt8", "x");
  struct Case {
    std::string file;
    std::string message;
  } cases[] = {
      {LenField(1, LenField(2, tensor)), "no tag"},
      {LenField(1, LenField(1, "t")), "no tensor"},
      {Record("t", VarintField(1, 1) + LenField(3, "x")), "no tensor_type"},
      {Record("t", VarintField(1, 1) + LenField(2, "UInt8")), "no tensor_content"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::vector<CkptTensor>> out = DecodeCkpt(c.file);
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(std::string(out.status().message()), HasSubstr(c.message));
    EXPECT_THAT(std::string(out.status().message()), HasSubstr("offset 0"));
  }
}

TEST(CkptReaderTest, UnexpectedFirstByteMentionsEncryption) {
  absl::StatusOr<std::vector<CkptTensor>> out = DecodeCkpt("\x8d\x12garbage");
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("not a MindSpore checkpoint"));
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("0x8d at offset 0"));
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("encrypted"));
}

TEST(CkptReaderTest, UnexpectedByteAfterRecord) {
  const std::string rec = Record("w", TensorProtoBytes({1}, "UInt8", "x"));
  absl::StatusOr<std::vector<CkptTensor>> out = DecodeCkpt(rec + "\x12");
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(out.status().message()),
              HasSubstr("unexpected byte 0x12 at offset " + std::to_string(rec.size())));
}

TEST(CkptReaderTest, RejectsOverlongVarint) {
  const std::string file = "\x0a" + std::string(10, '\xff') + "\x01";
  absl::StatusOr<std::vector<CkptTensor>> out = DecodeCkpt(file);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("varint"));
}

TEST(CkptReaderTest, RejectsFieldRunningPastItsValue) {
  // The tag claims 5 bytes but the Value holds only 3 after the tag's length.
  const std::string file = LenField(1,
                                    "\x0a\x05"
                                    "abc");
  absl::StatusOr<std::vector<CkptTensor>> out = DecodeCkpt(file);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("remain"));
}

TEST(CkptReaderTest, RejectsAbsurdRank) {
  const std::vector<int64_t> dims(65, 1);
  for (bool packed : {false, true}) {
    absl::StatusOr<std::vector<CkptTensor>> out =
        DecodeCkpt(Record("r", TensorProtoBytes(dims, "UInt8", "x", packed)));
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(out.status().message()), HasSubstr("more than 64 dims"));
  }
  StringByteSink sink;
  CkptWriter writer(&sink);
  EXPECT_EQ(writer.WriteTensor("r", DType::kUInt8, dims, "x").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(writer.WriteTensor("r", DType::kUInt8, std::vector<int64_t>(64, 1), "x").ok());
}

TEST(CkptReaderTest, RejectsLengthAboveMaxValueBytes) {
  const std::string file = "\x0a" + Varint(1000) + std::string(1000, '\0');
  absl::StatusOr<std::vector<CkptTensor>> out = DecodeCkpt(file, {.max_value_bytes = 999});
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("max_value_bytes"));
}

TEST(CkptReaderTest, HugeClaimedLengthInTinyInputFailsWithoutLargeAllocation) {
  constexpr uint64_t kClaim = uint64_t{1} << 30;  // 1 GiB, under the 2 GiB default limit
  // Consistent lengths at every level; only the stream is short. First a tensor_content claiming
  // 1 GiB, then a tag claiming 1 GiB.
  const std::string content_head =
      VarintField(1, 4) + LenField(2, "Float32") + "\x1a" + Varint(kClaim);
  const uint64_t tensor_len = content_head.size() + kClaim;
  const std::string value_head = LenField(1, "w") + "\x12" + Varint(tensor_len) + content_head;
  const uint64_t value_len = value_head.size() - content_head.size() + tensor_len;
  const std::string tag_head = "\x0a" + Varint(kClaim);
  const std::string files[] = {
      "\x0a" + Varint(value_len) + value_head + "only a few bytes",
      "\x0a" + Varint(tag_head.size() + kClaim) + tag_head + "tag bytes",
  };
  for (const std::string& file : files) {
    const size_t heap_before = HeapBytesInUse();
    CountingSource source(file);
    CkptReader reader(&source);
    absl::StatusOr<std::optional<CkptTensor>> out = reader.NextValue();
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(out.status().message()), HasSubstr("truncated"));
    EXPECT_LE(source.max_request(), size_t{4} << 20) << "reader asked for the claimed size";
    EXPECT_LT(source.max_heap(), heap_before + (size_t{64} << 20))
        << "reader allocated the claimed size";
  }
}

// Delivers at most `max_read` bytes per call, as sockets and pipes do.
class ShortReadSource : public ByteSource {
 public:
  ShortReadSource(std::string_view data, size_t max_read) : inner_(data), max_read_(max_read) {}
  absl::StatusOr<size_t> Read(char* buf, size_t n) override {
    return inner_.Read(buf, std::min(n, max_read_));
  }
  std::string Describe() const override { return "<short reads>"; }

 private:
  MemoryByteSource inner_;
  size_t max_read_;
};

TEST(CkptReaderTest, LargeValuesThroughShortReads) {
  // Over 4 MiB so that the payload buffer grows in several steps, with a CRC trailer.
  std::mt19937_64 rng(11);
  const std::vector<CkptTensor> tensors = {
      MakeTensor("big", DType::kUInt8, {(9 << 20) + 3}, RandomBytes(rng, (9 << 20) + 3)),
      MakeTensor("small", DType::kInt16, {3}, RandomBytes(rng, 6)),
  };
  absl::StatusOr<std::string> file = EncodeCkpt(tensors, {.crc_trailer = true});
  ASSERT_TRUE(file.ok()) << file.status();
  for (size_t max_read : {size_t{1} << 20, size_t{65537}, size_t{4093}}) {
    ShortReadSource source(*file, max_read);
    CkptReader reader(&source);
    for (const CkptTensor& want : tensors) {
      absl::StatusOr<std::optional<CkptTensor>> got = reader.NextTensor();
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_TRUE(got->has_value());
      EXPECT_EQ((*got)->name, want.name);
      EXPECT_TRUE((*got)->data == want.data) << want.name << " max_read " << max_read;
    }
    absl::StatusOr<std::optional<CkptTensor>> end = reader.NextTensor();
    ASSERT_TRUE(end.ok()) << end.status();
    EXPECT_FALSE(end->has_value());
    EXPECT_TRUE(reader.had_crc_trailer());
  }
}

TEST(CkptReaderTest, NextValueAfterNextTensorReturnsTheLookahead) {
  const std::string file = Record("a", TensorProtoBytes({1}, "UInt8", "1")) +
                           Record("b", TensorProtoBytes({2}, "UInt8", "2")) +
                           Record("b", TensorProtoBytes({2}, "UInt8", "3"));
  MemoryByteSource source(file);
  CkptReader reader(&source);
  absl::StatusOr<std::optional<CkptTensor>> a = reader.NextTensor();
  ASSERT_TRUE(a.ok() && a->has_value());
  EXPECT_EQ((*a)->name, "a");
  // The first chunk of "b" was read ahead; NextValue must not lose it.
  absl::StatusOr<std::optional<CkptTensor>> b1 = reader.NextValue();
  ASSERT_TRUE(b1.ok() && b1->has_value());
  EXPECT_EQ((*b1)->data, "2");
  absl::StatusOr<std::optional<CkptTensor>> b2 = reader.NextValue();
  ASSERT_TRUE(b2.ok() && b2->has_value());
  EXPECT_EQ((*b2)->data, "3");
}

TEST(CkptReaderTest, ErrorsAreSticky) {
  const std::string good = Record("a", TensorProtoBytes({1}, "UInt8", "x"));
  const std::string file = good + "\x07" + good;
  MemoryByteSource source(file);
  CkptReader reader(&source);
  ASSERT_TRUE(reader.NextValue().ok());
  // NextTensor looks ahead for more chunks of "a", so the bad byte fails this call: a tensor is
  // returned only once it is known to be complete.
  absl::Status first = reader.NextTensor().status();
  EXPECT_EQ(first.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(first.message()), HasSubstr("0x07"));
  EXPECT_EQ(reader.NextTensor().status(), first);
  EXPECT_EQ(reader.NextValue().status(), first);
}

// ---------------------------------------------------------------------------------------------
// Chunking (tensors larger than SLICE_SIZE span several Values)

TEST(CkptChunkingTest, SmallSliceSplitsIntoRepeatedHeaderChunks) {
  std::mt19937_64 rng(3);
  const CkptTensor big = MakeTensor("layer.weight", DType::kFloat32, {4, 7}, RandomBytes(rng, 112));
  const CkptTensor tail = MakeTensor("layer.bias", DType::kFloat32, {2}, RandomBytes(rng, 8));
  absl::StatusOr<std::string> file = EncodeCkpt({big, tail}, {.slice_bytes = 10});
  ASSERT_TRUE(file.ok()) << file.status();

  // NextValue returns the chunks separately: 11 × 10 bytes + 2 bytes, then the bias.
  MemoryByteSource source(*file);
  CkptReader reader(&source);
  std::string joined;
  for (int i = 0; i < 12; ++i) {
    absl::StatusOr<std::optional<CkptTensor>> v = reader.NextValue();
    ASSERT_TRUE(v.ok()) << v.status();
    ASSERT_TRUE(v->has_value());
    EXPECT_EQ((*v)->name, big.name);
    EXPECT_EQ((*v)->dims, big.dims);  // full dims in every chunk
    EXPECT_EQ((*v)->dtype, DType::kFloat32);
    EXPECT_EQ((*v)->data.size(), i < 11 ? 10u : 2u);
    joined += (*v)->data;
  }
  EXPECT_EQ(joined, big.data);
  absl::StatusOr<std::optional<CkptTensor>> bias = reader.NextValue();
  ASSERT_TRUE(bias.ok() && bias->has_value());
  ExpectSameTensor(**bias, tail);
  absl::StatusOr<std::optional<CkptTensor>> end = reader.NextValue();
  ASSERT_TRUE(end.ok());
  EXPECT_FALSE(end->has_value());

  // NextTensor joins them back.
  absl::StatusOr<std::vector<CkptTensor>> out = DecodeCkpt(*file);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 2u);
  ExpectSameTensor((*out)[0], big);
  ExpectSameTensor((*out)[1], tail);
}

TEST(CkptChunkingTest, ExactMultipleOfSliceHasNoEmptyChunk) {
  const CkptTensor t = MakeTensor("t", DType::kUInt8, {20}, std::string(20, 'z'));
  absl::StatusOr<std::string> file = EncodeCkpt({t}, {.slice_bytes = 10});
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(RecordBoundaries(*file).size(), 3u);  // two records
}

TEST(CkptChunkingTest, StreamingAppendInOddPiecesMatchesWholeWrite) {
  std::mt19937_64 rng(5);
  const std::string data = RandomBytes(rng, 2 * 3 * 17 * 2);  // Float16 [2,3,17]
  const std::vector<int64_t> dims = {2, 3, 17};
  const CkptWriterOptions options = {.crc_trailer = true, .slice_bytes = 10};

  StringByteSink whole_sink;
  CkptWriter whole(&whole_sink, options);
  ASSERT_TRUE(whole.WriteTensor("x", DType::kFloat16, dims, data).ok());
  ASSERT_TRUE(whole.Finish().ok());

  for (size_t piece : {size_t{1}, size_t{3}, size_t{7}, size_t{11}, size_t{29}}) {
    StringByteSink sink;
    CkptWriter writer(&sink, options);
    ASSERT_TRUE(writer.BeginTensor("x", DType::kFloat16, dims, data.size()).ok());
    for (size_t pos = 0; pos < data.size(); pos += piece) {
      ASSERT_TRUE(writer.Append(std::string_view(data).substr(pos, piece)).ok());
    }
    ASSERT_TRUE(writer.Finish().ok());
    EXPECT_EQ(sink.data(), whole_sink.data()) << "piece size " << piece;
  }
  absl::StatusOr<std::vector<CkptTensor>> out = DecodeCkpt(whole_sink.data());
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 1u);
  EXPECT_EQ((*out)[0].data, data);
}

TEST(CkptChunkingTest, ConsecutiveOnlyJoining) {
  // Same tag, but not consecutive: two separate tensors, as MindSpore's reader sees them.
  const std::string file = Record("a", TensorProtoBytes({1}, "UInt8", "1")) +
                           Record("b", TensorProtoBytes({1}, "UInt8", "2")) +
                           Record("a", TensorProtoBytes({1}, "UInt8", "3"));
  absl::StatusOr<std::vector<CkptTensor>> out = DecodeCkpt(file);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 3u);
  EXPECT_EQ((*out)[2].data, "3");
}

TEST(CkptWriterTest, RejectsMisuse) {
  StringByteSink sink;
  CkptWriter writer(&sink);
  // Size must match dims × dtype.
  EXPECT_EQ(writer.BeginTensor("w", DType::kFloat32, {2, 2}, 15).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(writer.WriteTensor("s", DType::kStr, {0}, "abc").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(writer.WriteTensor("i4", DType::kInt4, {3}, "ab").code(),
            absl::StatusCode::kInvalidArgument);
  // dims [0] reads back as a scalar, so an empty [0] tensor could not be read back.
  EXPECT_EQ(writer.WriteTensor("z", DType::kInt32, {0}, "").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(writer.WriteTensor("neg", DType::kInt32, {-1}, "").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(writer.Append("x").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(writer.bytes_written(), 0);

  ASSERT_TRUE(writer.BeginTensor("w", DType::kFloat32, {2}, 8).ok());
  EXPECT_EQ(writer.BeginTensor("v", DType::kFloat32, {2}, 8).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(writer.Append("123456789").code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(writer.Append("1234").ok());
  absl::Status open = writer.Finish();
  EXPECT_EQ(open.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(open.message()), HasSubstr("\"w\""));
  ASSERT_TRUE(writer.Append("5678").ok());
  ASSERT_TRUE(writer.Finish().ok());
  EXPECT_EQ(writer.Finish().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(writer.WriteTensor("late", DType::kUInt8, {1}, "x").code(),
            absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<std::vector<CkptTensor>> out = DecodeCkpt(sink.data());
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 1u);
  EXPECT_EQ((*out)[0].data, "12345678");
}

// A sink that fails after `budget` bytes, like a full disk.
class FailingSink : public ByteSink {
 public:
  explicit FailingSink(size_t budget) : budget_(budget) {}
  absl::Status Write(std::string_view bytes) override {
    if (bytes.size() > budget_) return absl::ResourceExhaustedError("disk full");
    budget_ -= bytes.size();
    return absl::OkStatus();
  }

 private:
  size_t budget_;
};

TEST(CkptWriterTest, SinkErrorsAreSticky) {
  FailingSink sink(40);
  CkptWriter writer(&sink, {.slice_bytes = 16});
  absl::Status s = writer.WriteTensor("w", DType::kUInt8, {64}, std::string(64, 'a'));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(writer.Append("x").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(writer.Finish().code(), absl::StatusCode::kResourceExhausted);
}

// ---------------------------------------------------------------------------------------------
// CRC trailer (crc_num)

TEST(CkptCrcTest, TrailerWrittenDetectedAndVerified) {
  absl::StatusOr<std::string> plain = EncodeCkpt(SampleTensors(), {.slice_bytes = 8});
  absl::StatusOr<std::string> file =
      EncodeCkpt(SampleTensors(), {.crc_trailer = true, .slice_bytes = 8});
  ASSERT_TRUE(plain.ok() && file.ok());
  ASSERT_EQ(file->size(), plain->size() + 17);
  EXPECT_EQ(file->substr(0, plain->size()), *plain);
  const uint32_t crc = ReferenceCrc32(*plain);
  std::string want_trailer = "crc_num" + std::string(6, '\0');
  for (int shift = 24; shift >= 0; shift -= 8)
    want_trailer.push_back(static_cast<char>(crc >> shift));
  EXPECT_EQ(file->substr(plain->size()), want_trailer);

  MemoryByteSource source(*file);
  CkptReader reader(&source);
  size_t count = 0;
  for (;;) {
    absl::StatusOr<std::optional<CkptTensor>> t = reader.NextTensor();
    ASSERT_TRUE(t.ok()) << t.status();
    if (!t->has_value()) break;
    ExpectSameTensor(**t, SampleTensors()[count++]);
  }
  EXPECT_EQ(count, SampleTensors().size());
  EXPECT_TRUE(reader.had_crc_trailer());
  EXPECT_EQ(reader.offset(), static_cast<int64_t>(file->size()));

  MemoryByteSource plain_source(*plain);
  CkptReader plain_reader(&plain_source);
  while (plain_reader.NextValue().value().has_value()) {
  }
  EXPECT_FALSE(plain_reader.had_crc_trailer());
}

TEST(CkptCrcTest, FlippedByteIsDataLoss) {
  absl::StatusOr<std::string> file = EncodeCkpt(SampleTensors(), {.crc_trailer = true});
  ASSERT_TRUE(file.ok());
  const std::vector<size_t> bounds = RecordBoundaries(*file);
  // A content byte of the first tensor (the last bytes of its record), and the CRC's last byte.
  for (size_t pos : {bounds[1] - 3, file->size() - 1, file->size() - 10}) {
    std::string bad = *file;
    bad[pos] ^= 0x20;
    absl::StatusOr<std::vector<CkptTensor>> out = DecodeCkpt(bad);
    EXPECT_EQ(out.status().code(), absl::StatusCode::kDataLoss) << "flip at " << pos;
    EXPECT_THAT(std::string(out.status().message()), HasSubstr("CRC mismatch"));
    // Not verifying: the same bytes decode (the flip did not touch the framing).
    EXPECT_TRUE(DecodeCkpt(bad, {.verify_crc = false}).ok()) << "flip at " << pos;
  }
}

// The reader skips the CRC when the source shows up front that there is no trailer. A source
// that cannot show its end (a pipe) is still verified; one that showed no trailer but then
// delivers one changed while being read.
class TailSource : public ByteSource {
 public:
  TailSource(std::string_view data, std::optional<std::string> tail)
      : inner_(data), tail_(std::move(tail)) {}
  absl::StatusOr<size_t> Read(char* buf, size_t n) override { return inner_.Read(buf, n); }
  std::string Describe() const override { return "<tail>"; }
  std::optional<std::string> Tail(size_t n) override {
    if (!tail_) return std::nullopt;
    return tail_->substr(tail_->size() - std::min(n, tail_->size()));
  }

 private:
  MemoryByteSource inner_;
  std::optional<std::string> tail_;
};

TEST(CkptCrcTest, TrailerDecisionFollowsTheSourcesEnd) {
  absl::StatusOr<std::string> file = EncodeCkpt(SampleTensors(), {.crc_trailer = true});
  ASSERT_TRUE(file.ok());
  std::string bad = *file;
  bad[bad.size() - 1] ^= 0x01;  // the stored CRC no longer matches
  auto read_all = [](ByteSource* source) -> absl::Status {
    CkptReader reader(source);
    while (true) {
      absl::StatusOr<std::optional<CkptTensor>> t = reader.NextTensor();
      if (!t.ok()) return t.status();
      if (!*t) return absl::OkStatus();
    }
  };
  // No tail available: verified as before.
  TailSource pipe(bad, std::nullopt);
  absl::Status s = read_all(&pipe);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("CRC mismatch"));
  // The tail shows the trailer: verified.
  TailSource file_like(bad, bad);
  s = read_all(&file_like);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("CRC mismatch"));
  // The tail showed a plain ending, yet a trailer arrives: the file changed under the reader.
  TailSource changed(bad, std::string(64, 'x'));
  s = read_all(&changed);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("changed while being read"));
  // A plain file whose tail shows it: decodes (nothing to verify).
  absl::StatusOr<std::string> plain = EncodeCkpt(SampleTensors(), {});
  ASSERT_TRUE(plain.ok());
  TailSource plain_source(*plain, *plain);
  EXPECT_TRUE(read_all(&plain_source).ok());
}

TEST(CkptCrcTest, MalformedTrailerIsRejected) {
  absl::StatusOr<std::string> file = EncodeCkpt(SampleTensors(), {.crc_trailer = true});
  ASSERT_TRUE(file.ok());
  for (const std::string& bad : {*file + "x", file->substr(0, file->size() - 1),
                                 file->substr(0, file->size() - 17) + "crc_nu"}) {
    absl::StatusOr<std::vector<CkptTensor>> out = DecodeCkpt(bad);
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << out.status();
  }
}

// ---------------------------------------------------------------------------------------------
// Robustness

TEST(CkptRobustnessTest, TruncationAtEveryOffset) {
  StringByteSink sink;
  CkptWriter writer(&sink, {.crc_trailer = true, .slice_bytes = 8});
  std::vector<size_t> tensor_ends = {0};
  for (const CkptTensor& t : SampleTensors()) {
    ASSERT_TRUE(writer.WriteTensor(t.name, t.dtype, t.dims, t.data).ok());
    tensor_ends.push_back(static_cast<size_t>(writer.bytes_written()));
  }
  ASSERT_TRUE(writer.Finish().ok());
  const std::string& file = sink.data();
  const std::vector<size_t> record_ends = RecordBoundaries(file);
  ASSERT_GT(record_ends.size(), tensor_ends.size());  // some tensor is chunked

  for (size_t len = 0; len <= file.size(); ++len) {
    const std::string_view prefix = std::string_view(file).substr(0, len);
    const bool at_tensor_end =
        std::find(tensor_ends.begin(), tensor_ends.end(), len) != tensor_ends.end();
    const bool at_record_end =
        std::find(record_ends.begin(), record_ends.end(), len) != record_ends.end();

    // Whole tensors: valid exactly at tensor boundaries (a shorter file) or the full file.
    absl::StatusOr<std::vector<CkptTensor>> tensors = DecodeCkpt(prefix);
    if (at_tensor_end || len == file.size()) {
      ASSERT_TRUE(tensors.ok()) << "length " << len << ": " << tensors.status();
      const size_t n =
          len == file.size()
              ? SampleTensors().size()
              : static_cast<size_t>(std::find(tensor_ends.begin(), tensor_ends.end(), len) -
                                    tensor_ends.begin());
      ASSERT_EQ(tensors->size(), n) << "length " << len;
      for (size_t i = 0; i < n; ++i) ExpectSameTensor((*tensors)[i], SampleTensors()[i]);
    } else {
      EXPECT_EQ(tensors.status().code(), absl::StatusCode::kInvalidArgument)
          << "length " << len << ": " << tensors.status();
    }

    // Raw Values: valid exactly at record boundaries.
    MemoryByteSource source(prefix);
    CkptReader reader(&source);
    absl::Status status;
    for (;;) {
      absl::StatusOr<std::optional<CkptTensor>> v = reader.NextValue();
      if (!v.ok()) {
        status = v.status();
        break;
      }
      if (!v->has_value()) break;
    }
    EXPECT_EQ(status.ok(), at_record_end || len == file.size())
        << "length " << len << ": " << status;
  }
}

TEST(CkptRobustnessTest, RandomByteFlipsNeverCrash) {
  uint64_t seed = std::random_device{}();
  if (const char* env = std::getenv("CKPT_FUZZ_SEED")) seed = std::strtoull(env, nullptr, 10);
  std::cout << "RandomByteFlipsNeverCrash seed=" << seed << " (set CKPT_FUZZ_SEED to replay)\n";
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937_64 rng(seed);

  absl::StatusOr<std::string> plain = EncodeCkpt(SampleTensors(), {.slice_bytes = 8});
  absl::StatusOr<std::string> with_crc =
      EncodeCkpt(SampleTensors(), {.crc_trailer = true, .slice_bytes = 8});
  ASSERT_TRUE(plain.ok() && with_crc.ok());

  int rejected = 0;
  for (int i = 0; i < 3000; ++i) {
    const bool crc = i % 2 == 1;
    std::string bytes = crc ? *with_crc : *plain;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < flips; ++k) {
      bytes[rng() % bytes.size()] ^= static_cast<char>(1 + rng() % 255);
    }
    absl::StatusOr<std::vector<CkptTensor>> out = DecodeCkpt(bytes);
    if (!out.ok()) {
      ++rejected;
      EXPECT_NE(out.status().message(), "") << "case " << i;
    } else if (crc && flips == 1) {
      // CRC32 detects every single-byte change; a changed framing cannot consume the trailer.
      ADD_FAILURE() << "case " << i << ": a single flipped byte passed the CRC check";
    }
    // The Value-level path must be just as safe.
    MemoryByteSource source(bytes);
    CkptReader reader(&source, {.verify_crc = false});
    for (int guard = 0; guard < 1000; ++guard) {
      absl::StatusOr<std::optional<CkptTensor>> v = reader.NextValue();
      if (!v.ok() || !v->has_value()) break;
    }
  }
  EXPECT_GT(rejected, 1000);  // most flips must be noticed
}

// ---------------------------------------------------------------------------------------------
// Real MindSpore files (the fixtures), read in place.

TEST(CkptFixtureTest, GoldenRouterDecodesAndReencodesIdentically) {
  CKPT_REQUIRE_FIXTURE(bytes, "golden_router.ckpt");
  ASSERT_EQ(bytes.size(), 293u);
  absl::StatusOr<std::vector<CkptTensor>> out = DecodeCkpt(bytes);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 1u);
  const CkptTensor& t = (*out)[0];
  EXPECT_EQ(t.name, "gating.weight");
  EXPECT_EQ(t.dtype, DType::kFloat32);
  EXPECT_EQ(t.dims, (std::vector<int64_t>{4, 16}));
  EXPECT_EQ(t.data.size(), 4u * 16u * 4u);
  absl::StatusOr<std::string> again = EncodeCkpt(*out);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(*again == bytes) << "re-encoding is not byte-identical";
}

TEST(CkptFixtureTest, GoldenSequentialMlpDecodesAndReencodesIdentically) {
  CKPT_REQUIRE_FIXTURE(bytes, "golden_sequential_mlp.ckpt");
  absl::StatusOr<std::vector<CkptTensor>> out = DecodeCkpt(bytes);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 12u);
  size_t i = 0;
  for (int layer = 0; layer < 4; ++layer) {
    for (int w = 1; w <= 3; ++w, ++i) {
      const CkptTensor& t = (*out)[i];
      EXPECT_EQ(t.name, std::to_string(layer) + ".w" + std::to_string(w) + ".weight");
      EXPECT_EQ(t.dtype, DType::kFloat32);
      EXPECT_EQ(t.dims, w == 2 ? (std::vector<int64_t>{4, 16}) : (std::vector<int64_t>{16, 4}))
          << t.name;
      EXPECT_EQ(t.data.size(), 256u);
    }
  }
  absl::StatusOr<std::string> again = EncodeCkpt(*out);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(*again == bytes) << "re-encoding is not byte-identical";
}

TEST(CkptFixtureTest, Utf8MangledCopyIsRejected) {
  CKPT_REQUIRE_FIXTURE(bytes, "golden_router_CORRUPT_utf8mangled.ckpt");
  absl::StatusOr<std::vector<CkptTensor>> out = DecodeCkpt(bytes);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << out.status();
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("offset"));
}

}  // namespace
}  // namespace ckpt
