// The protobuf wire format of the two messages that carry tensor bytes, written and read so that
// the bytes stay in gRPC slices instead of being copied into or out of messages. The field
// numbers are those of proto/ckpt.proto; wire_format_test checks both functions against
// protobuf's own parser and serialiser.
#ifndef CKPT_SERVICE_RPC_WIRE_FORMAT_H_
#define CKPT_SERVICE_RPC_WIRE_FORMAT_H_

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <string_view>
#include <vector>

#include "service/engine/fetch_stream.h"

namespace ckpt {

// Serialises one Fetch message (a piece for FetchReader::kClient). A data message is written as
// the wire format of FetchResponse{data: FetchData{data, part_bytes, part_checksums, tile_box,
// band_rows}} whose bytes are slices that reference the piece's segments (kept alive by their
// owners until gRPC drops them; runs of segments under 4 KiB are copied into one slice instead);
// a batch with data (its headers in the piece's batch_headers, then any in its message) as
// FetchResponse{batch: FetchTensorBatch{tensors, data, part_bytes, part_checksums}}, its data
// referenced the same way.
// Consumes `*piece`: its segments are released (their vectors keep their storage, so that a
// producer reusing one FetchPiece from message to message, as FetchStream::NextPiece allows,
// allocates them once); its other fields are left for NextPiece to clear.
grpc::ByteBuffer EncodeFetchResponse(FetchPiece* piece);
inline grpc::ByteBuffer EncodeFetchResponse(FetchPiece piece) { return EncodeFetchResponse(&piece); }

// If `buffer` is exactly the wire format of UploadRequest{data} (as the client library writes
// data messages; UploadDataOffset of service/engine/upload_wire.h decides from its first bytes),
// fills `data` with views of the bytes in `slices` (the buffer's slices, which own them) and
// returns true. Otherwise returns false: the message is read whole by ReadUploadMessage.
bool UploadDataViews(const grpc::ByteBuffer& buffer, std::vector<grpc::Slice>* slices,
                     std::vector<std::string_view>* data);

}  // namespace ckpt

#endif  // CKPT_SERVICE_RPC_WIRE_FORMAT_H_
