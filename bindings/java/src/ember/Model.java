package ember;

import ember.lowlevel.SWIGTYPE_p_ember_model;
import ember.lowlevel.eb_tokens;
import ember.lowlevel.emberc;
import java.util.List;

/** A GGUF model (weights, tokenizer, chat template). Immutable and thread-safe. */
public final class Model implements AutoCloseable {
  static {
    Native.load();
  }

  final Native.Handle<SWIGTYPE_p_ember_model> handle;
  private final java.lang.ref.Cleaner.Cleanable cleanable;
  private volatile ModelInfo info;

  /** Loads a model. Throws EmberException (NOT_FOUND, BAD_FORMAT, UNSUPPORTED, ...). */
  public Model(String path) {
    SWIGTYPE_p_ember_model h = emberc.eb_model_load(path);
    handle = new Native.Handle<>(h, emberc::ember_model_destroy, emberc::ember_model_destroy, "Model");
    cleanable = Native.CLEANER.register(this, handle);
  }

  public ModelInfo info() {
    ModelInfo i = info;
    if (i == null) {
      ember.lowlevel.eb_model_info raw = new ember.lowlevel.eb_model_info();
      handle.run(h -> emberc.eb_model_info_get(h, raw));
      info = i = new ModelInfo(raw);
    }
    return i;
  }

  public int[] tokenize(String text) {
    return tokenize(text, false, false);
  }

  public int[] tokenize(String text, boolean addSpecial, boolean parseSpecial) {
    return handle.call(h -> Tokens.toArray(emberc.eb_tokenize(h, text, addSpecial ? 1 : 0, parseSpecial ? 1 : 0)));
  }

  public String detokenize(int[] ids) {
    eb_tokens t = Tokens.of(ids);
    return handle.call(h -> emberc.eb_detokenize(h, t));
  }

  public String detokenize(List<Integer> ids) {
    return detokenize(ids.stream().mapToInt(Integer::intValue).toArray());
  }

  public boolean isClosed() {
    return handle.isClosed();
  }

  /** Releases the model; engines using it keep it alive. Idempotent. */
  @Override
  public void close() {
    handle.close();
    cleanable.clean();
  }
}
