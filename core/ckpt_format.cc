#include "core/ckpt_format.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/absl_compat.h"
#include "core/status_macros.h"

namespace ckpt {
namespace {

// Key of Checkpoint.value (field 1, length-delimited): the first byte of every record. It is
// also the key of Value.tag, and "0x12"/"0x1a" are the keys of fields 2/3 (length-delimited).
constexpr uint8_t kKeyField1Bytes = 0x0a;
constexpr uint8_t kKeyField2Bytes = 0x12;
constexpr uint8_t kKeyField3Bytes = 0x1a;
constexpr uint8_t kKeyField1Varint = 0x08;

constexpr std::string_view kCrcMagic = "crc_num";
constexpr size_t kCrcDigitBytes = 10;
constexpr size_t kTrailerBytes = kCrcMagic.size() + kCrcDigitBytes;

// Small reads (keys, varints, names) go through a read-ahead buffer of this size.
constexpr size_t kReadAheadBytes = 64 * 1024;
// Large payloads are read straight into their destination, whose capacity never grows past
// twice the bytes that actually arrived plus this step: a corrupt length prefix in a short
// stream then fails as truncated after allocating at most this much.
constexpr size_t kGrowStepBytes = 4 * 1024 * 1024;
constexpr size_t kMaxVarintBytes = 10;
// Far above any real tensor rank (numpy allows 64); bounds the memory a corrupt dims list costs.
constexpr size_t kMaxDims = 64;
constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();

enum WireType : uint8_t {
  kVarint = 0,
  kFixed64 = 1,
  kLengthDelimited = 2,
  kFixed32 = 5,
};

uint32_t UpdateCrc(uint32_t crc, const char* data, size_t n) {
  // zlib takes a uInt length: feed large ranges in pieces.
  while (n > 0) {
    const uInt k = static_cast<uInt>(std::min<size_t>(n, size_t{1} << 30));
    crc = static_cast<uint32_t>(crc32(crc, reinterpret_cast<const Bytef*>(data), k));
    data += k;
    n -= k;
  }
  return crc;
}

size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

void AppendVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

// Names in messages are escaped: a corrupt tag may hold arbitrary bytes.
std::string Quoted(std::string_view s) { return absl::StrCat("\"", absl::CHexEscape(Sv(s)), "\""); }

// The shape MindSpore's reader gives to stored dims: str tensors and dims [0] are scalars.
Shape LogicalShape(DType dtype, const std::vector<int64_t>& dims) {
  if (dtype == DType::kStr) return {};
  if (dims.size() == 1 && dims[0] == 0) return {};
  return dims;
}

absl::Status Prefixed(const absl::Status& status, std::string_view prefix) {
  return absl::Status(status.code(), absl::StrCat(Sv(prefix), status.message()));
}

// Whether `bytes` of content match `dims` × `dtype` of tensor `name` as MindSpore's reader would
// interpret them. Shared by the reader (whole tensors) and the writer (announced sizes), so that
// everything the writer accepts reads back.
absl::Status CheckContentSize(std::string_view name, DType dtype, const std::vector<int64_t>& dims,
                              int64_t bytes) {
  if (dtype == DType::kStr) {
    if (bytes % 4 != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("str tensor ", Quoted(name), " has ", bytes,
                       " bytes of content, not a multiple of 4 (UTF-32LE, 4 bytes per character)"));
    }
    return absl::OkStatus();
  }
  const std::string context = absl::StrCat("tensor ", Quoted(name), " (", Sv(DTypeName(dtype)),
                                           ", dims ", ShapeToString(dims), "): ");
  absl::StatusOr<int64_t> elements = NumElements(LogicalShape(dtype, dims));
  if (!elements.ok()) return Prefixed(elements.status(), context);
  absl::StatusOr<int64_t> expected = ByteSizeOf(dtype, *elements);
  if (!expected.ok()) return Prefixed(expected.status(), context);
  if (*expected != bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        context, "content is ", bytes, " bytes but ", *elements, " elements need ", *expected,
        dims.size() == 1 && dims[0] == 0
            ? " (dims [0] denote a scalar in MindSpore's format, so exactly one element)"
            : ""));
  }
  return absl::OkStatus();
}

