# Runs ckpt_bench on a ~16 MiB checkpoint and checks that the results JSON has every key of
# the harness (values may be null where the server lacks a feature; the harness then says why).
# Usage: cmake -DBENCH=<ckpt_bench> -DOUT=<results.json> -P bench_smoke.cmake
file(REMOVE "${OUT}")
execute_process(
  COMMAND "${BENCH}" --size-gib 0.015625 --out "${OUT}"
  RESULT_VARIABLE rc
  OUTPUT_VARIABLE out
  ERROR_VARIABLE err)
message("${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "ckpt_bench exited with ${rc}\n${err}")
endif()
if(NOT EXISTS "${OUT}")
  message(FATAL_ERROR "ckpt_bench wrote no ${OUT}")
endif()
file(READ "${OUT}" json)

function(require)
  string(JSON value ERROR_VARIABLE error GET "${json}" ${ARGN})
  if(error)
    string(REPLACE ";" "." path "${ARGN}")
    message(FATAL_ERROR "results JSON lacks ${path}: ${error}")
  endif()
endfunction()

foreach(key transport_gibps storage_gibps fetch concurrent storm transform deps_all_ranks_ms upload
            tls many_tensors growth)
  require(${key})
endforeach()
foreach(key cpu_model cpu_steal_fraction cpu_speeds_start cpu_speeds_end)
  require(config ${key})
endforeach()
foreach(key workers gibps server_peak_rss_mib warmup_gibps)
  require(concurrent ${key})
endforeach()
foreach(key workers gibps ratio read_amplification slowest_over_median server_peak_rss_mib)
  require(storm ${key})
endforeach()
foreach(key seconds peak_rss_mib baseline_seconds baseline_peak_rss_mib)
  require(transform ${key})
endforeach()
foreach(key gibps disk_write_gibps store_write_gibps first_pass_gibps)
  require(upload ${key})
endforeach()

string(JSON cases LENGTH "${json}" fetch)
if(NOT cases EQUAL 4)
  message(FATAL_ERROR "expected 4 fetch cases, got ${cases}")
endif()
math(EXPR last "${cases} - 1")
foreach(i RANGE ${last})
  foreach(key case gibps ratio read_amplification warmup_gibps)
    require(fetch ${i} ${key})
  endforeach()
  # Each case: an unmeasured warm-up pass, then 3 measured passes.
  string(JSON passes LENGTH "${json}" fetch ${i} passes_gibps)
  if(NOT passes EQUAL 3)
    message(FATAL_ERROR "results JSON: fetch ${i} passes_gibps has ${passes} entries, expected 3")
  endif()
  string(JSON type TYPE "${json}" fetch ${i} warmup_gibps)
  if(NOT type STREQUAL "NUMBER")
    message(FATAL_ERROR "fetch ${i} warmup_gibps is ${type}, expected a number")
  endif()
endforeach()

# Figures that need no optional server feature (GetStats, transform jobs) must be real numbers.
foreach(path "transport_gibps" "verified_read_ceiling;gibps" "storage_gibps" "deps_all_ranks_ms"
             "upload;gibps" "upload;disk_write_gibps" "upload;store_write_gibps"
             "upload;first_pass_gibps"
             "concurrent;gibps" "concurrent;warmup_gibps" "transform;baseline_seconds"
             "storm;gibps" "storm;ratio" "storm;read_amplification" "storm;slowest_over_median"
             "storm;server_peak_rss_mib"
             "python;gibps" "python;ratio_to_cpp" "python;peak_rss_bytes" "python;max_rank_bytes"
             "python;server_cpu_s_per_gib" "python;cpu_bound_ratio"
             "tls;ratio" "tls;aes_256_gcm_gibps"
             "many_tensors;tensors" "many_tensors;ttfb_ms" "many_tensors;ratio"
             "many_tensors;deps_ms" "many_tensors;upload_ratio"
             "many_tensors;strategy_register_s" "many_tensors;cold_start;seconds"
             "many_tensors;cold_start;server_cpu_s" "many_tensors;cold_start;server_peak_rss_mib")
  string(JSON type TYPE "${json}" ${path})
  if(NOT type STREQUAL "NUMBER")
    message(FATAL_ERROR "${path} is ${type}, expected a number")
  endif()
endforeach()
# The transport limit's passes run through the fetch phase (3 of its own, one before each of the
# 4 cases' 3 passes, each of the concurrent phase's 3 and each of the storm's 3); the storage
# limit, the concurrent phase, the storm, the transform job, the baseline and the direct disk
# write run 3 passes each (the fetch cases, the concurrent phase and the storm after an
# unmeasured warm-up pass, which gets no transport pass).
foreach(check "transport_passes_gibps;21" "storage_passes_gibps;3" "concurrent;runs_gibps;3"
              "storm;passes_gibps;3"
              "transform;runs_seconds;3" "transform;baseline_runs_seconds;3"
              "upload;disk_write_runs_gibps;3" "python;passes_gibps;3")
  list(POP_BACK check want)
  string(JSON got ERROR_VARIABLE error LENGTH "${json}" ${check})
  if(error)
    message(FATAL_ERROR "results JSON: ${check}: ${error}")
  elseif(NOT got EQUAL want)
    message(FATAL_ERROR "results JSON: ${check} has ${got} entries, expected ${want}")
  endif()
endforeach()
# The growth case: 3 byte sizes x (upload, fetch, transform), 3 tensor counts x (upload, fetch),
# 4 destination-rank counts of planning; each entry with its keys and a positive time.
string(JSON growth ERROR_VARIABLE error LENGTH "${json}" growth)
if(error OR NOT growth EQUAL 19)
  message(FATAL_ERROR "results JSON: growth has ${growth} entries, expected 19 ${error}")
endif()
foreach(i RANGE 18)
  foreach(key case series op size seconds peak_rss_mib)
    require(growth ${i} ${key})
  endforeach()
  string(JSON seconds GET "${json}" growth ${i} seconds)
  if(NOT seconds GREATER 0)
    message(FATAL_ERROR "results JSON: growth ${i} seconds is ${seconds}")
  endif()
endforeach()
message(STATUS "bench_smoke: every key present")
