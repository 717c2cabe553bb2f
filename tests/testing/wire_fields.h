// Protobuf fields in wire form, for tests that send or parse raw message bytes (forms the
// generated classes never write: repeated or out-of-order fields, unknown fields, damage).
#ifndef CKPT_TESTS_TESTING_WIRE_FIELDS_H_
#define CKPT_TESTS_TESTING_WIRE_FIELDS_H_

#include <cstdint>
#include <string>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace ckpt::testing {

// Field `field` of wire type 2 (length-delimited) holding `bytes`: tag, length, bytes.
inline std::string Field(int field, const std::string& bytes) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.WriteTag(static_cast<uint32_t>(field << 3 | 2));
    coded.WriteVarint32(static_cast<uint32_t>(bytes.size()));
    coded.WriteString(bytes);
  }
  return out;
}

// Field `field` of wire type 0 holding the varint `value`.
inline std::string VarintField(int field, uint64_t value) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.WriteTag(static_cast<uint32_t>(field << 3));
    coded.WriteVarint64(value);
  }
  return out;
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_TESTING_WIRE_FIELDS_H_
