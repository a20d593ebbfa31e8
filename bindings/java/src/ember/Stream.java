package ember;

import ember.lowlevel.SWIGTYPE_p_ember_stream;
import ember.lowlevel.eb_event;
import ember.lowlevel.emberc;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.NoSuchElementException;

/**
 * One generation: iterate it for text pieces. {@link #text()} is everything so far, {@link
 * #toolCalls()} the tool calls read so far (not in the text), {@link #logprobs()} the tokens'
 * log-probabilities (with {@link Sampling#logprobs}), {@link #endReason()} and {@link #stats()} say
 * how it ended. {@link #cancel()} may be called from any thread. Dropping it to the garbage
 * collector cancels it without blocking.
 */
public final class Stream implements AutoCloseable, Iterable<String>, Iterator<String> {
  final Native.Handle<SWIGTYPE_p_ember_stream> handle;
  private final java.lang.ref.Cleaner.Cleanable cleanable;
  private final Session session;
  private final Model draftModel; // held as long as the stream
  private final eb_event event = new eb_event();
  private final StringBuilder text = new StringBuilder();
  private final List<Integer> tokens = new ArrayList<>();
  private final List<ToolCall> toolCalls = new ArrayList<>();
  private final List<TokenLogprob> logprobs = new ArrayList<>();
  private volatile EndReason end;
  private String pending;

  Stream(Session session, SWIGTYPE_p_ember_stream h, Model draftModel) {
    this.session = session;
    this.draftModel = draftModel;
    // Explicit close: ember_stream_destroy (cancel and wait: the session is free right after).
    // Garbage collector: ember_stream_release (never waits for, or runs, engine steps).
    handle = new Native.Handle<>(h, emberc::ember_stream_destroy, emberc::ember_stream_release, "Stream");
    cleanable = Native.CLEANER.register(this, handle);
  }

  public Session session() { return session; }

  /** The speculative draft model ({@link Sampling#specDraftModel}), or null. */
  public Model draftModel() { return draftModel; }

  @Override
  public Iterator<String> iterator() { return this; }

  @Override
  public synchronized boolean hasNext() {
    if (pending == null) pending = nextPiece(-1);
    return pending != null;
  }

  @Override
  public synchronized String next() {
    if (!hasNext()) throw new NoSuchElementException("the stream has ended");
    String p = pending;
    pending = null;
    return p;
  }

  /**
   * The next text piece, or null at the end. With timeoutMs >= 0 throws EmberException(TIMEOUT)
   * when nothing came in time (manual-step engines poll with 0).
   */
  public synchronized String nextPiece(int timeoutMs) {
    if (pending != null) {
      String p = pending;
      pending = null;
      return p;
    }
    while (end == null) {
      int got = handle.call(h -> emberc.eb_stream_next(h, event, timeoutMs));
      if (got == 0) throw new EmberException(EmberException.TIMEOUT, "no event within the timeout");
      if (got < 0) {
        end = EndReason.NONE;
        break;
      }
      if (event.getKind() == emberc.EVENT_END) {
        end = EndReason.of(event.getEnd_reason());
        break;
      }
      long n = event.n_tokens();
      for (long i = 0; i < n; i++) tokens.add(event.token(i));
      if (event.has_logprobs() != 0) {
        int k = event.n_top();
        for (long i = 0; i < n; i++) {
          int[] topTokens = new int[k];
          float[] topLogprobs = new float[k];
          for (int j = 0; j < k; j++) {
            topTokens[j] = event.top_token(i, j);
            topLogprobs[j] = event.top_logprob(i, j);
          }
          logprobs.add(new TokenLogprob(event.token(i), event.logprob(i), topTokens, topLogprobs));
        }
      }
      if (event.getKind() == emberc.EVENT_TOOL_CALL) {
        toolCalls.add(new ToolCall(event.tool_call_id(), event.tool_name(), event.tool_arguments()));
        continue;
      }
      String piece = event.text();
      if (!piece.isEmpty()) {
        text.append(piece);
        return piece;
      }
    }
    return null;
  }

  /** Waits for the end and returns the whole text. */
  public String readAll() {
    while (hasNext()) next();
    return text();
  }

  /** Everything read so far. */
  public synchronized String text() { return text.toString(); }

  /** The tool calls read so far (all of them once the stream is read to its end). */
  public synchronized List<ToolCall> toolCalls() { return new ArrayList<>(toolCalls); }

  /** With {@link Sampling#logprobs}: one entry per generated token read so far (as {@link #tokens()}). */
  public synchronized List<TokenLogprob> logprobs() { return new ArrayList<>(logprobs); }

  /** The token ids read so far. */
  public synchronized int[] tokens() { return tokens.stream().mapToInt(Integer::intValue).toArray(); }

  /** null until the end was read. */
  public EndReason endReason() { return end; }

  public boolean isFinished() { return end != null; }

  /** Requests the end (CANCELLED soon after). Any thread; a no-op once closed. */
  public void cancel() {
    try {
      handle.run(emberc::eb_stream_cancel);
    } catch (EmberException e) {
      if (!handle.isClosed()) throw e;
    }
  }

  public StreamStats stats() {
    ember.lowlevel.eb_stats raw = new ember.lowlevel.eb_stats();
    try {
      handle.run(h -> emberc.eb_stream_stats_get(h, raw));
      return new StreamStats(raw);
    } finally {
      raw.delete();
    }
  }

  public boolean isClosed() { return handle.isClosed(); }

  /** Cancels if still running, waits for it to stop and releases it. Idempotent. */
  @Override
  public void close() {
    cancel();
    handle.close();
    cleanable.clean();
  }
}
