#include "service/engine/upload_wire.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"

namespace ckpt {
namespace {

using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;

// Field numbers of proto/ckpt.proto.
constexpr int kRequestData = 3;   // UploadRequest.data (bytes)
constexpr int kRequestBatch = 4;  // UploadRequest.batch (UploadTensorBatch)
constexpr int kBatchTensors = 1;  // UploadTensorBatch.tensors (repeated UploadTensor)
constexpr int kTensorHeader = 1;  // UploadTensor.header (UploadTensorHeader)
constexpr int kTensorData = 2;    // UploadTensor.data (bytes)

constexpr WireFormatLite::WireType kLengthDelimited = WireFormatLite::WIRETYPE_LENGTH_DELIMITED;

absl::Status Malformed(const std::string& what, int offset) {
  return absl::InvalidArgumentError(absl::StrCat(
      "malformed upload message (not a ckpt.v1.UploadRequest): ", what, " at byte ", offset));
}

// A CodedInputStream over one message's bytes, with views of its length-delimited fields.
class WireReader {
 public:
  explicit WireReader(std::string_view bytes)
      : bytes_(bytes),
        in_(reinterpret_cast<const uint8_t*>(bytes.data()), static_cast<int>(bytes.size())) {}

  // The next field's tag, or 0 at the end of the innermost limit (the message, or the field
  // entered). Bytes that are no valid tag are an error.
  absl::StatusOr<uint32_t> NextTag() {
    if (in_.BytesUntilLimit() == 0) return 0;
    const int at = in_.CurrentPosition();
    const uint32_t tag = in_.ReadTag();
    if (tag == 0) return Malformed("bytes that are no field tag (0, truncated or overlong)", at);
    if (WireFormatLite::GetTagFieldNumber(tag) == 0) return Malformed("field number 0", at);
    if (WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_END_GROUP) {
      return Malformed("a group end without its start", at);
    }
    return tag;
  }

  // The bytes of the length-delimited field whose tag was just read. With `enter`, the stream
  // then reads the fields inside them, up to Leave(); otherwise it moves past them.
  absl::StatusOr<std::string_view> LengthDelimited(uint32_t tag, bool enter = false) {
    const int at = in_.CurrentPosition();
    uint64_t length = 0;
    if (!in_.ReadVarint64(&length)) {
      return Malformed(absl::StrCat("a truncated or overlong length of field ", FieldNumber(tag)),
                       at);
    }
    const int start = in_.CurrentPosition();
    const auto left = static_cast<uint64_t>(in_.BytesUntilLimit());
    if (length > left) {
      return Malformed(absl::StrCat("field ", FieldNumber(tag), " claiming ", length,
                                    " bytes where ", left, " are left"),
                       at);
    }
    if (enter) {
      limits_.push_back(in_.PushLimit(static_cast<int>(length)));
    } else {
      in_.Skip(static_cast<int>(length));
    }
    return bytes_.substr(static_cast<size_t>(start), static_cast<size_t>(length));
  }

  // Back to the fields around the one entered last (LengthDelimited with `enter`), whose fields
  // were all read.
  void Leave() {
    in_.PopLimit(limits_.back());
    limits_.pop_back();
  }

  // Moves past the field whose tag was just read (one whose contents are not used).
  absl::Status Skip(uint32_t tag) {
    const int at = in_.CurrentPosition();
    if (!WireFormatLite::SkipField(&in_, tag)) {
      return Malformed(absl::StrCat("field ", FieldNumber(tag), " of wire type ",
                                    WireFormatLite::GetTagWireType(tag),
                                    ", truncated or of no protobuf wire type,"),
                       at);
    }
    return absl::OkStatus();
  }

  static int FieldNumber(uint32_t tag) { return WireFormatLite::GetTagFieldNumber(tag); }
  static bool IsLengthDelimited(uint32_t tag) {
    return WireFormatLite::GetTagWireType(tag) == kLengthDelimited;
  }

