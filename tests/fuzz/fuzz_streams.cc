#include "tests/fuzz/fuzz_streams.h"

#include <cstdint>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace ckpt::fuzz {

std::vector<std::string_view> SplitRecords(std::string_view input, size_t max_records) {
  std::vector<std::string_view> records;
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(input.data()),
                                            static_cast<int>(input.size()));
  while (records.size() < max_records) {
    uint32_t length = 0;
    if (!in.ReadVarint32(&length)) break;
    const int at = in.CurrentPosition();
    if (length > input.size() - static_cast<size_t>(at)) break;
    records.push_back(input.substr(static_cast<size_t>(at), length));
    if (!in.Skip(static_cast<int>(length))) break;
  }
  return records;
}

void AppendRecord(std::string_view record, std::string* out) {
  google::protobuf::io::StringOutputStream stream(out);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.WriteVarint32(static_cast<uint32_t>(record.size()));
  coded.WriteRaw(record.data(), static_cast<int>(record.size()));
}

}  // namespace ckpt::fuzz
