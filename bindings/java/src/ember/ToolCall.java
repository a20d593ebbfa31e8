package ember;

/** A call the model made to one of the session's tools ({@link Session#setTools}). */
public final class ToolCall {
  /** "call_&lt;n&gt;", unique in the session. */
  public final String id;
  /** One of the session's tools. */
  public final String name;
  /** Compact JSON text that validates against the tool's parameters. */
  public final String arguments;

  ToolCall(String id, String name, String arguments) {
    this.id = id;
    this.name = name;
    this.arguments = arguments;
  }

  @Override
  public String toString() {
    return name + arguments + " (" + id + ")";
  }
}
