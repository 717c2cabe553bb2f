// Fuzz target: the MindSpore .ckpt decoder (core/ckpt_format.h) on arbitrary bytes, both through
// the whole-tensor path (DecodeCkpt) and Value by Value, with and without CRC verification. Any
// input must give tensors or a status; a crash, leak or undefined behaviour is a finding.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/byte_stream.h"
#include "core/ckpt_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  // The reader's defaults, as ckptd and ckptctl use them.
  ckpt::CkptReaderOptions options;
  auto tensors = ckpt::DecodeCkpt(bytes, options);
  if (tensors.ok()) {
    for (const ckpt::CkptTensor& t : *tensors) {
      (void)t.shape();
      if (t.dtype == ckpt::DType::kStr) (void)t.StringValue();
    }
  }
  options.verify_crc = false;
  ckpt::MemoryByteSource source(bytes);
  ckpt::CkptReader reader(&source, options);
  for (int i = 0; i < 4096; ++i) {
    auto value = reader.NextValue();
    if (!value.ok() || !value->has_value()) break;
  }
  return 0;
}
