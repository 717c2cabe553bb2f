// DecodeCkpt and EncodeCkpt (ckpt_format.h): a whole .ckpt in memory, through the streaming
// CkptReader and CkptWriter.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/byte_stream.h"
#include "core/ckpt_format.h"
#include "core/status_macros.h"

namespace ckpt {

absl::StatusOr<std::vector<CkptTensor>> DecodeCkpt(std::string_view bytes,
                                                   CkptReaderOptions options) {
  MemoryByteSource source(bytes);
  CkptReader reader(&source, options);
  std::vector<CkptTensor> tensors;
  for (;;) {
    CKPT_ASSIGN_OR_RETURN(std::optional<CkptTensor> tensor, reader.NextTensor());
    if (!tensor) break;
    tensors.push_back(std::move(*tensor));
  }
  return tensors;
}

absl::StatusOr<std::string> EncodeCkpt(const std::vector<CkptTensor>& tensors,
                                       CkptWriterOptions options) {
  StringByteSink sink;
  CkptWriter writer(&sink, options);
  for (const CkptTensor& t : tensors) {
    CKPT_RETURN_IF_ERROR(writer.WriteTensor(t.name, t.dtype, t.dims, t.data));
  }
  CKPT_RETURN_IF_ERROR(writer.Finish());
  return sink.Release();
}

}  // namespace ckpt
