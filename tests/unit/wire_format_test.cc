// The hand-written wire format of Fetch data messages and upload data messages, checked against
// protobuf's own parser and serialiser for every layout of the bytes over gRPC slices.
#include "service/rpc/wire_format.h"

#include <grpcpp/impl/codegen/proto_utils.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckpt.pb.h"
#include "core/checksum.h"
#include "gtest/gtest.h"
#include "tests/testing/byte_buffers.h"

namespace ckpt {
namespace {

// `buffer` parsed by protobuf (grpc's own path for generated stubs).
template <typename Message>
Message Parse(grpc::ByteBuffer buffer) {
  Message m;
  EXPECT_TRUE(grpc::SerializationTraits<Message>::Deserialize(&buffer, &m).ok());
  return m;
}

std::string Bytes(size_t n, char seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed + i * 7);
  return s;
}

// A data piece whose segments are `parts` of one owned buffer.
FetchPiece DataPiece(const std::vector<std::string>& parts, std::shared_ptr<std::string>* owner) {
  std::string all;
  for (const std::string& p : parts) all += p;
  *owner = std::make_shared<std::string>(all);
  FetchPiece piece;
  size_t offset = 0;
  for (const std::string& p : parts) {
    piece.segments.push_back(
        {*owner, std::string_view(**owner).substr(offset, p.size()), {}, nullptr});
    offset += p.size();
  }
  piece.data_bytes = static_cast<int64_t>(all.size());
  return piece;
}

TEST(WireFormatTest, FetchMessagesWithoutDataAreProtobufs) {
  FetchPiece piece;
  piece.message.mutable_summary()->set_tensor_count(3);
  piece.message.mutable_summary()->add_warnings("w");
  const v1::FetchResponse got = Parse<v1::FetchResponse>(EncodeFetchResponse(piece));
  EXPECT_EQ(got.SerializeAsString(), piece.message.SerializeAsString());
}

TEST(WireFormatTest, FetchDataOfPartsAndTilesParsesAsProtobuf) {
  // Sizes around varint boundaries of the lengths (127/128, 16383/16384) and a large message.
  for (const std::vector<size_t>& sizes : std::vector<std::vector<size_t>>{
           {0}, {1}, {127}, {60, 68}, {16383}, {8192, 8192}, {100, 1 << 20, 5}, {3, 5, 7, 9}}) {
    std::vector<std::string> parts;
    std::string all;
    for (size_t n : sizes) {
      parts.push_back(Bytes(n, static_cast<char>(parts.size())));
      all += parts.back();
    }
    for (int mode : {0, 1, 2}) {  // one part, a part per segment, a tile per segment
      SCOPED_TRACE(::testing::Message() << all.size() << " bytes, mode " << mode);
      std::shared_ptr<std::string> owner;
      FetchPiece piece = DataPiece(parts, &owner);
      if (mode == 0) {
        piece.parts.push_back({static_cast<int64_t>(all.size()), Checksum(all)});
      } else {
        for (const std::string& p : parts) {
          piece.parts.push_back({static_cast<int64_t>(p.size()), Checksum(p)});
        }
      }
      if (mode == 2) {  // made-up boxes, with values around the varint boundaries
        for (size_t i = 0; i < parts.size(); ++i) {
          for (int64_t v : {int64_t{0}, int64_t{127}, int64_t{128}, int64_t{1} << 40}) {
            piece.tile_box.push_back(v + static_cast<int64_t>(i));
          }
        }
        piece.band_rows = 300;
      }
      const std::vector<ChecksumPart> expected_parts = piece.parts;
      const std::vector<int64_t> expected_tiles = piece.tile_box;
      {
        const v1::FetchResponse got = Parse<v1::FetchResponse>(EncodeFetchResponse(piece));
        ASSERT_TRUE(got.has_data());
        EXPECT_EQ(std::vector<int64_t>(got.data().tile_box().begin(), got.data().tile_box().end()),
                  expected_tiles);
        EXPECT_EQ(got.data().band_rows(), mode == 2 ? 300 : 0);
        EXPECT_TRUE(got.data().data() == all);
        ASSERT_EQ(got.data().part_bytes_size(), static_cast<int>(expected_parts.size()));
        ASSERT_EQ(got.data().part_checksums_size(), static_cast<int>(expected_parts.size()));
        for (size_t i = 0; i < expected_parts.size(); ++i) {
          EXPECT_EQ(got.data().part_bytes(static_cast<int>(i)),
                    static_cast<uint64_t>(expected_parts[i].bytes));
          EXPECT_EQ(got.data().part_checksums(static_cast<int>(i)), expected_parts[i].checksum);
        }
      }
      piece = FetchPiece();
      EXPECT_EQ(owner.use_count(), 1) << "the encoded message still holds the segments";
    }
  }
}

// A batch's headers, data and parts, sized around the varint boundaries of the lengths, parse
// as the FetchTensorBatch they stand for; a batch of zero-byte tensors is a plain protobuf.
TEST(WireFormatTest, FetchBatchesParseAsProtobuf) {
  for (const std::vector<size_t>& sizes : std::vector<std::vector<size_t>>{
           {0}, {1}, {127}, {60, 68}, {16383, 1}, {100, 1 << 20, 5}, {3, 0, 7, 9}}) {
    std::vector<std::string> parts;
    std::string all;
    for (size_t n : sizes) {
      parts.push_back(Bytes(n, static_cast<char>(parts.size())));
      all += parts.back();
    }
    SCOPED_TRACE(::testing::Message() << all.size() << " bytes");
    std::shared_ptr<std::string> owner;
    FetchPiece piece = DataPiece(parts, &owner);
    std::erase_if(piece.segments, [](const DataSegment& s) { return s.bytes.empty(); });
    v1::FetchTensorBatch* batch = piece.message.mutable_batch();
    for (size_t i = 0; i < parts.size(); ++i) {
      v1::FetchTensorHeader* h = batch->add_tensors();
      h->set_name(std::string(200, static_cast<char>('a' + i)));  // headers of > 127 bytes
      h->set_dtype("Int8");
      h->add_local_shape(static_cast<int64_t>(parts[i].size()));
      h->set_total_bytes(static_cast<int64_t>(parts[i].size()));
      if (!parts[i].empty()) {
        piece.parts.push_back({static_cast<int64_t>(parts[i].size()), Checksum(parts[i])});
      }
    }
    v1::FetchResponse expected;
    *expected.mutable_batch() = *batch;
    expected.mutable_batch()->set_data(all);
    for (const ChecksumPart& p : piece.parts) {
      expected.mutable_batch()->add_part_bytes(static_cast<uint64_t>(p.bytes));
      expected.mutable_batch()->add_part_checksums(p.checksum);
    }
    const v1::FetchResponse got = Parse<v1::FetchResponse>(EncodeFetchResponse(std::move(piece)));
    EXPECT_EQ(got.SerializeAsString(), expected.SerializeAsString());
    EXPECT_EQ(owner.use_count(), 1) << "the encoded message still holds the segments";
  }
}

// AppendBatchTensorHeader writes what protobuf writes for FetchTensorBatch{tensors: [header]},
// byte for byte: scalars, empty and long names, zero sizes, large values, verbatim values.
TEST(WireFormatTest, BatchTensorHeadersAsProtobufWritesThem) {
  struct Case {
    std::string name, dtype;
    std::vector<int64_t> lo, hi, global;
    int64_t total_bytes;
    bool verbatim;
  };
  const std::vector<Case> cases = {{"w", "Float32", {0, 0}, {4, 8}, {24, 8}, 128, false},
                                   {"", "Int8", {}, {}, {}, 1, false},  // a scalar, no name
                                   {std::string(300, 'x'), "BFloat16", {5}, {5}, {10}, 0, true},
                                   {"big",
                                    "Float64",
                                    {int64_t{1} << 40, 127},
                                    {(int64_t{1} << 40) + 3, 128},
                                    {int64_t{1} << 41, 128},
                                    int64_t{3} << 33,
                                    false},
                                   {"str", "str", {0}, {16384}, {16384}, 65536, true}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name.substr(0, 8));
    v1::FetchTensorBatch batch;
    v1::FetchTensorHeader* h = batch.add_tensors();
    h->set_name(c.name);
    h->set_dtype(c.dtype);
    for (size_t i = 0; i < c.lo.size(); ++i) h->add_local_shape(c.hi[i] - c.lo[i]);
    for (int64_t d : c.global) h->add_global_shape(d);
    for (int64_t v : c.lo) h->add_box_lo(v);
    for (int64_t v : c.hi) h->add_box_hi(v);
    h->set_total_bytes(c.total_bytes);
    h->set_verbatim(c.verbatim);
    Box box;
    box.lo = c.lo;
    box.hi = c.hi;
    std::string got = "prefix";
    AppendBatchTensorHeader(c.name, c.dtype, box, c.global, c.total_bytes, c.verbatim, &got);
    EXPECT_EQ(got, "prefix" + batch.SerializeAsString());
  }
}

