package ember;

import ember.lowlevel.SWIGTYPE_p_ember_lora;
import ember.lowlevel.emberc;

/**
 * A LoRA adapter (C ABI 1.6) in llama.cpp's GGUF format, loaded for a model (made for its
 * architecture and shapes; the file is read once). Use it with {@link Session#setLoras}; immutable
 * and thread-safe, share it across sessions and engines of the model. Sessions using it keep it
 * alive, so {@link #close()} is safe at any time.
 */
public final class Lora implements AutoCloseable {
  static {
    Native.load();
  }

  final Native.Handle<SWIGTYPE_p_ember_lora> handle;
  private final java.lang.ref.Cleaner.Cleanable cleanable;
  private final Model model;
  private final String path;
  private volatile LoraInfo info;

  /**
   * Loads an adapter for {@code model}. Throws EmberException: NOT_FOUND, BAD_FORMAT (not an
   * adapter, corrupt), INVALID_ARGUMENT (an adapter for another model), UNSUPPORTED, ...
   */
  public Lora(Model model, String path) {
    if (model == null) throw new EmberException(EmberException.INVALID_ARGUMENT, "model is null");
    SWIGTYPE_p_ember_lora h = model.handle.call(m -> emberc.eb_lora_load(m, path));
    handle = new Native.Handle<>(h, emberc::ember_lora_destroy, emberc::ember_lora_destroy, "Lora");
    cleanable = Native.CLEANER.register(this, handle);
    this.model = model;
    this.path = path;
  }

  public Model model() { return model; }

  public String path() { return path; }

  public LoraInfo info() {
    LoraInfo i = info;
    if (i == null) {
      ember.lowlevel.eb_lora_info raw = new ember.lowlevel.eb_lora_info();
      try {
        handle.run(h -> emberc.eb_lora_info_get(h, raw));
        info = i = new LoraInfo(raw);
      } finally {
        raw.delete();
      }
    }
    return i;
  }

  public boolean isClosed() {
    return handle.isClosed();
  }

  /** Releases the adapter; sessions using it keep it alive. Idempotent. */
  @Override
  public void close() {
    handle.close();
    cleanable.clean();
  }

  @Override
  public String toString() {
    return "Lora(" + path + (isClosed() ? ", closed" : "") + ")";
  }
}
