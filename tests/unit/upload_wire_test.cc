// ReadUploadMessage and UploadDataOffset (service/engine/upload_wire.h) against protobuf's own
// parser: what they read in place is what protobuf reads, what protobuf refuses they refuse, and
// the forms they leave to protobuf are well-formed.
#include "service/engine/upload_wire.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "ckpt.pb.h"
#include "tests/testing/wire_fields.h"

namespace ckpt {
namespace {

using testing::Field;
using ::testing::HasSubstr;
using testing::VarintField;

v1::UploadTensorHeader Header(const std::string& name, int64_t bytes) {
  v1::UploadTensorHeader h;
  h.set_name(name);
  h.set_dtype("UInt8");
  h.add_dims(bytes);
  h.set_total_bytes(bytes);
  return h;
}

// A batch of `n` tensors of 0, 1, 2, ... bytes.
v1::UploadRequest Batch(int n) {
  v1::UploadRequest m;
  m.mutable_batch();  // set even without tensors
  for (int i = 0; i < n; ++i) {
    v1::UploadTensor* t = m.mutable_batch()->add_tensors();
    *t->mutable_header() = Header("t" + std::to_string(i), i);
    t->set_data(std::string(static_cast<size_t>(i), static_cast<char>('a' + i % 26)));
  }
  return m;
}

// The reader's result for `wire`, checked against protobuf's parse of it: a form read in place
// must hold what protobuf reads; an error must be one protobuf also refuses.
absl::StatusOr<UploadWireKind> ReadAndCompare(const std::string& wire) {
  UploadMessageViews views;
  absl::StatusOr<UploadWireKind> kind = ReadUploadMessage(wire, &views);
  v1::UploadRequest parsed;
  const bool protobuf_ok = parsed.ParseFromString(wire);
  if (!kind.ok()) {
    EXPECT_FALSE(protobuf_ok) << "refused what protobuf reads: " << kind.status();
    EXPECT_EQ(kind.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(kind.status().message()), HasSubstr("malformed upload message"));
    return kind;
  }
  if (*kind == UploadWireKind::kOther) return kind;
  if (!protobuf_ok) {
    // Only a tensor's header, which the reader leaves for its user to parse (the reactor parses
    // every one before using any), may hold what protobuf refuses.
    EXPECT_EQ(*kind, UploadWireKind::kBatch) << "read a data message protobuf refuses";
    bool bad_header = false;
    for (const UploadTensorView& t : views.tensors) {
      v1::UploadTensorHeader header;
      if (!header.ParseFromArray(t.header.data(), static_cast<int>(t.header.size()))) {
        bad_header = true;
      }
    }
    EXPECT_TRUE(bad_header) << "read a batch protobuf refuses, every header well-formed";
    return kind;
  }
  if (*kind == UploadWireKind::kData) {
    EXPECT_EQ(parsed.kind_case(), v1::UploadRequest::kData);
    EXPECT_TRUE(views.data == parsed.data());
    EXPECT_TRUE(views.tensors.empty());
  } else {
    EXPECT_EQ(parsed.kind_case(), v1::UploadRequest::kBatch);
    EXPECT_TRUE(views.data.empty());
    EXPECT_EQ(static_cast<int>(views.tensors.size()), parsed.batch().tensors_size());
    for (int i = 0; i < parsed.batch().tensors_size() && i < static_cast<int>(views.tensors.size());
         ++i) {
      const v1::UploadTensor& want = parsed.batch().tensors(i);
      v1::UploadTensorHeader header;
      const std::string_view h = views.tensors[static_cast<size_t>(i)].header;
      EXPECT_TRUE(header.ParseFromArray(h.data(), static_cast<int>(h.size()))) << i;
      EXPECT_EQ(header.SerializeAsString(), want.header().SerializeAsString()) << i;
      EXPECT_TRUE(views.tensors[static_cast<size_t>(i)].data == want.data()) << i;
    }
  }
  return kind;
}

TEST(UploadWireTest, DataAndBatchesAreReadInPlace) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{127}, size_t{128}, size_t{1} << 20}) {
    v1::UploadRequest m;
    m.set_data(std::string(n, 'x'));
    const std::string wire = m.SerializeAsString();
    UploadMessageViews views;
    auto kind = ReadUploadMessage(wire, &views);
    ASSERT_TRUE(kind.ok()) << kind.status();
    EXPECT_EQ(*kind, UploadWireKind::kData);
    EXPECT_EQ(views.data.size(), n);
    // The views point into the message: nothing is copied.
    EXPECT_EQ(views.data.data(), wire.data() + wire.size() - n);
    EXPECT_EQ(*ReadAndCompare(wire), UploadWireKind::kData);
  }
  for (int n : {0, 1, 3, 200}) {
    SCOPED_TRACE(n);
    const std::string wire = Batch(n).SerializeAsString();
    auto kind = ReadAndCompare(wire);
    ASSERT_TRUE(kind.ok()) << kind.status();
    EXPECT_EQ(*kind, UploadWireKind::kBatch);
  }
}

