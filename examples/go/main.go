// Streaming chat with Ember from Go: go run . [MODEL.gguf] (one message per line on stdin).
// The module replaces "ember" with the binding built by CMake (build/bindings/go/module).
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"ember"
)

func main() {
	home, _ := os.UserHomeDir()
	path := filepath.Join(home, ".cache", "ember", "SmolLM2-135M-Instruct.Q4_1.gguf")
	if len(os.Args) > 1 {
		path = os.Args[1]
	}
	maxTokens := 256
	if v, err := strconv.Atoi(os.Getenv("EMBER_MAX_TOKENS")); err == nil {
		maxTokens = v
	}
	if err := chat(path, maxTokens); err != nil {
		fmt.Fprintln(os.Stderr, "chat:", err)
		os.Exit(1)
	}
}

func chat(path string, maxTokens int) error {
	model, err := ember.LoadModel(path)
	if err != nil {
		return err
	}
	defer model.Close()
	engine, err := ember.NewEngine(model, nil)
	if err != nil {
		return err
	}
	defer engine.Close()
	session, err := engine.NewSession(&ember.SessionOptions{SystemPrompt: "You are a helpful assistant."})
	if err != nil {
		return err
	}
	defer session.Close()
	backend, _ := engine.BackendName()
	fmt.Fprintf(os.Stderr, "ember %s on %s; one message per line, Ctrl-D quits\n", ember.Version(), backend)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		line := strings.TrimSpace(in.Text())
		if line == "" {
			continue
		}
		if err := session.AddMessage("user", line); err != nil {
			return err
		}
		opts := ember.DefaultSampling()
		opts.MaxTokens, opts.Temperature = maxTokens, 0.7
		stream, err := session.Generate(&opts)
		if err != nil {
			return err
		}
		for {
			piece, err := stream.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				stream.Close()
				return err
			}
			fmt.Print(piece)
		}
		stats, _ := stream.Stats()
		fmt.Printf("\n")
		fmt.Fprintf(os.Stderr, "[%.0f tok/s, %s]\n", stats.TokensPerSecond, stream.EndReason())
		stream.Close()
	}
	return in.Err()
}