// A batch whose headers come serialised (FetchPiece::batch_headers, as FetchStream writes them)
// encodes as the same FetchResponse as one whose headers are messages.
TEST(WireFormatTest, FetchBatchWithSerialisedHeaders) {
  const std::vector<std::string> parts = {Bytes(100, 'a'), Bytes(3000, 'b')};
  std::shared_ptr<std::string> owner;
  FetchPiece piece = DataPiece(parts, &owner);
  piece.message.mutable_batch();
  v1::FetchResponse expected;
  std::string all;
  for (size_t i = 0; i < parts.size(); ++i) {
    Box box;
    box.lo = {0};
    box.hi = {static_cast<int64_t>(parts[i].size())};
    const std::vector<int64_t> global = {static_cast<int64_t>(parts[i].size())};
    const std::string name = absl::StrCat("t", i);
    AppendBatchTensorHeader(name, "Int8", box, global, box.hi[0], false, &piece.batch_headers);
    v1::FetchTensorHeader* h = expected.mutable_batch()->add_tensors();
    h->set_name(name);
    h->set_dtype("Int8");
    h->add_local_shape(box.hi[0]);
    h->add_global_shape(box.hi[0]);
    h->add_box_lo(0);
    h->add_box_hi(box.hi[0]);
    h->set_total_bytes(box.hi[0]);
    all += parts[i];
  }
  piece.parts.push_back({static_cast<int64_t>(all.size()), Checksum(all)});
  expected.mutable_batch()->set_data(all);
  expected.mutable_batch()->add_part_bytes(all.size());
  expected.mutable_batch()->add_part_checksums(Checksum(all));
  const v1::FetchResponse got = Parse<v1::FetchResponse>(EncodeFetchResponse(std::move(piece)));
  EXPECT_EQ(got.SerializeAsString(), expected.SerializeAsString());
}

