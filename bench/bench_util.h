// Small helpers shared by the benchmark programs in bench/.
#pragma once

#include <cstdlib>
#include <cstring>
#include <ctime>

namespace ember::bench {

// This process's CPU time in seconds (all threads): steadier than wall time
// on a machine where other work shares the cores.
inline double cpu_now() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// The integer after `name` on the command line, else `def`.
inline int arg_int(int argc, char** argv, const char* name, int def) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  }
  return def;
}

}  // namespace ember::bench
