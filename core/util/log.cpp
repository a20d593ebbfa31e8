#include "core/util/log.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace ember {
namespace {

// g_call_mutex: one callback call at a time (and set_log_callback waits for
// a call in progress). g_config_mutex: the callback and its user data.
// Order: call, then config. A callback may call back into Ember: setting the
// callback from inside it takes only the config lock, and a message logged
// from inside it (same thread) goes to stderr instead of re-entering.
std::mutex g_call_mutex;
std::mutex g_config_mutex;
LogCallback g_callback = nullptr;
void* g_user_data = nullptr;
thread_local bool t_in_callback = false;

int stderr_threshold() {
  static const int level = [] {
    const char* env = std::getenv("EMBER_LOG_LEVEL");
    return env ? std::atoi(env) : static_cast<int>(LogLevel::kWarn);
  }();
  return level;
}

}  // namespace

void set_log_callback(LogCallback cb, void* user_data) {
  std::unique_lock<std::mutex> call;
  if (!t_in_callback) call = std::unique_lock<std::mutex>(g_call_mutex);  // no call in flight after we return
  std::lock_guard<std::mutex> lock(g_config_mutex);
  g_callback = cb;
  g_user_data = user_data;
}

void log(LogLevel level, const char* fmt, ...) {
  char buf[1024];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, args);
  va_end(args);
  auto to_stderr = [&] {
    if (static_cast<int>(level) >= stderr_threshold()) {
      static const char* names[] = {"debug", "info", "warn", "error"};
      std::fprintf(stderr, "ember [%s] %s\n", names[static_cast<int>(level)], buf);
    }
  };
  if (t_in_callback) {  // logged from inside the host's callback: never re-enter it
    to_stderr();
    return;
  }
  std::lock_guard<std::mutex> call(g_call_mutex);
  LogCallback cb;
  void* user_data;
  {
    std::lock_guard<std::mutex> lock(g_config_mutex);
    cb = g_callback;
    user_data = g_user_data;
  }
  if (!cb) {
    to_stderr();
    return;
  }
  t_in_callback = true;
  cb(static_cast<int>(level), buf, user_data);
  t_in_callback = false;
}

}  // namespace ember
