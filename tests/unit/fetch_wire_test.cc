// The client's in-place reading of Fetch messages, checked against protobuf's parser for every
// layout of the bytes over gRPC slices.
#include "client/fetch_wire.h"

#include <random>
#include <string>

#include "client/fetch_checker.h"
#include "core/box.h"
#include "core/checksum.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "gtest/gtest.h"
#include "tests/testing/byte_buffers.h"

namespace ckpt {
namespace {

std::string Bytes(size_t n, char seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed + i * 13);
  return s;
}

using ::ckpt::testing::SlicedByteBuffer;

std::string Joined(const std::vector<std::string_view>& views) {
  std::string out;
  for (std::string_view v : views) {
    EXPECT_FALSE(v.empty());
    out += v;
  }
  return out;
}

// Parses `wire` cut at `cuts` and checks it against protobuf's reading of the same bytes.
void ExpectReadInPlace(const std::string& wire, const std::vector<size_t>& cuts, FetchWire* got) {
  v1::FetchResponse expected;
  ASSERT_TRUE(expected.ParseFromString(wire));
  ASSERT_TRUE(expected.has_data());
  grpc::ByteBuffer buffer = SlicedByteBuffer(wire, cuts);
  ASSERT_TRUE(ParseFetchWire(&buffer, got).ok());
  ASSERT_TRUE(got->is_data);
  EXPECT_TRUE(Joined(got->data) == expected.data().data());
  EXPECT_EQ(got->data_bytes, expected.data().data().size());
  EXPECT_EQ(got->part_bytes, std::vector<uint64_t>(expected.data().part_bytes().begin(),
                                                   expected.data().part_bytes().end()));
  EXPECT_EQ(got->part_checksums, std::vector<uint64_t>(expected.data().part_checksums().begin(),
                                                       expected.data().part_checksums().end()));
  EXPECT_EQ(got->tile_box, std::vector<int64_t>(expected.data().tile_box().begin(),
                                                expected.data().tile_box().end()));
  EXPECT_EQ(got->band_rows, expected.data().band_rows());
}

TEST(FetchWireTest, DataMessagesAreReadInPlaceHoweverSliced) {
  FetchWire got;  // reused: every parse must reset what the previous one left
  for (size_t n :
       {size_t{0}, size_t{1}, size_t{127}, size_t{128}, size_t{16384}, (size_t{1} << 20) + 3}) {
    for (int parts : {1, 3}) {
      v1::FetchResponse m;
      m.mutable_data()->set_data(Bytes(n, static_cast<char>(parts)));
      for (int i = 0; i < parts; ++i) {
        m.mutable_data()->add_part_bytes(300u * (i + 1));
        m.mutable_data()->add_part_checksums(~uint64_t{0} - i);
        if (parts == 3) {  // as tiles of a rank-2 slice
          for (int64_t v : {int64_t{i}, int64_t{0}, int64_t{i} + 1, int64_t{1} << 33}) {
            m.mutable_data()->add_tile_box(v);
          }
          m.mutable_data()->set_band_rows(300);
        }
      }
      const std::string wire = m.SerializeAsString();
      std::vector<std::vector<size_t>> cut_sets = {{}};
      for (size_t c = 1; c < std::min<size_t>(wire.size(), 10); ++c) cut_sets.push_back({c});
      if (wire.size() > 40) {
        cut_sets.push_back({1, 3, wire.size() / 2, wire.size() - 9, wire.size() - 1});
      }
      for (const std::vector<size_t>& cuts : cut_sets) {
        SCOPED_TRACE(::testing::Message() << n << " bytes, " << parts << " parts, " << cuts.size()
                                          << " cuts from " << (cuts.empty() ? 0 : cuts[0]));
        ExpectReadInPlace(wire, cuts, &got);
      }
    }
  }
}

TEST(FetchWireTest, UnpackedPartListsAreReadToo) {
  // FetchData{data: "abcdef", part_bytes: 2, 4, part_checksums: 7, 9, tile_box: 0, 2, 3, 5},
  // the repeated fields unpacked.
  std::string inner;
  {
    google::protobuf::io::StringOutputStream s(&inner);
    google::protobuf::io::CodedOutputStream out(&s);
    out.WriteTag((1 << 3) | 2);
    out.WriteVarint32(6);
    out.WriteString("abcdef");
    for (uint64_t v : {2, 4}) {
      out.WriteTag((2 << 3) | 0);
      out.WriteVarint64(v);
    }
    for (uint64_t v : {7, 9}) {
      out.WriteTag((3 << 3) | 1);
      out.WriteLittleEndian64(v);
    }
    for (uint64_t v : {0, 2, 3, 5}) {  // tile_box, unpacked
      out.WriteTag((4 << 3) | 0);
      out.WriteVarint64(v);
    }
  }
  std::string wire;
  {
    google::protobuf::io::StringOutputStream s(&wire);
    google::protobuf::io::CodedOutputStream out(&s);
    out.WriteTag((3 << 3) | 2);
    out.WriteVarint32(static_cast<uint32_t>(inner.size()));
    out.WriteString(inner);
  }
  FetchWire got;
  ExpectReadInPlace(wire, {4}, &got);
  EXPECT_EQ(got.part_bytes, (std::vector<uint64_t>{2, 4}));
  EXPECT_EQ(got.part_checksums, (std::vector<uint64_t>{7, 9}));
  EXPECT_EQ(got.tile_box, (std::vector<int64_t>{0, 2, 3, 5}));
}

TEST(FetchWireTest, OtherMessagesAreParsedByProtobuf) {
  FetchWire got;
  v1::FetchResponse summary;
  summary.mutable_summary()->set_tensor_count(2);
  v1::FetchResponse tensor;
  tensor.mutable_tensor()->set_name("w");
  v1::FetchResponse unknown_field;  // data, but with a field this version does not know
  unknown_field.mutable_data()->set_data("xyz");
  unknown_field.mutable_data()
      ->GetReflection()
      ->MutableUnknownFields(unknown_field.mutable_data())
      ->AddVarint(99, 5);
  for (const v1::FetchResponse& m : {summary, tensor, unknown_field}) {
    SCOPED_TRACE(m.ShortDebugString());
    grpc::ByteBuffer buffer = SlicedByteBuffer(m.SerializeAsString(), {1});
    ASSERT_TRUE(ParseFetchWire(&buffer, &got).ok());
    EXPECT_FALSE(got.is_data);
    EXPECT_TRUE(got.data.empty());
    EXPECT_EQ(got.message.SerializeAsString(), m.SerializeAsString());
  }
}

TEST(FetchWireTest, MalformedMessagesAreErrors) {
  v1::FetchResponse m;
  m.mutable_data()->set_data(std::string(500, 'q'));
  m.mutable_data()->add_part_bytes(500);
  m.mutable_data()->add_part_checksums(5);
  const std::string wire = m.SerializeAsString();
  FetchWire got;
  for (const std::string& bad :
       {wire.substr(0, wire.size() - 3), wire.substr(0, 2), std::string("\x1a\x05\x0a\x09zz", 6)}) {
    grpc::ByteBuffer buffer = SlicedByteBuffer(bad, {});
    EXPECT_FALSE(ParseFetchWire(&buffer, &got).ok()) << bad.size() << " bytes";
  }
}

TEST(FetchWireTest, CursorHashesRangesAcrossViews) {
  std::mt19937_64 rng(7);
  const std::string all = Bytes(10000, 'c');
  for (int round = 0; round < 50; ++round) {
    std::vector<std::string_view> views;
    for (size_t at = 0; at < all.size();) {
      const size_t n = std::min<size_t>(all.size() - at, 1 + rng() % 3000);
      views.push_back(std::string_view(all).substr(at, n));
      at += n;
    }
    ViewCursor cursor(views);
    for (size_t at = 0; at < all.size();) {
      const size_t n = std::min<size_t>(all.size() - at, rng() % 4000);
      ASSERT_EQ(cursor.Checksum(n), Checksum(std::string_view(all).substr(at, n)))
          << "round " << round << " at " << at;
      at += n;
    }
  }
}

// Counts what a FetchChecker hands on.
class CountingVisitor final : public TensorVisitor {
 public:
  absl::Status OnSummary(const v1::FetchPlanSummary&) override { return absl::OkStatus(); }
  absl::Status OnTensor(const v1::FetchTensorHeader&) override { return absl::OkStatus(); }
  absl::Status OnData(std::string_view data) override {
    delivered += data.size();
    return absl::OkStatus();
  }
  absl::Status OnTensorEnd() override { return absl::OkStatus(); }
  uint64_t delivered = 0;
};

v1::FetchResponse Summary(int64_t tensors, int64_t bytes) {
  v1::FetchResponse m;
  m.mutable_summary()->set_tensor_count(tensors);
  m.mutable_summary()->set_total_bytes(bytes);
  return m;
}

v1::FetchResponse TensorHeader(const std::string& dtype, const std::vector<int64_t>& local,
                               int64_t total_bytes) {
  v1::FetchResponse m;
  m.mutable_tensor()->set_name("t");
  m.mutable_tensor()->set_dtype(dtype);
  for (int64_t d : local) m.mutable_tensor()->add_local_shape(d);
  m.mutable_tensor()->set_total_bytes(total_bytes);
  return m;
}

// One tile [lo, hi) of a matrix in a band of `band_rows` rows, its bytes checksummed.
v1::FetchResponse Tile(const std::string& bytes, std::vector<int64_t> lo, std::vector<int64_t> hi,
                       int64_t band_rows) {
  v1::FetchResponse m;
  m.mutable_data()->set_data(bytes);
  m.mutable_data()->add_part_bytes(bytes.size());
  m.mutable_data()->add_part_checksums(Checksum(bytes));
  for (int64_t v : lo) m.mutable_data()->add_tile_box(v);
  for (int64_t v : hi) m.mutable_data()->add_tile_box(v);
  m.mutable_data()->set_band_rows(band_rows);
  return m;
}

// A header whose local shape holds more bytes than its total_bytes must not let a band of tiles
// deliver more than the header announced: each tile message fits the announced size on its own,
// but the band they complete does not.
TEST(FetchCheckerTest, BandOfTilesLargerThanTheAnnouncedBytesIsRefused) {
  CountingVisitor visitor;
  FetchChecker checker(&visitor, "ck");
  ASSERT_TRUE(checker.Consume(Summary(1, 2)).ok());
  ASSERT_TRUE(checker.Consume(TensorHeader("Int8", {4, 1}, 2)).ok());
  absl::Status first = checker.Consume(Tile("ab", {0, 0}, {2, 1}, 4));
  absl::Status second =
      first.ok() ? checker.Consume(Tile("cd", {2, 0}, {4, 1}, 4)) : absl::OkStatus();
  EXPECT_TRUE(!first.ok() || !second.ok());
  const absl::Status refused = first.ok() ? second : first;
  EXPECT_EQ(refused.code(), absl::StatusCode::kDataLoss) << refused;
  EXPECT_NE(refused.message().find("announced"), std::string_view::npos) << refused;
  EXPECT_LE(visitor.delivered, 2u);
}

// The same band within the announced bytes is assembled and delivered.
TEST(FetchCheckerTest, BandOfTilesWithinTheAnnouncedBytesIsDelivered) {
  CountingVisitor visitor;
  FetchChecker checker(&visitor, "ck");
  ASSERT_TRUE(checker.Consume(Summary(1, 4)).ok());
  ASSERT_TRUE(checker.Consume(TensorHeader("Int8", {4, 1}, 4)).ok());
  ASSERT_TRUE(checker.Consume(Tile("ab", {0, 0}, {2, 1}, 4)).ok());
  ASSERT_TRUE(checker.Consume(Tile("cd", {2, 0}, {4, 1}, 4)).ok());
  EXPECT_EQ(visitor.delivered, 4u);
  EXPECT_TRUE(checker.End().ok());
}

// Records what a FetchChecker delivers: per tensor its name and bytes.
class RecordingVisitor final : public TensorVisitor {
 public:
  absl::Status OnSummary(const v1::FetchPlanSummary&) override { return absl::OkStatus(); }
  absl::Status OnTensor(const v1::FetchTensorHeader& h) override {
    tensors.push_back({h.name(), ""});
    return absl::OkStatus();
  }
  absl::Status OnData(std::string_view data) override {
    tensors.back().second += data;
    return absl::OkStatus();
  }
  absl::Status OnTensorEnd() override {
    ++ended;
    return absl::OkStatus();
  }
  std::vector<std::pair<std::string, std::string>> tensors;
  int ended = 0;
};

// A batch of tensors named t0, t1, ... holding `bytes[i]` each, with `data` cut into parts of
// `part` bytes.
v1::FetchResponse Batch(const std::vector<std::string>& bytes, size_t part) {
  v1::FetchResponse m;
  v1::FetchTensorBatch* b = m.mutable_batch();
  std::string data;
  for (size_t i = 0; i < bytes.size(); ++i) {
    v1::FetchTensorHeader* h = b->add_tensors();
    h->set_name("t" + std::to_string(i));
    h->set_dtype("Int8");
    h->add_local_shape(static_cast<int64_t>(bytes[i].size()));
    h->set_total_bytes(static_cast<int64_t>(bytes[i].size()));
    data += bytes[i];
  }
  for (size_t at = 0; at < data.size(); at += part) {
    const std::string_view p = std::string_view(data).substr(at, part);
    b->add_part_bytes(p.size());
    b->add_part_checksums(Checksum(p));
  }
  b->set_data(data);
  return m;
}

// A batch delivers each of its tensors whole, in order, whatever its parts (one spanning several
// tensors, or one per few bytes), zero-byte tensors too, and the stream may go on with tensors
// of their own after it.
TEST(FetchCheckerTest, BatchDeliversEachTensorWhole) {
  for (size_t part : {1, 3, 1000}) {
    SCOPED_TRACE(part);
    RecordingVisitor visitor;
    FetchChecker checker(&visitor, "ck");
    ASSERT_TRUE(checker.Consume(Summary(5, 12)).ok());
    const std::vector<std::string> bytes = {"abc", "", "defgh", "i"};
    ASSERT_TRUE(checker.Consume(Batch(bytes, part)).ok());
    v1::FetchResponse after = TensorHeader("Int8", {3}, 3);
    after.mutable_tensor()->set_name("t4");
    ASSERT_TRUE(checker.Consume(after).ok());
    v1::FetchResponse data;
    data.mutable_data()->set_data("jkl");
    data.mutable_data()->add_part_bytes(3);
    data.mutable_data()->add_part_checksums(Checksum(std::string_view("jkl")));
    ASSERT_TRUE(checker.Consume(data).ok());
    ASSERT_TRUE(checker.End().ok());
    ASSERT_EQ(visitor.tensors.size(), 5u);
    for (size_t i = 0; i < bytes.size(); ++i) {
      EXPECT_EQ(visitor.tensors[i].first, "t" + std::to_string(i));
      EXPECT_EQ(visitor.tensors[i].second, bytes[i]);
    }
    EXPECT_EQ(visitor.tensors[4].second, "jkl");
    EXPECT_EQ(visitor.ended, 5);
  }
}

// A batch is checked whole before any of its tensors is delivered: a damaged byte anywhere is
// DATA_LOSS naming the tensor it belongs to, and so are parts or tensors that do not add up to
// its data; data after a batch's last tensor is refused like any data beyond a tensor's bytes.
TEST(FetchCheckerTest, DamagedOrInconsistentBatchesAreRefused) {
  auto refused = [](const v1::FetchResponse& batch, const std::string& what) {
    SCOPED_TRACE(what);
    RecordingVisitor visitor;
    FetchChecker checker(&visitor, "ck");
    EXPECT_TRUE(checker.Consume(Summary(3, 9)).ok());
    const absl::Status s = checker.Consume(batch);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_NE(s.message().find(what), std::string_view::npos) << s;
    EXPECT_TRUE(visitor.tensors.empty()) << "a tensor of a refused batch was delivered";
  };
  const std::vector<std::string> bytes = {"abc", "def", "ghi"};
  v1::FetchResponse damaged = Batch(bytes, 2);
  (*damaged.mutable_batch()->mutable_data())[4] ^= 1;  // a byte of t1
  refused(damaged, "tensor t1: bytes [4, 6) of a batch of 3 tensors");
  v1::FetchResponse short_parts = Batch(bytes, 4);
  short_parts.mutable_batch()->mutable_part_bytes()->RemoveLast();
  short_parts.mutable_batch()->mutable_part_checksums()->RemoveLast();
  refused(short_parts, "its parts cover 8 of its 9 bytes");
  v1::FetchResponse uneven = Batch(bytes, 4);
  uneven.mutable_batch()->mutable_part_checksums()->RemoveLast();
  refused(uneven, "part checksums");
  v1::FetchResponse too_few = Batch(bytes, 9);
  too_few.mutable_batch()->mutable_tensors(2)->set_total_bytes(2);
  refused(too_few, "its tensors announce 8 bytes but it holds 9");
  v1::FetchResponse too_many = Batch(bytes, 9);
  too_many.mutable_batch()->mutable_tensors(1)->set_total_bytes(7);
  refused(too_many, "its tensors announce more bytes but it holds 9");

  RecordingVisitor visitor;
  FetchChecker checker(&visitor, "ck");
  ASSERT_TRUE(checker.Consume(Summary(3, 9)).ok());
  ASSERT_TRUE(checker.Consume(Batch(bytes, 9)).ok());
  v1::FetchResponse more;
  more.mutable_data()->set_data("x");
  more.mutable_data()->add_part_bytes(1);
  more.mutable_data()->add_part_checksums(Checksum(std::string_view("x")));
  EXPECT_EQ(checker.Consume(more).code(), absl::StatusCode::kDataLoss);
}

// `m` as received in slices cut at those of `cuts` (ascending) that fall inside it, parsed by
// ParseFetchWire into `got`.
void ParseSliced(const v1::FetchResponse& m, const std::vector<size_t>& cuts, FetchWire* got) {
  const std::string wire = m.SerializeAsString();
  std::vector<size_t> inside;
  for (size_t c : cuts) {
    if (c > 0 && c < wire.size()) inside.push_back(c);
  }
  grpc::ByteBuffer buffer = SlicedByteBuffer(wire, inside);
  ASSERT_TRUE(ParseFetchWire(&buffer, got).ok());
}

// A batch is read in place however its bytes are sliced (a tensor's bytes, or a header, split
// between slices): the same headers, data and parts as protobuf reads, and the checker delivers
// the same tensors from it. The FetchWire is reused across batches of different sizes and a data
// message, as the client reuses it.
TEST(FetchWireTest, BatchesAreReadInPlaceHoweverSliced) {
  FetchWire got;
  std::mt19937_64 rng(11);
  for (int round = 0; round < 40; ++round) {
    std::vector<std::string> bytes;
    const size_t tensors = 1 + rng() % 12;
    for (size_t i = 0; i < tensors; ++i) {
      bytes.push_back(Bytes(rng() % 300, static_cast<char>(round + i)));
    }
    const v1::FetchResponse m = Batch(bytes, 1 + rng() % 500);
    const std::string wire = m.SerializeAsString();
    std::vector<size_t> cuts;
    for (size_t at = rng() % 40; at < wire.size(); at += 1 + rng() % 200) cuts.push_back(at);
    SCOPED_TRACE(::testing::Message() << "round " << round << ", " << cuts.size() << " cuts");
    ParseSliced(m, cuts, &got);
    ASSERT_TRUE(got.is_batch);
    EXPECT_FALSE(got.is_data);
    ASSERT_EQ(got.batch_header_count, tensors);
    for (size_t i = 0; i < tensors; ++i) {
      EXPECT_EQ(got.batch_headers[i].SerializeAsString(),
                m.batch().tensors(static_cast<int>(i)).SerializeAsString());
    }
    EXPECT_TRUE(Joined(got.data) == m.batch().data());
    EXPECT_EQ(got.data_bytes, m.batch().data().size());
    EXPECT_EQ(got.part_bytes,
              std::vector<uint64_t>(m.batch().part_bytes().begin(), m.batch().part_bytes().end()));
    EXPECT_EQ(got.part_checksums, std::vector<uint64_t>(m.batch().part_checksums().begin(),
                                                        m.batch().part_checksums().end()));
    RecordingVisitor visitor;
    FetchChecker checker(&visitor, "ck");
    int64_t total = 0;
    for (const std::string& b : bytes) total += static_cast<int64_t>(b.size());
    ASSERT_TRUE(checker.Consume(Summary(static_cast<int64_t>(tensors), total)).ok());
    ASSERT_TRUE(checker.Consume(got).ok());
    ASSERT_TRUE(checker.End().ok());
    ASSERT_EQ(visitor.tensors.size(), tensors);
    for (size_t i = 0; i < tensors; ++i) {
      EXPECT_EQ(visitor.tensors[i].first, "t" + std::to_string(i));
      EXPECT_TRUE(visitor.tensors[i].second == bytes[i]) << "tensor " << i;
    }
    if (round % 5 == 0) {  // a data message in between leaves nothing of the batch behind
      v1::FetchResponse data;
      data.mutable_data()->set_data("xyz");
      ParseSliced(data, {2}, &got);
      EXPECT_TRUE(got.is_data);
      EXPECT_FALSE(got.is_batch);
      EXPECT_EQ(got.batch_header_count, 0u);
    }
  }
}

// A batch with a field this version does not know is parsed by protobuf and checked the same.
TEST(FetchWireTest, BatchWithUnknownFieldIsParsedByProtobuf) {
  v1::FetchResponse m = Batch({"abc", "de"}, 2);
  m.mutable_batch()->GetReflection()->MutableUnknownFields(m.mutable_batch())->AddVarint(99, 5);
  FetchWire got;
  ParseSliced(m, {3}, &got);
  EXPECT_FALSE(got.is_batch);
  ASSERT_TRUE(got.message.has_batch());
  RecordingVisitor visitor;
  FetchChecker checker(&visitor, "ck");
  ASSERT_TRUE(checker.Consume(Summary(2, 5)).ok());
  ASSERT_TRUE(checker.Consume(got).ok());
  ASSERT_EQ(visitor.tensors.size(), 2u);
  EXPECT_EQ(visitor.tensors[1].second, "de");
}

// Damaged or inconsistent batches read in place are refused with the same errors as batches parsed
// by protobuf (FetchCheckerTest.DamagedOrInconsistentBatchesAreRefused), before any of their
// tensors is delivered; a truncated batch does not parse.
TEST(FetchWireTest, DamagedBatchesReadInPlaceAreRefused) {
  const std::vector<std::string> bytes = {"abc", "def", "ghi"};
  auto refused = [](const v1::FetchResponse& batch, const std::string& what) {
    SCOPED_TRACE(what);
    FetchWire got;
    ParseSliced(batch, {5, 9}, &got);
    ASSERT_TRUE(got.is_batch);
    RecordingVisitor visitor;
    FetchChecker checker(&visitor, "ck");
    EXPECT_TRUE(checker.Consume(Summary(3, 9)).ok());
    const absl::Status s = checker.Consume(got);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_NE(s.message().find(what), std::string_view::npos) << s;
    EXPECT_TRUE(visitor.tensors.empty()) << "a tensor of a refused batch was delivered";
  };
  v1::FetchResponse damaged = Batch(bytes, 2);
  (*damaged.mutable_batch()->mutable_data())[4] ^= 1;  // a byte of t1
  refused(damaged, "tensor t1: bytes [4, 6) of a batch of 3 tensors");
  v1::FetchResponse uneven = Batch(bytes, 4);
  uneven.mutable_batch()->mutable_part_checksums()->RemoveLast();
  refused(uneven, "part checksums");
  v1::FetchResponse too_many = Batch(bytes, 9);
  too_many.mutable_batch()->mutable_tensors(1)->set_total_bytes(7);
  refused(too_many, "its tensors announce more bytes but it holds 9");
  v1::FetchResponse empty;
  empty.mutable_batch();
  refused(empty, "it holds no tensor");

  const std::string wire = Batch(bytes, 3).SerializeAsString();
  FetchWire got;
  for (size_t cut : {size_t{1}, size_t{6}, wire.size() / 2, wire.size() - 1}) {
    grpc::ByteBuffer buffer = SlicedByteBuffer(wire.substr(0, cut), {});
    EXPECT_FALSE(ParseFetchWire(&buffer, &got).ok()) << cut << " bytes";
  }
}

// Lends each tensor's memory (InPlaceVisitor) and records what the checker wrote there, with
// guard bytes after each tensor's memory that must stay untouched. `lend` false: lends nothing,
// so the bytes come through OnData.
class InPlaceRecorder final : public InPlaceVisitor {
 public:
  static constexpr size_t kGuard = 64;
  explicit InPlaceRecorder(bool lend = true) : lend_(lend) {}

