package ember;

import java.nio.charset.StandardCharsets;

/** A failed Ember call: {@link #status()} is the ember_status, the message the library's. Unchecked. */
public class EmberException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  public static final int INVALID_ARGUMENT = 1;
  public static final int NOT_FOUND = 2;
  public static final int BAD_FORMAT = 3;
  public static final int UNSUPPORTED = 4;
  public static final int OUT_OF_MEMORY = 5;
  public static final int CONTEXT_FULL = 6;
  public static final int BUSY = 7;
  public static final int CANCELLED = 8;
  public static final int TIMEOUT = 9;
  public static final int INTERNAL = 10;
  public static final int END_OF_STREAM = 11;

  private final int status;

  public EmberException(int status, String message) {
    super(message);
    this.status = status;
  }

  /** Called by the native wrapper (bindings/ember.i): the message as UTF-8 bytes. */
  EmberException(int status, byte[] utf8Message) {
    this(status, new String(utf8Message, StandardCharsets.UTF_8));
  }

  /** The ember_status of the failure (one of the constants above). */
  public int status() {
    return status;
  }

  /** The status's constant name, e.g. "EMBER_ERR_NOT_FOUND". */
  public String statusName() {
    return ember.lowlevel.emberc.ember_status_string(status);
  }
}
