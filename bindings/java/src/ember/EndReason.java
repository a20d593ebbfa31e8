package ember;

/** Why a stream ended. */
public enum EndReason {
  NONE, EOS, STOP_STRING, MAX_TOKENS, CANCELLED, CONTEXT_FULL;

  static EndReason of(int v) {
    EndReason[] all = values();
    return v >= 0 && v < all.length ? all[v] : NONE;
  }
}