  absl::Status OnSummary(const v1::FetchPlanSummary&) override { return absl::OkStatus(); }
  absl::Status OnTensor(const v1::FetchTensorHeader& h) override {
    const size_t n = static_cast<size_t>(h.total_bytes()) + kGuard;
    tensors.push_back({h.name(), std::string(n, '\x5a')});
    placed.push_back(0);
    return absl::OkStatus();
  }
  char* TensorMemory() override { return lend_ ? tensors.back().second.data() : nullptr; }
  absl::Status OnPlaced(int64_t size) override {
    placed.back() += size;
    return absl::OkStatus();
  }
  bool StopRequested() const override { return false; }
  absl::Status OnData(std::string_view data) override {
    if (lend_) return absl::InternalError("OnData for a tensor whose memory was lent");
    std::string& t = tensors.back().second;
    t.replace(static_cast<size_t>(placed.back()), data.size(), data);
    placed.back() += static_cast<int64_t>(data.size());
    return absl::OkStatus();
  }
  absl::Status OnTensorEnd() override {
    ++ended;
    return absl::OkStatus();
  }
  // The tensors' bytes without the guards, which must be intact.
  std::vector<std::pair<std::string, std::string>> Delivered() const {
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& [name, bytes] : tensors) {
      const size_t n = bytes.size() - kGuard;
      EXPECT_EQ(bytes.substr(n), std::string(kGuard, '\x5a')) << "written past tensor " << name;
      out.push_back({name, bytes.substr(0, n)});
    }
    return out;
  }

