// Helpers shared by the libFuzzer targets (tests/fuzz/*.cpp).
//
// Every target also writes its own seed corpus: run it with
// EMBER_FUZZ_WRITE_SEEDS=<dir> and it writes its seeds there and exits
// (tests/fuzz/make_corpus.sh does this for all targets). The seeds are built
// by the same code the targets use, so they stay valid as formats evolve.
#pragma once

#include <spawn.h>
#include <sys/wait.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "core/util/hash.h"
#include "core/util/status.h"

extern char** environ;

namespace ember::fuzz {

// A condition the code under test promises; a violation is a finding.
#define EMBER_FUZZ_CHECK(cond)                                                              \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      std::fprintf(stderr, "fuzz check failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                                         \
    }                                                                                       \
  } while (0)

// Directory named by EMBER_FUZZ_WRITE_SEEDS, or empty.
inline std::string seed_dir() {
  const char* d = std::getenv("EMBER_FUZZ_WRITE_SEEDS");
  return d && *d ? std::string(d) : std::string();
}

// For LLVMFuzzerInitialize: with EMBER_FUZZ_WRITE_SEEDS set, writes the
// target's seeds there (`write_seeds`) and ends the process.
inline void write_seeds_if_asked(void (*write_seeds)(const std::string& dir)) {
  if (const std::string dir = seed_dir(); !dir.empty()) {
    write_seeds(dir);
    std::exit(0);
  }
}

// Writes one seed file <dir>/<name>-<hash> (FNV-1a: stable names) and reports it.
inline void write_seed(const std::string& dir, const std::string& name, std::string_view bytes) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv1a(bytes)));
  const std::string path = dir + "/" + name + "-" + std::string(hex, 8);
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(1);
  }
  if (!bytes.empty()) std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
  std::fprintf(stderr, "seed %s (%zu bytes)\n", path.c_str(), bytes.size());
}
inline void write_seed(const std::string& dir, const std::string& name, const std::vector<uint8_t>& bytes) {
  write_seed(dir, name, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

// Splits `s` at every `sep` byte.
inline std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t at = s.find(sep, start);
    if (at == std::string_view::npos) {
      out.emplace_back(s.substr(start));
      return out;
    }
    out.emplace_back(s.substr(start, at - start));
    start = at + 1;
  }
}

// Runs tools/make_synthetic_model (EMBER_FUZZ_MAKE_MODEL overrides the
// binary built with the targets) with `args`; false when it cannot run or fails.
inline bool make_synthetic_model(std::vector<std::string> args) {
  const char* tool = std::getenv("EMBER_FUZZ_MAKE_MODEL");
#ifdef EMBER_FUZZ_MAKE_MODEL
  std::string bin = tool && *tool ? tool : EMBER_FUZZ_MAKE_MODEL;
#else
  std::string bin = tool ? tool : "";
#endif
  args.insert(args.begin(), bin);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid;
  if (bin.empty() || posix_spawn(&pid, bin.c_str(), nullptr, nullptr, argv.data(), environ) != 0) return false;
  int st = 0;
  return waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

}  // namespace ember::fuzz