// A batch of empty tensors only (no data, no parts) still carries its serialised headers.
TEST(WireFormatTest, FetchBatchOfEmptyTensorsKeepsItsHeaders) {
  FetchPiece piece;
  piece.message.mutable_batch();
  Box box;
  box.lo = {0, 0};
  box.hi = {3, 0};
  const std::vector<int64_t> global = {3, 0};
  AppendBatchTensorHeader("empty", "Float32", box, global, 0, false, &piece.batch_headers);
  v1::FetchResponse expected;
  v1::FetchTensorHeader* h = expected.mutable_batch()->add_tensors();
  h->set_name("empty");
  h->set_dtype("Float32");
  h->add_local_shape(3);
  h->add_local_shape(0);
  h->add_global_shape(3);
  h->add_global_shape(0);
  h->add_box_lo(0);
  h->add_box_lo(0);
  h->add_box_hi(3);
  h->add_box_hi(0);
  const v1::FetchResponse got = Parse<v1::FetchResponse>(EncodeFetchResponse(std::move(piece)));
  ASSERT_EQ(got.batch().tensors_size(), 1);
  EXPECT_EQ(got.SerializeAsString(), expected.SerializeAsString());
}

// Batches whose copied bytes fill blocks of a batch's size (the reused ones): many encoded
// messages alive at once each keep their own bytes, whichever blocks earlier messages gave back,
// and messages with a large segment between runs of small ones cut one block into several slices.
TEST(WireFormatTest, ManyLargeBatchesAliveAtOnceKeepTheirOwnBytes) {
  for (int round = 0; round < 3; ++round) {
    std::vector<grpc::ByteBuffer> encoded;
    std::vector<v1::FetchResponse> expected;
    std::vector<std::shared_ptr<std::string>> owners;
    for (int m = 0; m < 12; ++m) {
      SCOPED_TRACE(::testing::Message() << "round " << round << ", message " << m);
      std::vector<std::string> parts;
      for (int i = 0; i < 300 + 37 * m; ++i) {
        parts.push_back(Bytes(1000 + static_cast<size_t>(i % 7), static_cast<char>(m * 31 + i)));
      }
      if (m % 3 == 1) parts.insert(parts.begin() + 100, Bytes(70000, static_cast<char>(m)));
      std::shared_ptr<std::string> owner;
      FetchPiece piece = DataPiece(parts, &owner);
      owners.push_back(owner);
      v1::FetchTensorBatch* batch = piece.message.mutable_batch();
      v1::FetchResponse want;
      std::string all;
      for (const std::string& p : parts) {
        v1::FetchTensorHeader* h = want.mutable_batch()->add_tensors();
        h->set_name(absl::StrCat("m", m, ".", all.size()));
        h->set_total_bytes(static_cast<int64_t>(p.size()));
        all += p;
      }
      *batch = want.batch();
      piece.parts.push_back({static_cast<int64_t>(all.size()), Checksum(all)});
      want.mutable_batch()->set_data(all);
      want.mutable_batch()->add_part_bytes(all.size());
      want.mutable_batch()->add_part_checksums(Checksum(all));
      expected.push_back(std::move(want));
      encoded.push_back(EncodeFetchResponse(std::move(piece)));
    }
    // Copied bytes must not depend on the segments' memory (a referenced segment's must).
    for (size_t m = 0; m < owners.size(); ++m) {
      if (m % 3 != 1) std::fill(owners[m]->begin(), owners[m]->end(), '\0');
      owners[m].reset();
    }
    for (size_t m = 0; m < encoded.size(); ++m) {
      SCOPED_TRACE(::testing::Message() << "round " << round << ", message " << m);
      const v1::FetchResponse got = Parse<v1::FetchResponse>(std::move(encoded[m]));
      EXPECT_TRUE(got.SerializeAsString() == expected[m].SerializeAsString());
    }
  }
}