  std::vector<std::pair<std::string, std::string>> tensors;
  std::vector<int64_t> placed;
  int ended = 0;

 private:
  const bool lend_;
};

// A data message of tiles of the row-major `array` of shape `shape` (elements of `elem`
// bytes): one part per box [lo, hi), in the order given.
using Boxes = std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>;

v1::FetchResponse Tiles(const std::string& array, const std::vector<int64_t>& shape, size_t elem,
                        const Boxes& boxes, int64_t band_rows) {
  v1::FetchResponse m;
  v1::FetchData* d = m.mutable_data();
  std::string data;
  for (const auto& [lo, hi] : boxes) {
    std::string tile;
    std::vector<int64_t> index = lo;
    do {
      int64_t at = 0;
      for (size_t k = 0; k < shape.size(); ++k) at = at * shape[k] + index[k];
      tile.append(array, static_cast<size_t>(at) * elem, elem);
    } while (NextIndex(index, lo, hi));
    d->add_part_bytes(tile.size());
    d->add_part_checksums(Checksum(tile));
    for (int64_t v : lo) d->add_tile_box(v);
    for (int64_t v : hi) d->add_tile_box(v);
    data += tile;
  }
  d->set_data(data);
  d->set_band_rows(band_rows);
  return m;
}

v1::FetchResponse Rows(const std::string& bytes) {
  v1::FetchResponse m;
  m.mutable_data()->set_data(bytes);
  m.mutable_data()->add_part_bytes(bytes.size());
  m.mutable_data()->add_part_checksums(Checksum(bytes));
  return m;
}

