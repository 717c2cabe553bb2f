// Byte source/sink interfaces. core/ does no I/O itself: file-backed implementations live in
// storage/file_stream.h; in-memory ones are here.
#ifndef CKPT_CORE_BYTE_STREAM_H_
#define CKPT_CORE_BYTE_STREAM_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckpt {

// A forward-only byte stream. Not thread-safe.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Reads up to `n` bytes into `buf`; returns how many were read, 0 only at end of stream.
  virtual absl::StatusOr<size_t> Read(char* buf, size_t n) = 0;
  // A name for error messages (a file path, "<memory>").
  virtual std::string Describe() const = 0;
  // The last `n` bytes of the whole stream (fewer when it is shorter), without consuming
  // anything, where the source can tell cheaply (a regular file, memory); nullopt otherwise
  // (a pipe) or when looking fails. Lets a reader decide up front whether a trailer exists.
  virtual std::optional<std::string> Tail(size_t /*n*/) { return std::nullopt; }
};

// An append-only byte sink. Not thread-safe.
class ByteSink {
 public:
  virtual ~ByteSink() = default;
  virtual absl::Status Write(std::string_view bytes) = 0;
};

// Reads from a caller-owned buffer that must outlive it.
class MemoryByteSource final : public ByteSource {
 public:
  explicit MemoryByteSource(std::string_view data, std::string name = "<memory>")
      : data_(data), name_(std::move(name)) {}
  absl::StatusOr<size_t> Read(char* buf, size_t n) override;
  std::string Describe() const override { return name_; }
  std::optional<std::string> Tail(size_t n) override {
    return std::string(data_.substr(data_.size() - std::min(n, data_.size())));
  }

 private:
  std::string_view data_;
  size_t pos_ = 0;
  std::string name_;
};

// Appends to an owned string.
class StringByteSink final : public ByteSink {
 public:
  absl::Status Write(std::string_view bytes) override {
    data_.append(bytes);
    return absl::OkStatus();
  }
  const std::string& data() const { return data_; }
  std::string Release() { return std::move(data_); }

 private:
  std::string data_;
};

}  // namespace ckpt

#endif  // CKPT_CORE_BYTE_STREAM_H_