// The bytes of one Value record up to (not including) its tensor_content, exactly as MindSpore's
// Python protobuf serializes `Checkpoint{value: [Value{tag, tensor{dims..., type, content}}]}`:
// fields in number order, dims unpacked, every set field present even when empty.
std::string EncodeValueHeader(std::string_view name, DType dtype, const std::vector<int64_t>& dims,
                              uint64_t content_bytes) {
  const std::string_view type = DTypeName(dtype);
  uint64_t tensor_len = 0;
  for (int64_t d : dims) tensor_len += 1 + VarintSize(static_cast<uint64_t>(d));
  tensor_len += 1 + VarintSize(type.size()) + type.size();
  tensor_len += 1 + VarintSize(content_bytes) + content_bytes;
  const uint64_t value_len =
      1 + VarintSize(name.size()) + name.size() + 1 + VarintSize(tensor_len) + tensor_len;

  std::string out;
  out.reserve(32 + name.size() + 11 * dims.size());
  out.push_back(static_cast<char>(kKeyField1Bytes));  // Checkpoint.value
  AppendVarint(value_len, &out);
  out.push_back(static_cast<char>(kKeyField1Bytes));  // Value.tag
  AppendVarint(name.size(), &out);
  out.append(name);
  out.push_back(static_cast<char>(kKeyField2Bytes));  // Value.tensor
  AppendVarint(tensor_len, &out);
  for (int64_t d : dims) {
    out.push_back(static_cast<char>(kKeyField1Varint));  // TensorProto.dims, unpacked
    AppendVarint(static_cast<uint64_t>(d), &out);        // negative: 10-byte two's complement
  }
  out.push_back(static_cast<char>(kKeyField2Bytes));  // TensorProto.tensor_type
  AppendVarint(type.size(), &out);
  out.append(type);
  out.push_back(static_cast<char>(kKeyField3Bytes));  // TensorProto.tensor_content
  AppendVarint(content_bytes, &out);
  return out;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out->push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// CkptTensor

Shape CkptTensor::shape() const { return LogicalShape(dtype, dims); }

absl::StatusOr<std::string> CkptTensor::StringValue() const {
  if (dtype != DType::kStr) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor ", Quoted(name), " is ", Sv(DTypeName(dtype)), ", not str"));
  }
  if (data.size() % 4 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("str tensor ", Quoted(name), " has ", data.size(),
                     " bytes of content, not a multiple of 4 (UTF-32LE)"));
  }
  std::string out;
  out.reserve(data.size() / 4);
  for (size_t i = 0; i < data.size(); i += 4) {
    const auto* p = reinterpret_cast<const unsigned char*>(data.data() + i);
    const uint32_t cp =
        uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
    if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("str tensor %s: character %d is 0x%08x, not a Unicode scalar value",
                          Quoted(name), i / 4, cp));
    }
    AppendUtf8(cp, &out);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// CkptReader

struct CkptReader::ValueFields {
  int64_t start = 0;  // offset of the record's 0x0a key
  std::optional<std::string> tag;
  bool has_tensor = false;
  bool has_maptensor = false;
  std::vector<int64_t> dims;
  std::optional<std::string> tensor_type;
  bool has_content = false;
  std::string content;

  // "Value "name" at offset N" for error messages.
  std::string Describe() const {
    return tag ? absl::StrCat("Value ", Quoted(*tag), " at offset ", start)
               : absl::StrCat("Value at offset ", start);
  }
};

namespace {
// Whether the stream can end with a crc_num trailer: false only when the source shows its last
// bytes and they are not one (then computing the CRC of every byte would be wasted).
bool MayHaveTrailer(ByteSource* source) {
  const std::optional<std::string> tail = source->Tail(kTrailerBytes);
  return !tail || (tail->size() == kTrailerBytes && tail->substr(0, kCrcMagic.size()) == kCrcMagic);
}
}  // namespace

CkptReader::CkptReader(ByteSource* source, CkptReaderOptions options)
    : source_(source),
      options_(options),
      computing_crc_(options.verify_crc && MayHaveTrailer(source)) {}