 private:
  const std::string_view bytes_;
  CodedInputStream in_;
  std::vector<CodedInputStream::Limit> limits_;
};

// The tensors of the UploadTensorBatch entered in `in`, appended to `tensors`. `plain` is cleared
// when a tensor is in a form left to protobuf.
absl::Status ReadBatch(WireReader& in, std::vector<UploadTensorView>* tensors, bool* plain) {
  for (;;) {
    CKPT_ASSIGN_OR_RETURN(const uint32_t tag, in.NextTag());
    if (tag == 0) return absl::OkStatus();
    if (WireReader::FieldNumber(tag) != kBatchTensors) {
      CKPT_RETURN_IF_ERROR(in.Skip(tag));  // unknown to this version: protobuf skips it too
      continue;
    }
    if (!WireReader::IsLengthDelimited(tag)) {
      *plain = false;
      CKPT_RETURN_IF_ERROR(in.Skip(tag));
      continue;
    }
    CKPT_RETURN_IF_ERROR(in.LengthDelimited(tag, /*enter=*/true).status());
    UploadTensorView tensor;
    bool header = false;
    for (;;) {
      CKPT_ASSIGN_OR_RETURN(const uint32_t field, in.NextTag());
      if (field == 0) break;
      const int number = WireReader::FieldNumber(field);
      const bool known = number == kTensorHeader || number == kTensorData;
      if (known && WireReader::IsLengthDelimited(field)) {
        CKPT_ASSIGN_OR_RETURN(const std::string_view bytes, in.LengthDelimited(field));
        if (number == kTensorData) {
          tensor.data = bytes;  // a repeated bytes field: the last one counts
        } else if (header) {
          *plain = false;  // a repeated message field: protobuf merges the parts
        } else {
          tensor.header = bytes;
          header = true;
        }
        continue;
      }
      if (known) *plain = false;  // another wire type for a known field
      CKPT_RETURN_IF_ERROR(in.Skip(field));
    }
    in.Leave();
    tensors->push_back(tensor);
  }
}

}  // namespace

absl::StatusOr<UploadWireKind> ReadUploadMessage(std::string_view message,
                                                 UploadMessageViews* out) {
  out->data = {};
  out->tensors.clear();
  if (message.size() > static_cast<size_t>(INT_MAX)) {
    return absl::InvalidArgumentError(
        absl::StrCat("upload message of ", message.size(), " bytes is too large"));
  }
  WireReader in(message);
  int fields = 0;
  bool plain = true;
  UploadWireKind kind = UploadWireKind::kOther;
  for (;;) {
    CKPT_ASSIGN_OR_RETURN(const uint32_t tag, in.NextTag());
    if (tag == 0) break;
    ++fields;
    const int number = WireReader::FieldNumber(tag);
    if (number == kRequestData && WireReader::IsLengthDelimited(tag)) {
      CKPT_ASSIGN_OR_RETURN(out->data, in.LengthDelimited(tag));
      kind = UploadWireKind::kData;
    } else if (number == kRequestBatch && WireReader::IsLengthDelimited(tag)) {
      CKPT_RETURN_IF_ERROR(in.LengthDelimited(tag, /*enter=*/true).status());
      out->tensors.clear();
      CKPT_RETURN_IF_ERROR(ReadBatch(in, &out->tensors, &plain));
      in.Leave();
      kind = UploadWireKind::kBatch;
    } else {
      CKPT_RETURN_IF_ERROR(in.Skip(tag));
      kind = UploadWireKind::kOther;
    }
  }
  if (fields != 1 || !plain || kind == UploadWireKind::kOther) {
    out->data = {};
    out->tensors.clear();
    return UploadWireKind::kOther;
  }
  return kind;
}

size_t UploadDataOffset(std::string_view head, size_t message_size) {
  CodedInputStream in(reinterpret_cast<const uint8_t*>(head.data()),
                      static_cast<int>(std::min<size_t>(head.size(), 16)));
  uint64_t length = 0;
  if (in.ReadTag() != WireFormatLite::MakeTag(kRequestData, kLengthDelimited) ||
      !in.ReadVarint64(&length)) {
    return 0;
  }
  const auto offset = static_cast<size_t>(in.CurrentPosition());
  return length == message_size - offset ? offset : 0;
}

}  // namespace ckpt