// Fields this version does not know are skipped inside a batch and its tensors, a tensor's
// repeated data field keeps the last, and a tensor without a header or data reads as protobuf
// reads it (default values).
TEST(UploadWireTest, BatchesReadAsProtobufReadsThem) {
  const std::string header = Header("w", 2).SerializeAsString();
  const std::vector<std::string> tensors = {
      Field(1, header) + Field(2, "ab"),
      Field(1, header) + VarintField(9, 7) + Field(2, "ab") + Field(15, "unknown"),
      Field(2, "xx") + Field(1, header) + Field(2, "ab"),  // the last data counts
      Field(1, header),                                    // no data
      Field(2, "ab"),                                      // no header
      "",                                                  // neither
  };
  for (size_t i = 0; i < tensors.size(); ++i) {
    SCOPED_TRACE(i);
    const std::string wire =
        Field(4, VarintField(5, 1) + Field(1, tensors[i]) + Field(1, tensors[0]));
    auto kind = ReadAndCompare(wire);
    ASSERT_TRUE(kind.ok()) << kind.status();
    EXPECT_EQ(*kind, UploadWireKind::kBatch);
  }
}

// Forms whose protobuf reading is more than a view: left to protobuf, and well-formed.
TEST(UploadWireTest, OtherFormsAreLeftToProtobuf) {
  const std::string header = Header("w", 2).SerializeAsString();
  v1::UploadRequest stream_header;
  stream_header.mutable_header()->set_checkpoint_id("c");
  v1::UploadRequest tensor;
  *tensor.mutable_tensor() = Header("w", 2);
  const std::vector<std::string> wires = {
      stream_header.SerializeAsString(),
      tensor.SerializeAsString(),
      "",                                                           // no field: an empty message
      Field(3, "abc") + VarintField(99, 1),                         // data and an unknown field
      VarintField(99, 1) + Field(3, "abc"),                         // the same, the other way round
      Field(3, "abc") + Field(3, "de"),                             // data twice
      Batch(2).SerializeAsString() + Batch(1).SerializeAsString(),  // two batches: merged
      Field(3, "abc") + Batch(1).SerializeAsString(),               // a oneof set twice
      Field(4, Field(1, Field(1, header) + Field(1, header))),      // a header in two parts
      Field(4, VarintField(1, 3)),                                  // a tensor of another wire type
      Field(4, Field(1, VarintField(2, 3))),  // a tensor's data of another wire type
      VarintField(3, 5),                      // data of another wire type
  };
  for (size_t i = 0; i < wires.size(); ++i) {
    SCOPED_TRACE(i);
    auto kind = ReadAndCompare(wires[i]);
    ASSERT_TRUE(kind.ok()) << kind.status();
    EXPECT_EQ(*kind, UploadWireKind::kOther);
    v1::UploadRequest parsed;
    EXPECT_TRUE(parsed.ParseFromString(wires[i]));
  }
}

