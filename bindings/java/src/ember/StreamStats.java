package ember;

/** Statistics of a stream (ember_stream_stats_t). */
public final class StreamStats {
  public final long promptTokens;
  public final long generatedTokens;
  public final double timeToFirstTokenMs;
  public final double tokensPerSecond;
  public final double prefillTokensPerSecond;
  public final boolean finished;
  public final EndReason endReason;
  /** Speculative decoding (0 without it): tokens the drafter proposed. */
  public final long draftedTokens;
  /** Drafted tokens the model accepted. */
  public final long acceptedTokens;
  /** Model passes that verified a tree. */
  public final long verifyPasses;
  /** acceptedTokens / verifyPasses. */
  public final double meanAcceptedLength;

  StreamStats(ember.lowlevel.eb_stats s) {
    promptTokens = s.getPrompt_tokens();
    generatedTokens = s.getGenerated_tokens();
    timeToFirstTokenMs = s.getTime_to_first_token_ms();
    tokensPerSecond = s.getTokens_per_second();
    prefillTokensPerSecond = s.getPrefill_tokens_per_second();
    finished = s.getFinished() != 0;
    endReason = EndReason.of(s.getEnd_reason());
    draftedTokens = s.getDrafted_tokens();
    acceptedTokens = s.getAccepted_tokens();
    verifyPasses = s.getVerify_passes();
    meanAcceptedLength = s.getMean_accepted_length();
  }
}
