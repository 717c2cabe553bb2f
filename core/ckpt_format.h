// MindSpore .ckpt codec: a file is a concatenation of one-Value `Checkpoint` messages,
// optionally followed by a `crc_num` trailer. Streaming in both directions: the reader holds at
// most one Value (plus the join of one tensor's consecutive chunks when asked), the writer never
// needs a whole tensor.
#ifndef CKPT_CORE_CKPT_FORMAT_H_
#define CKPT_CORE_CKPT_FORMAT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/box.h"
#include "core/byte_stream.h"
#include "core/dtype.h"

namespace ckpt {

// MindSpore's SLICE_SIZE: tensors larger than this are written as several Values.
inline constexpr int64_t kCkptSliceBytes = int64_t{512} * 1024 * 1024;

// One decoded tensor (or, from NextValue, one chunk of one).
struct CkptTensor {
  std::string name;
  DType dtype = DType::kFloat32;
  // dims exactly as stored (kept for byte-identical re-encoding; may be [0] for scalars/str).
  std::vector<int64_t> dims;
  std::string data;  // row-major little-endian element bytes

  // The logical shape: dims, except that [0] for a non-str tensor and any str tensor are
  // scalars () as MindSpore's reader treats them.
  Shape shape() const;
  // For str tensors: the UTF-32LE content decoded to UTF-8.
  absl::StatusOr<std::string> StringValue() const;
};

struct CkptReaderOptions {
  // Largest single Value accepted; a larger length prefix is reported as corruption before any
  // allocation. Default 2 GiB (MindSpore writes ≤ 512 MiB per Value).
  int64_t max_value_bytes = int64_t{2} << 30;
  // Verify the crc_num trailer when present (a mismatch is DATA_LOSS).
  bool verify_crc = true;
};

// Streams Values out of a ByteSource. Not thread-safe; the source must outlive the reader.
// Errors: INVALID_ARGUMENT for a malformed or truncated stream, with the byte offset and the
// tensor name when known; DATA_LOSS for a CRC mismatch; UNIMPLEMENTED for map tensors.
class CkptReader {
 public:
  explicit CkptReader(ByteSource* source, CkptReaderOptions options = {});

  // The next raw Value (one chunk), or nullopt at a clean end of stream (after a verified
  // trailer, if any). Checks dims × dtype size against the content only for whole tensors, i.e.
  // not here.
  absl::StatusOr<std::optional<CkptTensor>> NextValue();
  // The next tensor with consecutive same-tag Values joined, validated: same dims and dtype
  // in every chunk, content size = elements × element size (str: multiple of 4).
  absl::StatusOr<std::optional<CkptTensor>> NextTensor();

  // Bytes consumed so far; whether a crc_num trailer was seen (valid after the end).
  int64_t offset() const { return offset_; }
  bool had_crc_trailer() const { return had_crc_; }

 private:
  struct ValueFields;  // fields of the Value being parsed (defined in the .cc)

  absl::Status Fill(size_t n);  // ensure buffer has >= n unread bytes, or fewer only at EOF
  absl::StatusOr<std::optional<CkptTensor>> ParseNextValue();
  // Low-level reads; every consumed byte goes through the CRC and advances offset_. `limit` is the
  // offset where the enclosing message ends; `what` names the item for error messages.
  size_t Available() const { return buffer_.size() - buffer_pos_; }
  void Consume(size_t n);
  // `what` (and `context`) are called only to word an error: a Value of a small tensor would
  // otherwise cost a dozen formatted strings.
  using Words = absl::FunctionRef<std::string()>;
  absl::StatusOr<uint64_t> ReadVarint(int64_t limit, Words what);
  absl::StatusOr<int64_t> ReadLength(int64_t limit, Words what);
  absl::Status ReadBytes(int64_t n, std::string* out, Words what);
  absl::Status Skip(int64_t n, Words what);
  absl::Status SkipField(uint64_t key, int64_t limit, Words context);
  absl::Status ParseTensorFields(int64_t limit, ValueFields* fields);
  // The tensor of a parsed Value, its bytes moved out of `fields`, once the fields are checked: no
  // map tensor, every required field present, a known dtype.
  absl::StatusOr<CkptTensor> ValueTensor(ValueFields& fields) const;
  // At a record boundary starting with 'c': consumes and checks the crc_num trailer; false if
  // the bytes are not a trailer.
  absl::StatusOr<bool> ReadTrailer();
  absl::Status Malformed(int64_t at, std::string_view detail) const;
  absl::Status Truncated(std::string_view what, int64_t missing) const;  // missing 0: unknown

  ByteSource* source_;
  CkptReaderOptions options_;
  std::string buffer_;  // unread bytes start at buffer_pos_
  size_t buffer_pos_ = 0;
  bool eof_ = false;
  int64_t offset_ = 0;
  // verify_crc, unless the source showed up front that it has no trailer to verify against.
  const bool computing_crc_;
  uint32_t crc_ = 0;
  bool had_crc_ = false;
  bool done_ = false;
  std::optional<CkptTensor> pending_;  // lookahead Value for NextTensor
  absl::Status status_;  // first error; sticky because the stream position is then undefined
};

struct CkptWriterOptions {
  // Append the crc_num trailer (MindSpore's crc_check=True) on Finish().
  bool crc_trailer = false;
  // Values larger than this are split into consecutive byte chunks.
  int64_t slice_bytes = kCkptSliceBytes;
};

// Writes a .ckpt to a ByteSink, one tensor at a time, optionally streaming the tensor's bytes in
// pieces. Not thread-safe; the sink must outlive the writer.
class CkptWriter {
 public:
  explicit CkptWriter(ByteSink* sink, CkptWriterOptions options = {});

  // Whole tensor in one call. `dims` is written as given.
  absl::Status WriteTensor(std::string_view name, DType dtype, const std::vector<int64_t>& dims,
                           std::string_view data);
  // Streaming: announce a tensor of `total_bytes` (must equal dims × dtype), then Append exactly
  // that many bytes in any pieces.
  absl::Status BeginTensor(std::string_view name, DType dtype, const std::vector<int64_t>& dims,
                           int64_t total_bytes);
  absl::Status Append(std::string_view bytes);
  // Writes the trailer if asked. FAILED_PRECONDITION if a tensor is still open.
  absl::Status Finish();

  int64_t bytes_written() const { return bytes_written_; }

 private:
  absl::Status Emit(std::string_view bytes);  // to sink, updating crc and count
  absl::Status StartChunk();

  ByteSink* sink_;
  CkptWriterOptions options_;
  int64_t bytes_written_ = 0;
  uint32_t crc_ = 0;
  bool finished_ = false;
  // Open tensor state.
  bool open_ = false;
  std::string name_;
  DType dtype_ = DType::kFloat32;
  std::vector<int64_t> dims_;
  int64_t remaining_total_ = 0;  // bytes of the tensor not yet appended
  int64_t remaining_chunk_ = 0;  // bytes left in the current Value
  absl::Status status_;  // first sink error; sticky because the output is then incomplete
};

// Convenience: decode every tensor of an in-memory file.
absl::StatusOr<std::vector<CkptTensor>> DecodeCkpt(std::string_view bytes,
                                                   CkptReaderOptions options = {});
// Convenience: encode tensors into a file image.
absl::StatusOr<std::string> EncodeCkpt(const std::vector<CkptTensor>& tensors,
                                       CkptWriterOptions options = {});

}  // namespace ckpt

#endif  // CKPT_CORE_CKPT_FORMAT_H_
