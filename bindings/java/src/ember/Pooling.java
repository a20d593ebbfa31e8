package ember;

/** How an embedding pools the hidden states of its input's tokens (EMBER_POOLING_*). */
public enum Pooling {
  /** The mean over every token (the default). */
  MEAN,
  /** The last token's. */
  LAST,
  /** The first token's (BOS where the model adds one). */
  CLS;

  int toNative() {
    switch (this) {
      case LAST: return ember.lowlevel.emberc.POOLING_LAST;
      case CLS: return ember.lowlevel.emberc.POOLING_CLS;
      default: return ember.lowlevel.emberc.POOLING_MEAN;
    }
  }
}
