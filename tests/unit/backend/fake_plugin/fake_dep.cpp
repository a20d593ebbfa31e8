// A dependency of the "missingdep" fake plugin that the loader cannot find.
extern "C" __attribute__((visibility("default"))) int ember_fake_dep_value() { return 7; }