v1::FetchResponse Named(v1::FetchResponse header, const std::string& name) {
  header.mutable_tensor()->set_name(name);
  return header;
}

// A stream of every kind of data message: a tensor as rows in two messages, a 3-D Float32 tensor
// as two bands of tiles (cut along every dim, sent out of order, a band over two messages), a
// batch, and a tensor too large for memcpy's path (streaming stores) as one band of tiles.
std::vector<v1::FetchResponse> MixedStream(int64_t* total) {
  std::vector<v1::FetchResponse> stream;
  const std::string rows = Bytes(40, 'r');
  const std::vector<int64_t> cube = {4, 3, 5};
  const std::string cube_bytes = Bytes(4 * 3 * 5 * 4, 'c');
  const std::vector<int64_t> wide = {6, 1 << 18};  // 6 MiB of Float32
  const std::string wide_bytes = Bytes(size_t{6} << 20, 'w');
  const std::vector<std::string> small = {"abc", "", "de"};
  *total = 40 + static_cast<int64_t>(cube_bytes.size() + wide_bytes.size()) + 5;
  stream.push_back(Summary(6, *total));
  stream.push_back(Named(TensorHeader("Int8", {40}, 40), "rows"));
  stream.push_back(Rows(rows.substr(0, 16)));
  stream.push_back(Rows(rows.substr(16)));
  stream.push_back(Named(TensorHeader("Float32", cube, 240), "cube"));
  stream.push_back(Tiles(cube_bytes, cube, 4, {{{0, 1, 0}, {2, 3, 5}}, {{0, 0, 2}, {2, 1, 5}}}, 2));
  stream.push_back(Tiles(cube_bytes, cube, 4, {{{0, 0, 0}, {2, 1, 2}}}, 2));
  stream.push_back(Tiles(cube_bytes, cube, 4,
                         {{{2, 0, 3}, {4, 3, 5}}, {{2, 0, 0}, {4, 2, 3}}, {{2, 2, 0}, {4, 3, 3}}},
                         2));
  stream.push_back(Batch(small, 2));
  stream.push_back(Named(TensorHeader("Float32", wide, 6 << 20), "wide"));
  stream.push_back(
      Tiles(wide_bytes, wide, 4, {{{0, 100001}, {6, 1 << 18}}, {{0, 0}, {6, 100001}}}, 6));
  return stream;
}

