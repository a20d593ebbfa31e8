package ember;

import ember.lowlevel.eb_tokens;

final class Tokens {
  private Tokens() {}

  static eb_tokens of(int[] ids) {
    eb_tokens t = new eb_tokens(ids.length);
    for (int i = 0; i < ids.length; i++) t.set(i, ids[i]);
    return t;
  }

  static int[] toArray(eb_tokens t) {
    int[] out = new int[(int) t.size()];
    for (int i = 0; i < out.length; i++) out[i] = t.get(i);
    t.delete();
    return out;
  }
}