absl::Status CkptReader::Malformed(int64_t at, std::string_view detail) const {
  return absl::InvalidArgumentError(
      absl::StrCat(source_->Describe(), ": malformed checkpoint at offset ", at, ": ", Sv(detail)));
}

absl::Status CkptReader::Truncated(std::string_view what, int64_t missing) const {
  const std::string expected =
      missing > 0 ? absl::StrCat(" (", missing, " more bytes expected)") : std::string();
  return absl::InvalidArgumentError(
      absl::StrCat(source_->Describe(), ": truncated checkpoint: the stream ends at offset ",
                   offset_, " inside ", Sv(what), expected));
}

absl::Status CkptReader::Fill(size_t n) {
  if (Available() >= n || eof_) return absl::OkStatus();
  // Compact first so the buffer stays one read-ahead block plus a few unread bytes.
  buffer_.erase(0, buffer_pos_);
  buffer_pos_ = 0;
  while (buffer_.size() < n && !eof_) {
    const size_t old = buffer_.size();
    const size_t want = std::max(n - old, kReadAheadBytes);
    buffer_.resize(old + want);
    absl::StatusOr<size_t> got = source_->Read(buffer_.data() + old, want);
    if (!got.ok()) {
      buffer_.resize(old);
      return got.status();
    }
    buffer_.resize(old + std::min(*got, want));
    if (*got == 0) eof_ = true;
  }
  return absl::OkStatus();
}

void CkptReader::Consume(size_t n) {
  if (computing_crc_) crc_ = UpdateCrc(crc_, buffer_.data() + buffer_pos_, n);
  buffer_pos_ += n;
  offset_ += static_cast<int64_t>(n);
}

absl::StatusOr<uint64_t> CkptReader::ReadVarint(int64_t limit, Words what) {
  const int64_t start = offset_;
  CKPT_RETURN_IF_ERROR(Fill(kMaxVarintBytes));
  const uint64_t to_limit = static_cast<uint64_t>(limit - offset_);
  const size_t n =
      static_cast<size_t>(std::min<uint64_t>({Available(), kMaxVarintBytes, to_limit}));
  const auto* p = reinterpret_cast<const unsigned char*>(buffer_.data() + buffer_pos_);
  uint64_t value = 0;
  for (size_t i = 0; i < n; ++i) {
    if (i == kMaxVarintBytes - 1 && p[i] > 1) {
      return Malformed(start, absl::StrCat("varint for ", what(), " overflows 64 bits"));
    }
    value |= uint64_t{p[i] & 0x7fu} << (7 * i);
    if ((p[i] & 0x80) == 0) {
      Consume(i + 1);
      return value;
    }
  }
  if (n == kMaxVarintBytes) {
    return Malformed(start, absl::StrCat("varint for ", what(), " is longer than 10 bytes"));
  }
  if (n == to_limit) {
    return Malformed(start,
                     absl::StrCat("varint for ", what(),
                                  " runs past the end of its enclosing message at offset ", limit));
  }
  Consume(n);  // so that the error reports where the stream ended
  return Truncated(absl::StrCat("a varint (", what(), ")"), /*missing=*/0);
}

absl::StatusOr<int64_t> CkptReader::ReadLength(int64_t limit, Words what) {
  const int64_t start = offset_;
  CKPT_ASSIGN_OR_RETURN(const uint64_t length,
                        ReadVarint(limit, [&] { return absl::StrCat("the length of ", what()); }));
  if (length > static_cast<uint64_t>(limit - offset_)) {
    return Malformed(start, absl::StrCat(what(), " declares ", length, " bytes but only ",
                                         limit - offset_, " remain in its enclosing message"));
  }
  return static_cast<int64_t>(length);
}

