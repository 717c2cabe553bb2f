// CKPT_SANITIZED: defined (as 1) in a build instrumented with AddressSanitizer or ThreadSanitizer
// (`make test-asan`, `make test-tsan`, `make fuzz`), where the sanitizer's allocator replaces the C
// library's malloc and code runs several times slower. GCC defines __SANITIZE_ADDRESS__ and
// __SANITIZE_THREAD__; clang 14 reports the sanitizers through __has_feature only.
#ifndef CKPT_CORE_SANITIZERS_H_
#define CKPT_CORE_SANITIZERS_H_

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define CKPT_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define CKPT_SANITIZED 1
#endif
#endif

#endif  // CKPT_CORE_SANITIZERS_H_
