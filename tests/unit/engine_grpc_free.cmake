cmake_minimum_required(VERSION 3.25)
# The service's engine (service/engine) stays free of gRPC: no source file under it includes a
# gRPC header (grpc/, grpcpp/ or a generated *.grpc.pb.h), and nothing ckpt::engine links,
# directly or through its dependencies, is a gRPC library.
# Usage: cmake -DENGINE_DIR=<service/engine> -DENGINE_LINKS=<a,b,...> -P engine_grpc_free.cmake
# ENGINE_LINKS is ckpt_engine's link closure as tests/CMakeLists.txt computed it at configure time.
file(GLOB_RECURSE sources "${ENGINE_DIR}/*.h" "${ENGINE_DIR}/*.cc")
list(LENGTH sources source_count)
if(source_count EQUAL 0)
  message(FATAL_ERROR "no sources under ENGINE_DIR='${ENGINE_DIR}'")
endif()
set(problems "")
foreach(file IN LISTS sources)
  file(STRINGS "${file}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"][^>\"]*grpc")
  foreach(line IN LISTS lines)
    list(APPEND problems "${file} includes a gRPC header: ${line}")
  endforeach()
endforeach()

string(REPLACE "," ";" links "${ENGINE_LINKS}")
if(NOT "ckpt_engine" IN_LIST links)
  message(FATAL_ERROR "ENGINE_LINKS must be ckpt_engine's link closure, got '${ENGINE_LINKS}'")
endif()
foreach(item IN LISTS links)
  string(TOLOWER "${item}" lower)
  if(lower MATCHES "grpc")
    list(APPEND problems "ckpt::engine links ${item}")
  endif()
endforeach()

if(problems)
  list(JOIN problems "\n  " text)
  message(FATAL_ERROR "service/engine must not depend on gRPC:\n  ${text}")
endif()
list(LENGTH links link_count)
message(STATUS "service/engine: ${source_count} files without gRPC includes; ${link_count} linked items without gRPC")