absl::Status CkptReader::ReadBytes(int64_t n, std::string* out, Words what) {
  size_t need = static_cast<size_t>(n);
  const size_t from_buffer = std::min(need, Available());
  out->append(buffer_.data() + buffer_pos_, from_buffer);
  Consume(from_buffer);
  need -= from_buffer;
  if (need == 0) return absl::OkStatus();

  if (need <= kReadAheadBytes) {
    CKPT_RETURN_IF_ERROR(Fill(need));
    const size_t k = std::min(need, Available());
    out->append(buffer_.data() + buffer_pos_, k);
    Consume(k);
    if (k < need) return Truncated(what(), static_cast<int64_t>(need - k));
    return absl::OkStatus();
  }

  // Large payload: read straight into `out`. Capacity targets are `final` halved until they fit
  // the growth allowance, so successive targets double exactly (std::string rounds a reserve up
  // to twice the old capacity) and the last one is `final` itself, with no overshoot.
  const size_t final_size = out->size() + need;
  while (need > 0) {
    const size_t old = out->size();
    const size_t allowance = old + std::max(old, kGrowStepBytes);
    size_t target = final_size;
    while (target > allowance) target = target / 2 + target % 2;
    out->reserve(target);
    out->resize(target);
    size_t filled = old;
    while (filled < target) {
      absl::StatusOr<size_t> got = source_->Read(out->data() + filled, target - filled);
      if (!got.ok()) {
        out->resize(filled);
        return got.status();
      }
      if (*got == 0) {
        eof_ = true;
        break;
      }
      const size_t k = std::min(*got, target - filled);
      if (computing_crc_) crc_ = UpdateCrc(crc_, out->data() + filled, k);
      offset_ += static_cast<int64_t>(k);
      filled += k;
    }
    need -= filled - old;
    if (filled < target) {
      out->resize(filled);
      return Truncated(what(), static_cast<int64_t>(need));
    }
  }
  return absl::OkStatus();
}

absl::Status CkptReader::Skip(int64_t n, Words what) {
  while (n > 0) {
    CKPT_RETURN_IF_ERROR(Fill(static_cast<size_t>(std::min<int64_t>(n, kReadAheadBytes))));
    if (Available() == 0) return Truncated(what(), n);
    const size_t k = static_cast<size_t>(std::min<int64_t>(n, static_cast<int64_t>(Available())));
    Consume(k);
    n -= static_cast<int64_t>(k);
  }
  return absl::OkStatus();
}

absl::Status CkptReader::SkipField(uint64_t key, int64_t limit, Words context) {
  // Unknown fields are skipped as protobuf does, so that files from newer MindSpore versions
  // with extra fields still load; groups (deprecated, never written by MindSpore) are rejected.
  const int64_t start = offset_;
  const uint64_t field = key >> 3;
  auto what = [&] { return absl::StrCat("unknown field ", field, " of ", context()); };
  int64_t n = 0;
  switch (key & 7) {
    case kVarint:
      return ReadVarint(limit, what).status();
    case kFixed64:
      n = 8;
      break;
    case kFixed32:
      n = 4;
      break;
    case kLengthDelimited: {
      CKPT_ASSIGN_OR_RETURN(n, ReadLength(limit, what));
      break;
    }
    default:
      return Malformed(start, absl::StrCat("field ", field, " of ", context(),
                                           " has unsupported wire type ", key & 7));
  }
  if (n > limit - offset_) {
    return Malformed(start, absl::StrCat(what(), " runs past the end of its enclosing message"));
  }
  return Skip(n, what);
}