TEST(UploadWireTest, MalformedMessagesAreRefusedNamingTheProblem) {
  const std::string batch = Batch(3).SerializeAsString();
  const struct {
    std::string wire;
    std::string problem;
  } cases[] = {
      {batch.substr(0, batch.size() - 1), "claiming"},  // truncated: a length past the end
      {std::string("\x1a", 1), "length of field 3"},    // a tag without its length
      {std::string("\x1a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 11), "overlong"},
      {std::string("\xff\xff\xff\xff\xff\xff", 6), "field tag"},  // an overlong tag
      {std::string("\x00\x01", 2), "field tag"},                  // tag 0
      {std::string("\x02\x00", 2), "field number 0"},             // field 0, wire type 2
      {std::string("\x0c", 1), "group end"},                      // field 1, end group
      {std::string("\x0e\x00", 2), "wire type 6"},                // field 1, wire type 6
      {std::string("\x0f\x00", 2), "wire type 7"},
      {Field(4, Field(1, std::string("\x12\x05"
                                     "ab",
                                     4))),
       "claiming 5 bytes where 2"},
      {Field(4, Field(1, Field(1, "h")) + std::string("\x0a", 1)), "length of field 1"},
      {Field(4, Field(1, VarintField(9, 1).substr(0, 1))), "wire type 0"},  // a cut varint
      {VarintField(9, 1) + std::string("\x0b", 1), "wire type 3"},          // a group never ended
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.problem);
    v1::UploadRequest parsed;
    EXPECT_FALSE(parsed.ParseFromString(c.wire)) << "protobuf reads it: not a malformed case";
    UploadMessageViews views;
    auto kind = ReadUploadMessage(c.wire, &views);
    ASSERT_FALSE(kind.ok());
    EXPECT_EQ(kind.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(kind.status().message()), HasSubstr("malformed upload message"));
    EXPECT_THAT(std::string(kind.status().message()), HasSubstr(c.problem));
    EXPECT_THAT(std::string(kind.status().message()), HasSubstr("at byte"));
  }
}

// Every prefix of a batch, and messages with random bytes changed: the reader never reads what
// protobuf refuses (but for a tensor header, parsed by the reader's user), and what it reads in
// place is what protobuf reads.
TEST(UploadWireTest, TruncatedAndDamagedBatchesAgreeWithProtobuf) {
  v1::UploadRequest m = Batch(5);
  m.mutable_batch()->mutable_tensors(1)->mutable_header()->add_dims(1);
  const std::string wire = m.SerializeAsString();
  int refused = 0;
  for (size_t n = 0; n < wire.size(); ++n) {
    SCOPED_TRACE(n);
    if (!ReadAndCompare(wire.substr(0, n)).ok()) ++refused;
  }
  EXPECT_GT(refused, static_cast<int>(wire.size()) / 2);
  std::mt19937 random(7);
  for (int round = 0; round < 5000; ++round) {
    std::string damaged = wire;
    const int changes = 1 + round % 3;
    for (int k = 0; k < changes; ++k) {
      damaged[random() % damaged.size()] = static_cast<char>(random() % 256);
    }
    SCOPED_TRACE(round);
    (void)ReadAndCompare(damaged);
  }
}

TEST(UploadWireTest, DataOffsetOnlyForAWholeDataMessage) {
  for (size_t n : {size_t{0}, size_t{5}, size_t{127}, size_t{128}, size_t{300000}}) {
    v1::UploadRequest m;
    m.set_data(std::string(n, 'x'));
    const std::string wire = m.SerializeAsString();
    const size_t offset = wire.size() - n;
    EXPECT_EQ(UploadDataOffset(std::string_view(wire).substr(0, 11), wire.size()), offset) << n;
    EXPECT_EQ(UploadDataOffset(wire, wire.size() + 1), 0u) << n;  // more follows
    if (n > 0) {
      EXPECT_EQ(UploadDataOffset(wire, wire.size() - 1), 0u) << n;  // cut short
    }
  }
  EXPECT_EQ(UploadDataOffset("", 0), 0u);
  EXPECT_EQ(UploadDataOffset(Batch(1).SerializeAsString(), Batch(1).ByteSizeLong()), 0u);
  EXPECT_EQ(UploadDataOffset(std::string("\x1a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 11), 20),
            0u);
}

}  // namespace
}  // namespace ckpt