// Lending memory changes where the bytes go, not which: the checker writes exactly the bytes a
// visitor without memory receives through OnData (and never calls OnData), for rows, bands of
// tiles and batches, and nothing beyond each tensor's memory.
TEST(FetchCheckerTest, LentMemoryReceivesExactlyTheBytesOnDataWould) {
  int64_t total = 0;
  const std::vector<v1::FetchResponse> stream = MixedStream(&total);
  RecordingVisitor reference;
  FetchChecker reference_checker(&reference, "ck");
  InPlaceRecorder lent;
  FetchChecker lent_checker(&lent, "ck");
  InPlaceRecorder refused(/*lend=*/false);
  FetchChecker refused_checker(&refused, "ck");
  for (const v1::FetchResponse& m : stream) {
    ASSERT_TRUE(reference_checker.Consume(m).ok());
    ASSERT_TRUE(lent_checker.Consume(m).ok());
    ASSERT_TRUE(refused_checker.Consume(m).ok());
  }
  ASSERT_TRUE(reference_checker.End().ok());
  ASSERT_TRUE(lent_checker.End().ok());
  ASSERT_TRUE(refused_checker.End().ok());
  EXPECT_EQ(lent.Delivered(), reference.tensors);
  EXPECT_EQ(refused.Delivered(), reference.tensors);
  ASSERT_EQ(lent.placed.size(), reference.tensors.size());
  int64_t placed = 0;
  for (size_t i = 0; i < lent.placed.size(); ++i) {
    EXPECT_EQ(lent.placed[i], static_cast<int64_t>(reference.tensors[i].second.size()));
    placed += lent.placed[i];
  }
  EXPECT_EQ(placed, total);
  EXPECT_EQ(lent.ended, reference.ended);
}

