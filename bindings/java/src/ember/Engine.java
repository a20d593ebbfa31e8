package ember;

import ember.lowlevel.SWIGTYPE_p_ember_engine;
import ember.lowlevel.SWIGTYPE_p_ember_session;
import ember.lowlevel.emberc;

/** A model bound to a device, with its KV pool and scheduler. Thread-safe. */
public final class Engine implements AutoCloseable {
  static {
    Native.load();
  }

  /** Engine settings; the defaults are the library's. */
  public static final class Options {
    String device = "cpu";
    int nThreads = 0;
    boolean manualStep = false;
    long kvMemoryBytes = 0;

    /** "cpu" (default), "cuda" or "auto". */
    public Options device(String d) { device = d; return this; }
    /** CPU threads, 0 = all cores. */
    public Options nThreads(int n) { nThreads = n; return this; }
    /** true: the host runs steps with {@link Engine#step}. */
    public Options manualStep(boolean m) { manualStep = m; return this; }
    /** KV pool budget in bytes, 0 = 512 MiB. */
    public Options kvMemoryBytes(long b) { kvMemoryBytes = b; return this; }
  }

  final Native.Handle<SWIGTYPE_p_ember_engine> handle;
  private final java.lang.ref.Cleaner.Cleanable cleanable;
  private final Model model;

  public Engine(Model model) {
    this(model, new Options());
  }

  public Engine(Model model, Options o) {
    int device;
    switch (o.device) {
      case "cpu": device = emberc.DEVICE_CPU; break;
      case "cuda": device = emberc.DEVICE_CUDA; break;
      case "auto": device = emberc.DEVICE_AUTO; break;
      default: throw new EmberException(EmberException.INVALID_ARGUMENT, "unknown device '" + o.device + "' (cpu, cuda or auto)");
    }
    SWIGTYPE_p_ember_engine h = model.handle.call(
        m -> emberc.eb_engine_create(m, device, o.nThreads, o.manualStep ? 1 : 0, o.kvMemoryBytes));
    handle = new Native.Handle<>(h, emberc::ember_engine_destroy, emberc::ember_engine_destroy, "Engine");
    cleanable = Native.CLEANER.register(this, handle);
    this.model = model;
  }

  public Model model() { return model; }

  /** Where it runs: "cpu" or "cuda" (an "auto" engine says what it chose). */
  public String device() {
    return handle.call(h -> emberc.eb_engine_device(h) == emberc.DEVICE_CUDA ? "cuda" : "cpu");
  }

  /** The GPU index of a CUDA engine, -1 on the CPU. */
  public int gpuIndex() { return handle.call(emberc::eb_engine_gpu_index); }

  public String backendName() { return handle.call(emberc::eb_engine_backend_name); }

  public Session session() { return session(new Session.Options()); }

  public Session session(String systemPrompt) { return session(new Session.Options().systemPrompt(systemPrompt)); }

  public Session session(Session.Options o) {
    int policy;
    switch (o.cache) {
      case "full": policy = emberc.CACHE_FULL; break;
      case "window": policy = emberc.CACHE_WINDOW; break;
      case "sink": policy = emberc.CACHE_SINK; break;
      default: throw new EmberException(EmberException.INVALID_ARGUMENT, "unknown cache policy '" + o.cache + "' (full, window or sink)");
    }
    SWIGTYPE_p_ember_session s = handle.call(h -> emberc.eb_session_create(
        h, o.systemPrompt == null ? "" : o.systemPrompt, policy, o.sinkTokens, o.windowTokens, o.nCtx));
    return new Session(this, s);
  }

  /** Restores a session saved with {@link Session#save}. */
  public Session loadSession(String path) {
    return new Session(this, handle.call(h -> emberc.eb_session_load(h, path)));
  }

  /** Manual mode only: runs steps for about maxMs milliseconds; returns the tokens processed. */
  public long step(int maxMs, int maxTokens) {
    return handle.call(h -> emberc.eb_engine_step(h, maxMs, maxTokens));
  }

  public boolean isClosed() { return handle.isClosed(); }

  /** Releases the engine; its sessions keep it alive. Idempotent. */
  @Override
  public void close() {
    handle.close();
    cleanable.clean();
  }
}
