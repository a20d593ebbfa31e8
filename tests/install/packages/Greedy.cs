// The NuGet package test's program (tests/install/csharp_package_test.sh):
// compiled against the package's lib/netstandard2.0/Ember.dll and run with
// the package's native libraries next to it, it prints the greedy reply's
// token ids on one line (as bindings/tools/greedy_ref.c).
//   mono Greedy.exe MODEL MAX_TOKENS MESSAGE
using System;
using System.Linq;
using Ember;

static class Greedy
{
    static int Main(string[] args)
    {
        using (var model = new Model(args[0]))
        using (var engine = new Engine(model, kvMemoryBytes: 64L << 20))
        using (var session = engine.Session())
        {
            session.AddMessage("user", args[2]);
            using (var stream = session.Generate(new Sampling { MaxTokens = int.Parse(args[1]), Temperature = 0 }))
            {
                string text = stream.ReadAll();
                Console.WriteLine(string.Join(" ", stream.Tokens.Select(t => t.ToString())));
                Console.Error.WriteLine("ember " + Library.Version + ": " + text);
            }
        }
        return 0;
    }
}
