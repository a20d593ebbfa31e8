package ember;

import ember.lowlevel.emberc;

/** Library-wide queries. */
public final class Ember {
  static {
    Native.load();
  }

  private Ember() {}

  /** "MAJOR.MINOR.PATCH". */
  public static String version() {
    return emberc.ember_version();
  }

  /** MAJOR * 10000 + MINOR * 100 + PATCH. */
  public static int versionNumber() {
    return emberc.ember_version_number();
  }

  /** The CPU kernels in use: "scalar", "avx2" or "avx512_vnni". */
  public static String cpuIsa() {
    return emberc.eb_cpu_isa_name();
  }

  /** The CUDA plugin: "absent", "loadable" or "broken". */
  public static String cudaPlugin() {
    switch (emberc.eb_cuda_plugin()) {
      case 0: return "absent";
      case 1: return "loadable";
      case 2: return "broken";
      default: return "unknown";
    }
  }

  /**
   * Diagnostics: how many handles the garbage collector has released so far (handles dropped
   * without close(); each release returned without waiting for the engine).
   */
  public static long gcReleasedHandles() {
    return Native.GC_RELEASED.get();
  }

  /** Why the CUDA plugin is absent or broken ("" when loadable). */
  public static String cudaPluginMessage() {
    return emberc.eb_cuda_plugin_message();
  }
}
