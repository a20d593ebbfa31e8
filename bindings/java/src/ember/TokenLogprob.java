package ember;

/**
 * A generated token's log-probability in the row it was chosen from (after logit bias and
 * constraints, before penalties and temperature), and the row's most likely tokens ({@link
 * Sampling#logprobs}, {@link Sampling#topLogprobs}).
 */
public final class TokenLogprob {
  public final int token;
  public final float logprob;
  private final int[] topTokens;
  private final float[] topLogprobs;

  TokenLogprob(int token, float logprob, int[] topTokens, float[] topLogprobs) {
    this.token = token;
    this.logprob = logprob;
    this.topTokens = topTokens;
    this.topLogprobs = topLogprobs;
  }

  /** The row's most likely tokens, most likely first ({@link Sampling#topLogprobs} of them). */
  public int[] topTokens() { return topTokens.clone(); }

  /** Their log-probabilities, in the same order as {@link #topTokens()}. */
  public float[] topLogprobs() { return topLogprobs.clone(); }

  @Override
  public String toString() {
    StringBuilder sb = new StringBuilder().append(token).append(": ").append(logprob).append(" [");
    for (int k = 0; k < topTokens.length; k++) {
      sb.append(k == 0 ? "" : ", ").append(topTokens[k]).append(": ").append(topLogprobs[k]);
    }
    return sb.append("]").toString();
  }
}