absl::Status CkptReader::ParseTensorFields(int64_t limit, ValueFields* f) {
  auto context = [&] { return absl::StrCat("the tensor of ", f->Describe()); };
  while (offset_ < limit) {
    const int64_t key_start = offset_;
    CKPT_ASSIGN_OR_RETURN(const uint64_t key,
                          ReadVarint(limit, [&] {
                            return absl::StrCat("a field key in ", context());
                          }));
    const uint64_t field = key >> 3;
    const uint64_t wire = key & 7;
    if (field == 1 && f->dims.size() >= kMaxDims) {
      return Malformed(key_start, absl::StrCat(context(), " has more than ", kMaxDims, " dims"));
    }
    if (field == 1 && wire == kVarint) {
      CKPT_ASSIGN_OR_RETURN(const uint64_t d, ReadVarint(limit, [&] {
                              return absl::StrCat("dims of ", context());
                            }));
      f->dims.push_back(static_cast<int64_t>(d));
    } else if (field == 1 && wire == kLengthDelimited) {
      // Packed dims: MindSpore writes them unpacked, but protobuf parsers accept both.
      CKPT_ASSIGN_OR_RETURN(const int64_t n,
                            ReadLength(limit, [&] {
                              return absl::StrCat("packed dims of ", context());
                            }));
      const int64_t end = offset_ + n;
      while (offset_ < end) {
        if (f->dims.size() >= kMaxDims) {
          return Malformed(offset_, absl::StrCat(context(), " has more than ", kMaxDims, " dims"));
        }
        CKPT_ASSIGN_OR_RETURN(const uint64_t d,
                              ReadVarint(end, [&] {
                                return absl::StrCat("packed dims of ", context());
                              }));
        f->dims.push_back(static_cast<int64_t>(d));
      }
    } else if (field == 2 && wire == kLengthDelimited) {
      auto what = [&] { return absl::StrCat("tensor_type of ", context()); };
      CKPT_ASSIGN_OR_RETURN(const int64_t n, ReadLength(limit, what));
      f->tensor_type.emplace();
      CKPT_RETURN_IF_ERROR(ReadBytes(n, &*f->tensor_type, what));
    } else if (field == 3 && wire == kLengthDelimited) {
      auto what = [&] { return absl::StrCat("tensor_content of ", context()); };
      CKPT_ASSIGN_OR_RETURN(const int64_t n, ReadLength(limit, what));
      f->content.clear();  // a repeated singular field: the last one wins, as in protobuf
      f->has_content = true;
      CKPT_RETURN_IF_ERROR(ReadBytes(n, &f->content, what));
    } else if (field >= 1 && field <= 3) {
      return Malformed(key_start, absl::StrCat("field ", field, " of ", context(),
                                               " has wire type ", wire, ", expected ",
                                               field == 1 ? "0 or 2" : "2"));
    } else {
      CKPT_RETURN_IF_ERROR(SkipField(key, limit, context));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> CkptReader::ReadTrailer() {
  const int64_t start = offset_;
  // One byte more than a trailer tells "exactly a trailer, then end" apart from "more data".
  CKPT_RETURN_IF_ERROR(Fill(kTrailerBytes + 1));
  const std::string_view avail(buffer_.data() + buffer_pos_, Available());
  if (avail.substr(0, kCrcMagic.size()) != kCrcMagic) return false;
  if (avail.size() != kTrailerBytes || !eof_) {
    return Malformed(start, absl::StrCat("a crc_num trailer must be followed by exactly ",
                                         kCrcDigitBytes, " bytes and the end of the file; found ",
                                         avail.size() > kTrailerBytes ? "more" : "fewer"));
  }
  const auto* digits = reinterpret_cast<const unsigned char*>(avail.data() + kCrcMagic.size());
  // 10-byte big-endian integer; a CRC32 occupies the low 4 bytes.
  uint64_t high = 0;
  uint64_t stored = 0;
  for (size_t i = 0; i < kCrcDigitBytes; ++i) {
    high = (high << 8) | (stored >> 56);
    stored = (stored << 8) | digits[i];
  }
  buffer_pos_ += kTrailerBytes;  // the trailer is not part of the checksummed bytes
  offset_ += kTrailerBytes;
  had_crc_ = true;
  if (options_.verify_crc && !computing_crc_) {
    return absl::DataLossError(absl::StrCat(
        source_->Describe(), " changed while being read: it had no crc_num trailer when opened, "
        "but one at offset ", start));
  }
  if (options_.verify_crc && (high != 0 || stored != crc_)) {
    return absl::DataLossError(absl::StrFormat(
        "%s: CRC mismatch: the crc_num trailer at offset %d stores %s but the %d bytes before it "
        "have CRC32 0x%08x (%u)",
        source_->Describe(), start,
        high != 0 ? std::string("a value wider than 32 bits")
                  : absl::StrFormat("0x%08x (%u)", stored, stored),
        start, crc_, crc_));
  }
  return true;
}

absl::StatusOr<std::optional<CkptTensor>> CkptReader::ParseNextValue() {
  if (done_) return std::nullopt;
  ValueFields f;
  f.start = offset_;
  CKPT_RETURN_IF_ERROR(Fill(1));
  if (Available() == 0) {
    done_ = true;
    return std::nullopt;
  }
  const auto first = static_cast<unsigned char>(buffer_[buffer_pos_]);
  if (first != kKeyField1Bytes) {
    if (first == static_cast<unsigned char>(kCrcMagic[0])) {
      CKPT_ASSIGN_OR_RETURN(const bool trailer, ReadTrailer());
      if (trailer) {
        done_ = true;
        return std::nullopt;
      }
    }
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: not a MindSpore checkpoint: unexpected byte 0x%02x at offset %d%s",
        source_->Describe(), first, offset_,
        offset_ == 0 ? " (a .ckpt file starts with 0x0a; the file may be encrypted with "
                       "enc_key, or be another format such as safetensors)"
                     : " (expected 0x0a starting the next Value, or a crc_num trailer)"));
  }
  Consume(1);
  CKPT_ASSIGN_OR_RETURN(const uint64_t length,
                        ReadVarint(kNoLimit, [&] {
                          return absl::StrCat("the length of ", f.Describe());
                        }));
  if (length > static_cast<uint64_t>(options_.max_value_bytes)) {
    return Malformed(
        f.start, absl::StrCat(f.Describe(), " declares ", length, " bytes, more than the limit of ",
                              options_.max_value_bytes, " (max_value_bytes); the file is corrupt"));
  }
  const int64_t limit = offset_ + static_cast<int64_t>(length);
  while (offset_ < limit) {
    const int64_t key_start = offset_;
    CKPT_ASSIGN_OR_RETURN(const uint64_t key,
                          ReadVarint(limit, [&] {
                            return absl::StrCat("a field key of ", f.Describe());
                          }));
    const uint64_t field = key >> 3;
    const uint64_t wire = key & 7;
    if (field >= 1 && field <= 3 && wire != kLengthDelimited) {
      return Malformed(key_start, absl::StrCat("field ", field, " of ", f.Describe(),
                                               " has wire type ", wire, ", expected 2"));
    }
    if (field == 1) {
      // Worded before the tag is read: f.Describe() names the Value by its tag once it has one.
      const std::string described = f.Describe();
      auto what = [&] { return absl::StrCat("the tag of ", described); };
      CKPT_ASSIGN_OR_RETURN(const int64_t n, ReadLength(limit, what));
      f.tag.emplace();
      CKPT_RETURN_IF_ERROR(ReadBytes(n, &*f.tag, what));
    } else if (field == 2) {
      CKPT_ASSIGN_OR_RETURN(const int64_t n,
                            ReadLength(limit, [&] {
                              return absl::StrCat("the tensor of ", f.Describe());
                            }));
      // A repeated embedded message merges into the earlier one, as in protobuf.
      f.has_tensor = true;
      CKPT_RETURN_IF_ERROR(ParseTensorFields(offset_ + n, &f));
    } else if (field == 3) {
      auto what = [&] { return absl::StrCat("the maptensor of ", f.Describe()); };
      CKPT_ASSIGN_OR_RETURN(const int64_t n, ReadLength(limit, what));
      // Skipped rather than rejected here so that the error can name the tag written after it.
      CKPT_RETURN_IF_ERROR(Skip(n, what));
      f.has_maptensor = true;
    } else {
      CKPT_RETURN_IF_ERROR(SkipField(key, limit, [&] { return f.Describe(); }));
    }
  }
  CKPT_ASSIGN_OR_RETURN(CkptTensor t, ValueTensor(f));
  return t;
}

absl::StatusOr<CkptTensor> CkptReader::ValueTensor(ValueFields& f) const {
  if (f.has_maptensor) {
    return absl::UnimplementedError(absl::StrCat(
        source_->Describe(), ": ", f.Describe(),
        " holds a map tensor (MapParameter / hash embedding), which ckptd does not support"));
  }
  if (!f.tag) {
    return Malformed(f.start, absl::StrCat(f.Describe(), " has no tag (required field 1)"));
  }
  if (!f.has_tensor) {
    return Malformed(f.start, absl::StrCat(f.Describe(), " has no tensor (field 2)"));
  }
  if (!f.tensor_type) {
    return Malformed(
        f.start, absl::StrCat("the tensor of ", f.Describe(), " has no tensor_type (required)"));
  }
  if (!f.has_content) {
    return Malformed(
        f.start, absl::StrCat("the tensor of ", f.Describe(), " has no tensor_content (required)"));
  }
  absl::StatusOr<DType> dtype = ParseDType(*f.tensor_type);
  if (!dtype.ok()) {
    return Malformed(f.start, absl::StrCat(f.Describe(), ": ", dtype.status().message()));
  }
  CkptTensor t;
  t.name = std::move(*f.tag);
  t.dtype = *dtype;
  t.dims = std::move(f.dims);
  t.data = std::move(f.content);
  return t;
}

absl::StatusOr<std::optional<CkptTensor>> CkptReader::NextValue() {
  CKPT_RETURN_IF_ERROR(status_);
  if (pending_) {
    std::optional<CkptTensor> value = std::move(pending_);
    pending_.reset();
    return value;
  }
  absl::StatusOr<std::optional<CkptTensor>> value = ParseNextValue();
  if (!value.ok()) status_ = value.status();
  return value;
}

absl::StatusOr<std::optional<CkptTensor>> CkptReader::NextTensor() {
  CKPT_ASSIGN_OR_RETURN(std::optional<CkptTensor> first, NextValue());
  if (!first) return std::nullopt;
  CkptTensor tensor = std::move(*first);

  // When dims × dtype are meaningful, a join that grows past them is corrupt: stop early instead
  // of concatenating arbitrarily many chunks first.
  std::optional<int64_t> expected;
  if (tensor.dtype != DType::kStr) {
    absl::StatusOr<int64_t> elements = NumElements(tensor.shape());
    if (elements.ok()) {
      absl::StatusOr<int64_t> bytes = ByteSizeOf(tensor.dtype, *elements);
      if (bytes.ok()) expected = *bytes;
    }
  }

  for (int chunk = 2;; ++chunk) {
    if (expected && static_cast<int64_t>(tensor.data.size()) > *expected) break;
    const int64_t chunk_start = offset_;
    CKPT_ASSIGN_OR_RETURN(std::optional<CkptTensor> next, NextValue());
    if (!next) break;
    if (next->name != tensor.name) {
      pending_ = std::move(next);
      break;
    }
    if (next->dims != tensor.dims || next->dtype != tensor.dtype) {
      status_ = absl::InvalidArgumentError(absl::StrCat(
          source_->Describe(), ": tensor ", Quoted(tensor.name), ": chunk ", chunk,
          " (Value at offset ", chunk_start, ") has ", Sv(DTypeName(next->dtype)), " dims ",
          ShapeToString(next->dims), " but chunk 1 has ", Sv(DTypeName(tensor.dtype)), " dims ",
          ShapeToString(tensor.dims), "; every chunk must repeat the full dims and dtype"));
      return status_;
    }
    tensor.data.append(next->data);
  }
  absl::Status size_ok = CheckContentSize(tensor.name, tensor.dtype, tensor.dims,
                                          static_cast<int64_t>(tensor.data.size()));
  if (!size_ok.ok()) {
    status_ = Prefixed(size_ok, absl::StrCat(source_->Describe(), ": "));
    return status_;
  }
  return tensor;
}

// ---------------------------------------------------------------------------------------------
// CkptWriter

CkptWriter::CkptWriter(ByteSink* sink, CkptWriterOptions options)
    : sink_(sink), options_(options) {}

absl::Status CkptWriter::Emit(std::string_view bytes) {
  absl::Status s = sink_->Write(bytes);
  if (!s.ok()) {
    status_ = s;
    return s;
  }
  if (options_.crc_trailer) crc_ = UpdateCrc(crc_, bytes.data(), bytes.size());
  bytes_written_ += static_cast<int64_t>(bytes.size());
  return absl::OkStatus();
}

absl::Status CkptWriter::StartChunk() {
  const int64_t chunk = std::min(options_.slice_bytes, remaining_total_);
  CKPT_RETURN_IF_ERROR(Emit(EncodeValueHeader(name_, dtype_, dims_, static_cast<uint64_t>(chunk))));
  remaining_chunk_ = chunk;
  if (remaining_total_ == 0) open_ = false;  // an empty tensor is one Value with no content
  return absl::OkStatus();
}

absl::Status CkptWriter::WriteTensor(std::string_view name, DType dtype,
                                     const std::vector<int64_t>& dims, std::string_view data) {
  CKPT_RETURN_IF_ERROR(BeginTensor(name, dtype, dims, static_cast<int64_t>(data.size())));
  if (data.empty()) return absl::OkStatus();
  return Append(data);
}

absl::Status CkptWriter::BeginTensor(std::string_view name, DType dtype,
                                     const std::vector<int64_t>& dims, int64_t total_bytes) {
  CKPT_RETURN_IF_ERROR(status_);
  if (finished_) {
    return absl::FailedPreconditionError(
        absl::StrCat("CkptWriter: BeginTensor(", Quoted(name), ") after Finish()"));
  }
  if (open_) {
    return absl::FailedPreconditionError(
        absl::StrCat("CkptWriter: BeginTensor(", Quoted(name), ") while tensor ", Quoted(name_),
                     " still expects ", remaining_total_, " bytes"));
  }
  if (options_.slice_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CkptWriter: slice_bytes must be positive, got ", options_.slice_bytes));
  }
  if (total_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("CkptWriter: tensor ", Quoted(name),
                                                   " announces a negative size ", total_bytes));
  }
  if (dims.size() > kMaxDims) {
    return absl::InvalidArgumentError(absl::StrCat("CkptWriter: tensor ", Quoted(name), " has ",
                                                   dims.size(), " dims; at most ", kMaxDims,
                                                   " are supported"));
  }
  CKPT_RETURN_IF_ERROR(CheckContentSize(name, dtype, dims, total_bytes));
  name_ = std::string(name);
  dtype_ = dtype;
  dims_ = dims;
  remaining_total_ = total_bytes;
  remaining_chunk_ = 0;
  open_ = true;
  return StartChunk();
}