using ::ckpt::testing::SlicedByteBuffer;

std::string Joined(const std::vector<std::string_view>& views) {
  std::string out;
  for (std::string_view v : views) out += v;
  return out;
}

TEST(WireFormatTest, UploadDataMessagesAreReadInPlaceHoweverSliced) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{127}, size_t{128}, size_t{5000}, size_t{16384},
                   size_t{1} << 20}) {
    v1::UploadRequest m;
    m.set_data(Bytes(n, 'a'));
    const std::string wire = m.SerializeAsString();
    // Every cut in the tag, the length and the first bytes, and a cut into three.
    std::vector<std::vector<size_t>> cut_sets = {{}};
    for (size_t c = 1; c < std::min<size_t>(wire.size(), 8); ++c) cut_sets.push_back({c});
    if (wire.size() > 10) cut_sets.push_back({1, 2, wire.size() / 2});
    for (const std::vector<size_t>& cuts : cut_sets) {
      SCOPED_TRACE(::testing::Message() << n << " bytes, " << cuts.size() << " cuts from "
                                        << (cuts.empty() ? 0 : cuts[0]));
      std::vector<grpc::Slice> slices;
      std::vector<std::string_view> views;
      ASSERT_TRUE(UploadDataViews(SlicedByteBuffer(wire, cuts), &slices, &views));
      EXPECT_TRUE(Joined(views) == m.data());
      for (std::string_view v : views) EXPECT_FALSE(v.empty());
    }
  }
}

TEST(WireFormatTest, OtherUploadMessagesAreLeftToProtobuf) {
  std::vector<std::string> wires;
  v1::UploadRequest header;
  header.mutable_header()->set_checkpoint_id("c");
  wires.push_back(header.SerializeAsString());
  v1::UploadRequest tensor;
  tensor.mutable_tensor()->set_name("w");
  wires.push_back(tensor.SerializeAsString());
  v1::UploadRequest extra;  // data followed by a field this version does not know
  extra.set_data("abc");
  extra.GetReflection()->MutableUnknownFields(&extra)->AddVarint(99, 1);
  wires.push_back(extra.SerializeAsString());
  v1::UploadRequest data;
  data.set_data(std::string(300, 'x'));
  const std::string whole = data.SerializeAsString();
  wires.push_back(whole.substr(0, whole.size() - 1));  // truncated
  wires.push_back(whole + "\x10");                     // trailing garbage
  wires.push_back(std::string("\x1a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 11));  // bad varint
  wires.push_back(std::string("\x1a", 1));                                           // tag only
  wires.push_back("");
  for (size_t i = 0; i < wires.size(); ++i) {
    SCOPED_TRACE(i);
    std::vector<grpc::Slice> slices;
    std::vector<std::string_view> views;
    EXPECT_FALSE(UploadDataViews(SlicedByteBuffer(wires[i], {}), &slices, &views));
  }
}

}  // namespace
}  // namespace ckpt
