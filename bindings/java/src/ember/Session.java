package ember;

import ember.lowlevel.SWIGTYPE_p_ember_lora;
import ember.lowlevel.SWIGTYPE_p_ember_session;
import ember.lowlevel.SWIGTYPE_p_ember_stream;
import ember.lowlevel.eb_floats;
import ember.lowlevel.eb_lora_set;
import ember.lowlevel.eb_sampling;
import ember.lowlevel.emberc;
import java.util.Arrays;
import java.util.List;

/** One conversation. One stream at a time; use it from one thread at a time. */
public final class Session implements AutoCloseable {
  /** Session settings. */
  public static final class Options {
    String systemPrompt;
    String cache = "full";
    int sinkTokens = 4;
    int windowTokens = 0;
    int nCtx = 0;

    public Options systemPrompt(String s) { systemPrompt = s; return this; }
    /** "full" (default), "window" or "sink" (StreamingLLM: never runs out of context). */
    public Options cache(String c) { cache = c; return this; }
    public Options sinkTokens(int n) { sinkTokens = n; return this; }
    public Options windowTokens(int n) { windowTokens = n; return this; }
    /** Max tokens held; 0 = the model's context. */
    public Options nCtx(int n) { nCtx = n; return this; }
  }

  final Native.Handle<SWIGTYPE_p_ember_session> handle;
  private final java.lang.ref.Cleaner.Cleanable cleanable;
  private final Engine engine;

  Session(Engine engine, SWIGTYPE_p_ember_session h) {
    this.engine = engine;
    handle = new Native.Handle<>(h, emberc::ember_session_destroy, emberc::ember_session_destroy, "Session");
    cleanable = Native.CLEANER.register(this, handle);
  }

  public Engine engine() { return engine; }

  public void addMessage(String role, String content) {
    handle.run(h -> emberc.eb_session_add_message(h, role, content));
  }

  /**
   * The tools the model may call from the next stream on: an OpenAI tool list as JSON text, {@code
   * [{"type": "function", "function": {"name", "description", "parameters"}}, ...]}; null or "" =
   * none. Calls come out in {@link Stream#toolCalls}, not in the text; send a result back with
   * {@code addMessage("tool", result)}.
   */
  public void setTools(String toolsJson) {
    handle.run(h -> emberc.eb_session_set_tools(h, toolsJson));
  }

  /**
   * The LoRA adapters the next turns decode with, in order (C ABI 1.6), each at scale 1.0; none =
   * the base model. See {@link #setLoras(List, float[])}.
   */
  public void setLoras(Lora... loras) {
    setLoras(loras == null ? List.of() : Arrays.asList(loras), null);
  }

  /**
   * The LoRA adapters the next turns decode with, in order (C ABI 1.6), with their scales ({@code
   * scales} null: all 1.0; 0 is the base model); null or empty = none. Each adds scale * alpha / rank
   * * B A x to its matrices' rows, as llama.cpp does. Changing the set between turns recomputes the
   * history under the new one. The session keeps the adapters alive (closing a Lora afterwards is
   * safe). Throws EmberException: INVALID_ARGUMENT (more than 16 adapters, a scale that is not finite
   * or beyond +-1000, an adapter of another model, a closed Lora, scales of another length), BUSY (a
   * stream runs).
   */
  public void setLoras(List<Lora> loras, float[] scales) {
    int n = loras == null ? 0 : loras.size();
    if (scales != null && scales.length != n) {
      throw new EmberException(EmberException.INVALID_ARGUMENT,
          scales.length + " scales for " + n + " adapters");
    }
    for (int i = 0; i < n; i++) {
      if (loras.get(i) == null) throw new EmberException(EmberException.INVALID_ARGUMENT, "adapter " + i + " is null");
    }
    eb_lora_set set = new eb_lora_set();
    int held = 0;
    try {
      // Every adapter stays open across the call; the session then keeps them alive itself.
      for (int i = 0; i < n; i++) {
        SWIGTYPE_p_ember_lora p = loras.get(i).handle.acquire();
        held++;
        set.add(p, scales == null ? 1.0f : scales[i]);
      }
      handle.run(h -> emberc.eb_session_set_loras(h, set));
    } finally {
      for (int i = 0; i < held; i++) loras.get(i).handle.release();
      set.delete();
    }
  }

  public void addText(String text) { addText(text, false); }

  public void addText(String text, boolean parseSpecial) {
    handle.run(h -> emberc.eb_session_add_text(h, text, parseSpecial ? 1 : 0));
  }

  public void addTokens(int[] ids) {
    handle.run(h -> emberc.eb_session_add_tokens(h, Tokens.of(ids)));
  }

  public void reset() { handle.run(emberc::eb_session_reset); }

  public long tokenCount() { return handle.call(emberc::eb_session_token_count); }

  /** Appends tokens and returns log p(token | everything before it) for each (NaN for the very first). */
  public float[] score(int[] tokens) {
    return handle.call(h -> {
      eb_floats f = emberc.eb_session_score(h, Tokens.of(tokens));
      float[] out = new float[(int) f.size()];
      for (int i = 0; i < out.length; i++) out[i] = f.get(i);
      f.delete();
      return out;
    });
  }

  public void save(String path) { handle.run(h -> emberc.eb_session_save(h, path)); }

  /** Starts generating with the library's default sampling. */
  public Stream generate() { return generate(new Sampling()); }

  /** Starts generating from everything added so far; iterate the Stream for text pieces. */
  public Stream generate(Sampling s) {
    eb_sampling raw = s.toNative();
    Model draft = s.specDraftModel;
    try {
      SWIGTYPE_p_ember_stream st;
      if (draft == null) {
        st = handle.call(h -> emberc.eb_stream_start(h, raw));
      } else {
        // The draft model stays open across the start; the stream then keeps it loaded.
        st = draft.handle.call(d -> {
          raw.setSpec_draft_model(d);
          return handle.call(h -> emberc.eb_stream_start(h, raw));
        });
      }
      return new Stream(this, st, draft);
    } finally {
      raw.delete();
    }
  }

  /** Adds a user message and returns the whole reply. */
  public String chat(String content, Sampling s) {
    addMessage("user", content);
    try (Stream stream = generate(s)) {
      return stream.readAll();
    }
  }

  public String chat(String content) { return chat(content, new Sampling()); }

  public boolean isClosed() { return handle.isClosed(); }

  /** Releases the session (a running stream is cancelled and keeps it alive). Idempotent. */
  @Override
  public void close() {
    handle.close();
    cleanable.clean();
  }
}
