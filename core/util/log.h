// Library-wide logging. Messages go to the host's callback when one is set
// (ember_set_log_callback), otherwise to stderr at or above the level set by
// EMBER_LOG_LEVEL (default: warn).
#pragma once

#include <cstdarg>

namespace ember {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

using LogCallback = void (*)(int level, const char* message, void* user_data);

void set_log_callback(LogCallback cb, void* user_data);
void log(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace ember