absl::Status CkptWriter::Append(std::string_view bytes) {
  CKPT_RETURN_IF_ERROR(status_);
  if (!open_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CkptWriter: Append of ", bytes.size(), " bytes without an open tensor (BeginTensor)"));
  }
  if (static_cast<int64_t>(bytes.size()) > remaining_total_) {
    return absl::InvalidArgumentError(
        absl::StrCat("CkptWriter: Append of ", bytes.size(), " bytes to tensor ", Quoted(name_),
                     " exceeds the ", remaining_total_, " bytes it still expects"));
  }
  while (!bytes.empty()) {
    if (remaining_chunk_ == 0) CKPT_RETURN_IF_ERROR(StartChunk());
    const size_t k = static_cast<size_t>(
        std::min<int64_t>(remaining_chunk_, static_cast<int64_t>(bytes.size())));
    CKPT_RETURN_IF_ERROR(Emit(bytes.substr(0, k)));
    remaining_chunk_ -= static_cast<int64_t>(k);
    remaining_total_ -= static_cast<int64_t>(k);
    bytes.remove_prefix(k);
  }
  if (remaining_total_ == 0) open_ = false;
  return absl::OkStatus();
}

absl::Status CkptWriter::Finish() {
  CKPT_RETURN_IF_ERROR(status_);
  if (finished_) return absl::FailedPreconditionError("CkptWriter: Finish() called twice");
  if (open_) {
    return absl::FailedPreconditionError(absl::StrCat("CkptWriter: Finish() while tensor ",
                                                      Quoted(name_), " still expects ",
                                                      remaining_total_, " bytes"));
  }
  if (options_.crc_trailer) {
    std::string trailer(kCrcMagic);
    trailer.append(kCrcDigitBytes - 4, '\0');
    for (int shift = 24; shift >= 0; shift -= 8) {
      trailer.push_back(static_cast<char>((crc_ >> shift) & 0xff));
    }
    // Written directly: the trailer is not part of the checksummed bytes.
    absl::Status s = sink_->Write(trailer);
    if (!s.ok()) {
      status_ = s;
      return s;
    }
    bytes_written_ += static_cast<int64_t>(trailer.size());
  }
  finished_ = true;
  return absl::OkStatus();
}

}  // namespace ckpt
