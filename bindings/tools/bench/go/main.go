// The Go binding's side of bindings/tools/bench_bindings.py (a benchmark, not a test).
//
//	bench_go MODEL N PROMPT decode|drain [REPS]
//
// Each repetition: a fresh session on one engine (KV pool 64 MiB, as greedy_ref), one user
// message, a greedy reply of exactly N tokens (IgnoreEOS), read through the binding's Stream.
//
//	decode: times from the first piece to the end as the consumer sees it ("decode_s T tokens N").
//	drain:  waits for the stream to end, then times reading its queued events: the binding's own
//	        cost with the engine out of the way ("drain_s T tokens N").
//
// The last repetition's token ids go to stdout (the driver checks them against the C API's).
package main

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"ember"
)

func main() {
	if len(os.Args) < 5 {
		fmt.Fprintln(os.Stderr, "usage: bench_go MODEL N PROMPT decode|drain [REPS]")
		os.Exit(2)
	}
	n, err1 := strconv.Atoi(os.Args[2])
	reps := 1
	var err2 error
	if len(os.Args) > 5 {
		reps, err2 = strconv.Atoi(os.Args[5])
	}
	if err1 != nil || err2 != nil {
		fmt.Fprintln(os.Stderr, "bench_go: N and REPS are integers")
		os.Exit(2)
	}
	tokens, err := run(os.Args[1], n, os.Args[3], os.Args[4] == "drain", reps)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench_go:", err)
		os.Exit(1)
	}
	ids := make([]string, len(tokens))
	for i, t := range tokens {
		ids[i] = strconv.Itoa(t)
	}
	fmt.Println(strings.Join(ids, " "))
}

func run(path string, n int, prompt string, drain bool, reps int) ([]int, error) {
	model, err := ember.LoadModel(path)
	if err != nil {
		return nil, err
	}
	defer model.Close()
	engine, err := ember.NewEngine(model, &ember.EngineOptions{KVMemoryBytes: 64 << 20})
	if err != nil {
		return nil, err
	}
	defer engine.Close()
	var tokens []int
	for r := 0; r < reps; r++ {
		if tokens, err = once(engine, n, prompt, drain); err != nil {
			return nil, err
		}
	}
	return tokens, nil
}

func once(engine *ember.Engine, n int, prompt string, drain bool) ([]int, error) {
	session, err := engine.NewSession(nil)
	if err != nil {
		return nil, err
	}
	defer session.Close()
	if err := session.AddMessage("user", prompt); err != nil {
		return nil, err
	}
	opts := ember.DefaultSampling()
	opts.MaxTokens = n
	opts.Temperature = 0
	opts.IgnoreEOS = true
	stream, err := session.Generate(&opts)
	if err != nil {
		return nil, err
	}
	defer stream.Close()
	var start time.Time
	if drain {
		for {
			stats, err := stream.Stats()
			if err != nil {
				return nil, err
			}
			if stats.Finished {
				break
			}
			time.Sleep(time.Millisecond)
		}
		start = time.Now()
	}
	for {
		_, err := stream.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		if start.IsZero() {
			start = time.Now()
		}
	}
	seconds := time.Since(start).Seconds()
	tokens := stream.Tokens()
	what := "decode_s"
	if drain {
		what = "drain_s"
	}
	fmt.Fprintf(os.Stderr, "%s %.9f tokens %d\n", what, seconds, len(tokens))
	return tokens, nil
}
