// The Java package test's program (tests/install/java_package_test.sh): run
// with only the packaged jar on the class path (no -Djava.library.path, no
// LD_LIBRARY_PATH), it checks that the native libraries were loaded from the
// jar's temporary copy, then prints the greedy reply's token ids on one line
// (as bindings/tools/greedy_ref.c).
//   java -cp ember-VERSION.jar:. Greedy MODEL MAX_TOKENS MESSAGE
import ember.Engine;
import ember.Model;
import ember.Sampling;
import ember.Session;
import ember.Stream;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.Arrays;
import java.util.List;
import java.util.stream.Collectors;

public class Greedy {
  public static void main(String[] args) throws Exception {
    try (Model model = new Model(args[0]);
        Engine engine = new Engine(model, new Engine.Options().kvMemoryBytes(64L << 20));
        Session session = engine.session()) {
      session.addMessage("user", args[2]);
      List<String> maps = Files.readAllLines(Paths.get("/proc/self/maps"));
      String tmp = Paths.get(System.getProperty("java.io.tmpdir")).toRealPath().toString();
      for (String lib : new String[] {"libember.so.1", "libember_java.so"}) {
        List<String> paths = maps.stream().filter(l -> l.endsWith("/" + lib)).map(l -> l.substring(l.indexOf('/')))
            .distinct().collect(Collectors.toList());
        if (paths.isEmpty() || !paths.stream().allMatch(p -> p.startsWith(tmp + "/ember-native"))) {
          throw new AssertionError(lib + " loaded from " + paths + ", not the jar's copy in " + tmp);
        }
      }
      try (Stream st = session.generate(new Sampling().maxTokens(Integer.parseInt(args[1])).temperature(0))) {
        String text = st.readAll();
        System.out.println(Arrays.stream(st.tokens()).mapToObj(Integer::toString).collect(Collectors.joining(" ")));
        System.err.println("ember " + ember.Ember.version() + ": " + text);
      }
    }
  }
}
