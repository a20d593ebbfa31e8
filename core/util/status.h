// Internal error type. Core code reports failures by throwing ember::Error;
// the C ABI (capi/) catches everything at the boundary and turns it into an
// ember_status plus a thread-local message. Nothing else crosses the ABI.
#pragma once

#include <cstdint>
#include <exception>
#include <string>

namespace ember {

// Values match enum ember_status in include/ember/ember.h.
enum class StatusCode : int32_t {
  kOk = 0,
  kInvalidArgument = 1,
  kNotFound = 2,  // missing file, missing key, I/O failure
  kBadFormat = 3,
  kUnsupported = 4,
  kOutOfMemory = 5,
  kContextFull = 6,
  kBusy = 7,
  kCancelled = 8,
  kTimeout = 9,
  kInternal = 10,
  kEndOfStream = 11,
};

class Error : public std::exception {
 public:
  Error(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  StatusCode code() const noexcept { return code_; }
  const char* what() const noexcept override { return message_.c_str(); }
  const std::string& message() const noexcept { return message_; }

 private:
  StatusCode code_;
  std::string message_;
};

[[noreturn]] inline void fail(StatusCode code, std::string message) { throw Error(code, std::move(message)); }

}  // namespace ember
