// The C# binding's side of bindings/tools/bench_bindings.py (a benchmark, not a test).
//   LD_LIBRARY_PATH=build/bindings/csharp:build/capi mono BenchBinding.exe MODEL N PROMPT decode|drain [REPS]
// Each repetition: a fresh session on one engine (KV pool 64 MiB, as greedy_ref), one user
// message, a greedy reply of exactly N tokens (IgnoreEos), read through the binding's Stream.
//   decode: times from the first piece to the end as the consumer sees it ("decode_s T tokens N").
//   drain:  waits for the stream to end, then times reading its queued events: the binding's own
//           cost with the engine out of the way ("drain_s T tokens N").
// The last repetition's token ids go to stdout (the driver checks them against the C API's).
using System;
using System.Diagnostics;
using System.Globalization;
using System.Threading;
using Ember;

static class BenchBinding
{
    static int Main(string[] args)
    {
        if (args.Length < 4)
        {
            Console.Error.WriteLine("usage: BenchBinding.exe MODEL N PROMPT decode|drain [REPS]");
            return 2;
        }
        int n = int.Parse(args[1], CultureInfo.InvariantCulture);
        bool drain = args[3] == "drain";
        int reps = args.Length > 4 ? int.Parse(args[4], CultureInfo.InvariantCulture) : 1;
        int[] tokens = new int[0];
        using (var model = new Model(args[0]))
        using (var engine = new Engine(model, kvMemoryBytes: 64L << 20))
        {
            for (int r = 0; r < reps; r++)
            {
                using (var session = engine.Session())
                {
                    session.AddMessage("user", args[2]);
                    var sampling = new Sampling { MaxTokens = n, Temperature = 0f, IgnoreEos = true };
                    using (var stream = session.Generate(sampling))
                    {
                        double seconds;
                        if (drain)
                        {
                            while (!stream.Stats.Finished) Thread.Sleep(1);
                            var watch = Stopwatch.StartNew();
                            foreach (string piece in stream) { }
                            seconds = watch.Elapsed.TotalSeconds;
                        }
                        else
                        {
                            Stopwatch watch = null;
                            foreach (string piece in stream)
                            {
                                if (watch == null) watch = Stopwatch.StartNew();
                            }
                            seconds = watch.Elapsed.TotalSeconds;
                        }
                        tokens = stream.Tokens;
                        Console.Error.WriteLine(string.Format(CultureInfo.InvariantCulture, "{0} {1:F9} tokens {2}",
                                                              drain ? "drain_s" : "decode_s", seconds, tokens.Length));
                    }
                }
            }
        }
        Console.WriteLine(string.Join(" ", tokens));
        return 0;
    }
}
