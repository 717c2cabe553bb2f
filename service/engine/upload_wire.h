// Reading an UploadRequest's wire form in place: the two messages that carry tensor bytes (a data
// message and a batch of whole small tensors) as views of the received bytes, without a message
// object per tensor or a copy of the bytes. Built on protobuf's CodedInputStream; the field
// numbers are those of proto/ckpt.proto. upload_wire_test checks the reader against protobuf's
// own parser, and the upload fuzz target (tests/fuzz/upload_fuzzer.cc) feeds it arbitrary bytes.
#ifndef CKPT_SERVICE_ENGINE_UPLOAD_WIRE_H_
#define CKPT_SERVICE_ENGINE_UPLOAD_WIRE_H_

#include <cstddef>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace ckpt {

// One whole tensor of an UploadTensorBatch: the wire form of its UploadTensorHeader (empty when
// the field is absent) and its bytes.
struct UploadTensorView {
  std::string_view header;
  std::string_view data;
};

// What ReadUploadMessage found.
enum class UploadWireKind {
  kData,   // UploadRequest{data}: UploadMessageViews::data holds the bytes
  kBatch,  // UploadRequest{batch}: UploadMessageViews::tensors holds its tensors, in order
  kOther,  // well-formed, but a form left to protobuf's parser (see ReadUploadMessage)
};

// Views into the bytes given to ReadUploadMessage (valid while they are). `tensors` keeps its
// capacity from message to message when the same object is reused.
struct UploadMessageViews {
  std::string_view data;
  std::vector<UploadTensorView> tensors;
};

// Reads the UploadRequest whose whole wire form is `message`. The whole message is walked before
// anything is returned:
// - kData when it is exactly one data field;
// - kBatch when it is exactly one batch field, each of whose tensors holds at most one header
//   field (fields this version does not know are skipped, and a repeated data field keeps the
//   last, as protobuf does);
// - kOther for every other well-formed form: a stream or tensor header, several top-level
//   fields, a tensor with its header in several fields (protobuf merges them), a known field
//   number with another wire type. The caller parses those with protobuf.
// INVALID_ARGUMENT, naming the problem and its byte offset, when `message` is not protobuf wire
// format at all (a truncated field or varint, a length past the end, field number 0, wire type 6
// or 7): protobuf's parser refuses those too. A tensor's header bytes are not parsed here.
absl::StatusOr<UploadWireKind> ReadUploadMessage(std::string_view message, UploadMessageViews* out);

// When a message of `message_size` bytes that begins with `head` (its first bytes: up to 11 are
// looked at, fewer when the message is shorter) is exactly UploadRequest{data}, the offset of the
// data's first byte; 0 otherwise. Lets a data message spread over many buffers be read in place
// from its first bytes alone.
size_t UploadDataOffset(std::string_view head, size_t message_size);

}  // namespace ckpt

#endif  // CKPT_SERVICE_ENGINE_UPLOAD_WIRE_H_
