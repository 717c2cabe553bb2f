# `ckptd --version` and `ckptctl --version` print "<name> <project version>" on stdout, nothing
# on stderr, and exit 0.
# Usage: cmake -DCKPTD=<ckptd> -DCKPTCTL=<ckptctl> -DVERSION=<project version> -P version_flags.cmake
if(NOT VERSION MATCHES "^[0-9]+\\.[0-9]+\\.[0-9]+")
  message(FATAL_ERROR "VERSION must be the project version, got '${VERSION}'")
endif()
foreach(name ckptd ckptctl)
  string(TOUPPER "${name}" var)
  execute_process(
    COMMAND "${${var}}" --version
    RESULT_VARIABLE rc
    OUTPUT_VARIABLE out
    ERROR_VARIABLE err)
  if(NOT rc STREQUAL "0")
    message(FATAL_ERROR "${name} --version exited with '${rc}' (expected 0)\nstdout: ${out}\nstderr: ${err}")
  endif()
  if(NOT out STREQUAL "${name} ${VERSION}\n")
    message(FATAL_ERROR "${name} --version printed '${out}', expected '${name} ${VERSION}' and a newline")
  endif()
  if(NOT err STREQUAL "")
    message(FATAL_ERROR "${name} --version wrote to stderr: ${err}")
  endif()
  message(STATUS "${name} --version: ${out}")
endforeach()
