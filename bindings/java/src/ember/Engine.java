package ember;

import ember.lowlevel.SWIGTYPE_p_ember_engine;
import ember.lowlevel.SWIGTYPE_p_ember_session;
import ember.lowlevel.eb_embed_inputs;
import ember.lowlevel.eb_floats;
import ember.lowlevel.eb_tokens;
import ember.lowlevel.emberc;
import java.util.List;

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
    String kvType = "f16";

    /** "cpu" (default), "cuda" or "auto". */
    public Options device(String d) { device = d; return this; }
    /** CPU threads, 0 = all cores. */
    public Options nThreads(int n) { nThreads = n; return this; }
    /** true: the host runs steps with {@link Engine#step}. */
    public Options manualStep(boolean m) { manualStep = m; return this; }
    /** KV pool budget in bytes, 0 = 512 MiB. */
    public Options kvMemoryBytes(long b) { kvMemoryBytes = b; return this; }
    /**
     * The KV cache's element type (EMBER_KV_*): "f16" (default) or "q8_0", which halves the KV
     * memory per token (the same budget holds ~1.9x the tokens; greedy output can differ
     * from f16's). q8_0 is CPU-only and needs the model's head_dim to be a multiple of 32
     * (UNSUPPORTED otherwise); a session saved from a q8_0 engine loads only into a q8_0 engine.
     * Another value: INVALID_ARGUMENT when the engine is created.
     */
    public Options kvType(String t) { kvType = t; return this; }
  }

  /** Embedding settings for {@link Engine#embed}; the defaults are the library's. */
  public static final class EmbedOptions {
    Pooling pooling = Pooling.MEAN;
    boolean normalize = false;
    boolean parseSpecial = false;

    /** {@link Pooling#MEAN} (default), {@link Pooling#LAST} or {@link Pooling#CLS}. */
    public EmbedOptions pooling(Pooling p) { pooling = p; return this; }
    /** true: each vector scaled to L2 length 1. */
    public EmbedOptions normalize(boolean n) { normalize = n; return this; }
    /** Texts: special-token text (e.g. "<|im_start|>") is the special token (default false). */
    public EmbedOptions parseSpecial(boolean p) { parseSpecial = p; return this; }
  }

  /** The most inputs one embed or embedTokens call takes (EMBER_MAX_EMBED_INPUTS). */
  public static final int MAX_EMBED_INPUTS = emberc.MAX_EMBED_INPUTS;

  final Native.Handle<SWIGTYPE_p_ember_engine> handle;
  private final java.lang.ref.Cleaner.Cleanable cleanable;
  private final Model model;
  private final int nEmbd; // for embed (read at creation: the model may be closed later, the engine keeps it)

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
    int kvDtype;
    switch (o.kvType == null ? "" : o.kvType) {
      case "f16": kvDtype = emberc.KV_F16; break;
      case "q8_0": kvDtype = emberc.KV_Q8_0; break;
      default: throw new EmberException(EmberException.INVALID_ARGUMENT, "unknown kv type '" + o.kvType + "' (f16 or q8_0)");
    }
    nEmbd = model.info().nEmbd;
    SWIGTYPE_p_ember_engine h = model.handle.call(
        m -> emberc.eb_engine_create(m, device, o.nThreads, o.manualStep ? 1 : 0, o.kvMemoryBytes, kvDtype));
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

  /** Embeddings with the library's defaults (mean pooling, not normalised): one vector per text. */
  public float[][] embed(String... texts) { return embed(texts, new EmbedOptions()); }

  public float[][] embed(List<String> texts) { return embed(texts, new EmbedOptions()); }

  public float[][] embed(List<String> texts, EmbedOptions o) {
    if (texts == null) throw new EmberException(EmberException.INVALID_ARGUMENT, "texts is null");
    return embed(texts.toArray(new String[0]), o);
  }

  /**
   * Embeddings (C ABI 1.5, ember_engine_embed): one vector of {@code model().info().nEmbd} floats
   * per text, in order: the model's hidden state after its final norm, pooled over the text's
   * tokens, L2-normalised with {@code normalize(true)}. Texts are tokenized with the model's
   * BOS/EOS (as llama.cpp embeds). The inputs run through the engine's scheduler beside its
   * streams; the call blocks until all are done (a manual-step engine runs its steps itself).
   * Throws EmberException: INVALID_ARGUMENT (no texts, more than {@link #MAX_EMBED_INPUTS}, a null
   * or empty text, a null pooling), CONTEXT_FULL (a text longer than the model's context).
   */
  public float[][] embed(String[] texts, EmbedOptions o) {
    if (texts == null) throw new EmberException(EmberException.INVALID_ARGUMENT, "texts is null");
    int pooling = pooling(o);
    checkCount(texts.length);
    eb_embed_inputs in = new eb_embed_inputs();
    try {
      for (int i = 0; i < texts.length; i++) {
        if (texts[i] == null) throw new EmberException(EmberException.INVALID_ARGUMENT, "text " + i + " is null");
        in.add_text(texts[i]);
      }
      return embed(in, pooling, o.normalize, o.parseSpecial);
    } finally {
      in.delete();
    }
  }

  /** Embeddings of inputs given as token ids, with the library's defaults: one vector per input. */
  public float[][] embedTokens(int[]... inputs) { return embedTokens(inputs, new EmbedOptions()); }

  /**
   * As {@link #embed(String[], EmbedOptions)} for inputs given as token ids
   * (ember_engine_embed_tokens): nothing is added, so {@code model.tokenize(text, true, false)}
   * gives the vector of {@code embed(text)}; parseSpecial is not used. INVALID_ARGUMENT also for an
   * id outside the vocabulary.
   */
  public float[][] embedTokens(int[][] inputs, EmbedOptions o) {
    if (inputs == null) throw new EmberException(EmberException.INVALID_ARGUMENT, "inputs is null");
    int pooling = pooling(o);
    checkCount(inputs.length);
    eb_embed_inputs in = new eb_embed_inputs();
    try {
      for (int i = 0; i < inputs.length; i++) {
        if (inputs[i] == null) throw new EmberException(EmberException.INVALID_ARGUMENT, "input " + i + " is null");
        eb_tokens t = Tokens.of(inputs[i]);
        try {
          in.add_tokens(t);
        } finally {
          t.delete();
        }
      }
      return embed(in, pooling, o.normalize, false);
    } finally {
      in.delete();
    }
  }

  private static int pooling(EmbedOptions o) {
    if (o == null) throw new EmberException(EmberException.INVALID_ARGUMENT, "options is null");
    if (o.pooling == null) throw new EmberException(EmberException.INVALID_ARGUMENT, "pooling is null (MEAN, LAST or CLS)");
    return o.pooling.toNative();
  }

  private static void checkCount(int n) {
    if (n > MAX_EMBED_INPUTS) {
      throw new EmberException(EmberException.INVALID_ARGUMENT, n + " inputs (at most " + MAX_EMBED_INPUTS + " per call)");
    }
  }

  private float[][] embed(eb_embed_inputs in, int pooling, boolean normalize, boolean parseSpecial) {
    int d = nEmbd;
    return handle.call(h -> {
      eb_floats f = emberc.eb_engine_embed(h, in, d, pooling, normalize ? 1 : 0, parseSpecial ? 1 : 0);
      try {
        float[][] out = new float[(int) (f.size() / d)][d];
        for (int i = 0; i < out.length; i++) {
          for (int j = 0; j < d; j++) out[i][j] = f.get((long) i * d + j);
        }
        return out;
      } finally {
        f.delete();
      }
    });
  }

  public boolean isClosed() { return handle.isClosed(); }

  /** Releases the engine; its sessions keep it alive. Idempotent. */
  @Override
  public void close() {
    handle.close();
    cleanable.clean();
  }
}
