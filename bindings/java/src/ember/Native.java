package ember;

import java.util.function.Consumer;
import java.util.function.Function;

/** Loads the JNI library and guards native handles. Internal. */
final class Native {
  private Native() {}

  private static boolean loaded;

  /** Where a jar that carries the native libraries has them (tools/package_java.sh). */
  static final String NATIVE_RESOURCE_DIR = "/ember/native/linux-x86_64/";

  /** The libraries in that directory, in load order (libember_java needs libember.so.1). */
  static final String[] NATIVE_LIBRARIES = {"libember.so.1", "libember_java.so"};

  /**
   * Loads libember_java: from the system property ember.library.path (a file) when set; else from
   * the jar when it carries the native libraries (extracted to a temporary directory, removed when
   * the JVM exits, and loaded from there with System.load); else from java.library.path.
   */
  static synchronized void load() {
    if (loaded) return;
    String path = System.getProperty("ember.library.path");
    if (path != null && !path.isEmpty()) {
      System.load(path);
    } else if (Native.class.getResource(NATIVE_RESOURCE_DIR + NATIVE_LIBRARIES[0]) != null) {
      loadFromJar();
    } else {
      System.loadLibrary("ember_java");
    }
    loaded = true;
  }

  private static void loadFromJar() {
    try {
      java.nio.file.Path dir = java.nio.file.Files.createTempDirectory("ember-native");
      dir.toFile().deleteOnExit();
      java.util.List<java.nio.file.Path> files = new java.util.ArrayList<>();
      for (String name : NATIVE_LIBRARIES) {
        java.nio.file.Path file = dir.resolve(name);
        try (java.io.InputStream in = Native.class.getResourceAsStream(NATIVE_RESOURCE_DIR + name)) {
          if (in == null) throw new UnsatisfiedLinkError("ember: the jar lacks " + NATIVE_RESOURCE_DIR + name);
          java.nio.file.Files.copy(in, file);
        }
        file.toFile().deleteOnExit();
        files.add(file);
      }
      // libember.so.1 first: libember_java.so then finds it loaded (and through RPATH $ORIGIN).
      for (java.nio.file.Path file : files) System.load(file.toAbsolutePath().toString());
    } catch (java.io.IOException e) {
      UnsatisfiedLinkError error = new UnsatisfiedLinkError("ember: cannot extract the native libraries: " + e);
      error.initCause(e);
      throw error;
    }
  }

  /**
   * One native handle. Calls use it between acquire and release; close releases it exactly once,
   * after the calls in flight, so closing from another thread never frees a handle in use. As a
   * Runnable it is the Cleaner's action: the garbage collector's path, which uses gcRelease
   * (never blocks).
   */
  static final class Handle<T> implements Runnable {
    private T ptr;
    private Consumer<T> releaser;
    private final Consumer<T> gcRelease;
    private final String what;
    private int busy;
    private boolean closed;

    Handle(T ptr, Consumer<T> destroy, Consumer<T> gcRelease, String what) {
      this.ptr = ptr;
      this.releaser = destroy;
      this.gcRelease = gcRelease;
      this.what = what;
    }

    synchronized T acquire() {
      if (closed) throw new EmberException(EmberException.INVALID_ARGUMENT, "the " + what + " is closed");
      busy++;
      return ptr;
    }

    void release() {
      T p = null;
      Consumer<T> how;
      synchronized (this) {
        busy--;
        if (closed && busy == 0 && ptr != null) {
          p = ptr;
          ptr = null;
        }
        how = releaser;
      }
      if (p != null) how.accept(p);
    }

    <R> R call(Function<T, R> f) {
      T h = acquire();
      try {
        return f.apply(h);
      } finally {
        release();
      }
    }

    void run(Consumer<T> f) {
      T h = acquire();
      try {
        f.accept(h);
      } finally {
        release();
      }
    }

    synchronized boolean isClosed() {
      return closed;
    }

    void close() {
      close(null);
    }

    /** Closes it; true when this call closed it (false: it was closed already). */
    boolean close(Consumer<T> how) {
      T p;
      Consumer<T> r;
      synchronized (this) {
        if (closed) return false;
        closed = true;
        if (how != null) releaser = how;
        if (busy > 0) return true; // the last call in flight releases it
        p = ptr;
        ptr = null;
        r = releaser;
      }
      if (p != null) r.accept(p);
      return true;
    }

    @Override
    public void run() {
      if (close(gcRelease)) GC_RELEASED.incrementAndGet();
    }
  }

  /** Handles released by the garbage collector (Cleaner) so far: Ember.gcReleasedHandles(). */
  static final java.util.concurrent.atomic.AtomicLong GC_RELEASED = new java.util.concurrent.atomic.AtomicLong();

  static final java.lang.ref.Cleaner CLEANER = java.lang.ref.Cleaner.create();
}