// The refusals are the same with memory lent: a damaged tile names the tensor and byte range,
// a band larger than the announced bytes and overlapping or stray tiles are refused before they
// are written, and nothing is written past a tensor's memory.
TEST(FetchCheckerTest, LentMemoryRefusesWhatOnDataWould) {
  auto compare = [](const std::vector<v1::FetchResponse>& stream, const std::string& what) {
    SCOPED_TRACE(what);
    RecordingVisitor reference;
    FetchChecker reference_checker(&reference, "ck");
    InPlaceRecorder lent;
    FetchChecker lent_checker(&lent, "ck");
    absl::Status expected, got;
    for (const v1::FetchResponse& m : stream) {
      if (expected.ok()) expected = reference_checker.Consume(m);
      if (got.ok()) got = lent_checker.Consume(m);
    }
    if (expected.ok()) expected = reference_checker.End();
    if (got.ok()) got = lent_checker.End();
    EXPECT_EQ(got, expected);
    EXPECT_NE(expected.message().find(what), std::string_view::npos) << expected;
    lent.Delivered();  // checks the guards
  };
  const std::vector<int64_t> shape = {4, 3};
  const std::string matrix = Bytes(4 * 3 * 2, 'm');
  auto start = [&](int64_t total) {
    return std::vector<v1::FetchResponse>{Summary(1, total),
                                          Named(TensorHeader("Float16", shape, total), "m")};
  };
  std::vector<v1::FetchResponse> damaged = start(24);
  damaged.push_back(Tiles(matrix, shape, 2, {{{0, 0}, {2, 3}}}, 2));
  damaged.push_back(Tiles(matrix, shape, 2, {{{2, 0}, {4, 1}}, {{2, 1}, {4, 3}}}, 2));
  (*damaged.back().mutable_data()->mutable_data())[5] ^= 1;  // in the second tile
  compare(damaged, "checkpoint ck tensor m: bytes [16, 24) failed their XXH3-64 checksum");

  std::vector<v1::FetchResponse> oversized = start(20);
  oversized.push_back(Tiles(matrix, shape, 2, {{{0, 0}, {4, 1}}}, 4));
  compare(oversized, "a band of 24 bytes exceeds the 20 announced bytes still due");

  std::vector<v1::FetchResponse> overlapping = start(24);
  overlapping.push_back(Tiles(matrix, shape, 2, {{{0, 0}, {2, 2}}, {{1, 1}, {2, 3}}}, 2));
  compare(overlapping, "overlaps tile [0:2, 0:2]");

  std::vector<v1::FetchResponse> stray = start(24);
  stray.push_back(Tiles(matrix, shape, 2, {{{0, 0}, {2, 3}}}, 2));
  stray.push_back(Tiles(matrix, shape, 2, {{{0, 0}, {2, 3}}}, 2));  // rows 0-1 again
  compare(stray, "is not inside band [2:4, 0:3]");

  std::vector<v1::FetchResponse> incomplete = start(24);
  incomplete.push_back(Tiles(matrix, shape, 2, {{{0, 0}, {4, 2}}}, 4));
  compare(incomplete, "a band of tiles [0:4, 0:3] was incomplete before the end of the stream");

  std::vector<v1::FetchResponse> cut_short = start(24);
  cut_short.push_back(Rows(matrix.substr(0, 6)));
  cut_short.push_back(Named(TensorHeader("Float16", shape, 24), "next"));
  compare(cut_short, "tensor m: received 6 of 24 bytes before the header of tensor next");

  std::vector<v1::FetchResponse> too_long = start(24);
  too_long.push_back(Rows(matrix + "xx"));
  compare(too_long, "received more than its 24 announced bytes");
}

}  // namespace
}  // namespace ckpt
