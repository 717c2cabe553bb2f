// The fuzz inputs of the stream targets (fetch_wire, upload): a sequence of messages, each a
// varint length then that many bytes, as protobuf's delimited streams are written. Parsed with
// libprotobuf's CodedInputStream; a trailing partial record is dropped.
#ifndef CKPT_TESTS_FUZZ_FUZZ_STREAMS_H_
#define CKPT_TESTS_FUZZ_FUZZ_STREAMS_H_

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace ckpt::fuzz {

// The records of `input`, at most `max_records` (views into `input`).
std::vector<std::string_view> SplitRecords(std::string_view input, size_t max_records);
// Appends `record` to `out` as one record.
void AppendRecord(std::string_view record, std::string* out);

}  // namespace ckpt::fuzz

#endif  // CKPT_TESTS_FUZZ_FUZZ_STREAMS_H_
