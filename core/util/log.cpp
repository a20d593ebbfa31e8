#include "core/util/log.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace ember {
namespace {

std::mutex g_log_mutex;
LogCallback g_callback = nullptr;
void* g_user_data = nullptr;

int stderr_threshold() {
  static const int level = [] {
    const char* env = std::getenv("EMBER_LOG_LEVEL");
    return env ? std::atoi(env) : static_cast<int>(LogLevel::kWarn);
  }();
  return level;
}

}  // namespace

void set_log_callback(LogCallback cb, void* user_data) {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  g_callback = cb;
  g_user_data = user_data;
}

void log(LogLevel level, const char* fmt, ...) {
  char buf[1024];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, args);
  va_end(args);
  std::lock_guard<std::mutex> lock(g_log_mutex);
  if (g_callback) {
    g_callback(static_cast<int>(level), buf, g_user_data);
  } else if (static_cast<int>(level) >= stderr_threshold()) {
    static const char* names[] = {"debug", "info", "warn", "error"};
    std::fprintf(stderr, "ember [%s] %s\n", names[static_cast<int>(level)], buf);
  }
}

}  // namespace ember
