// The Go module test's program (tests/install/go_module_test.sh): built
// against the installed module and libember (cgo, pkg-config), it prints the
// greedy reply's token ids on one line (as bindings/tools/greedy_ref.c).
//
//	greedy MODEL MAX_TOKENS MESSAGE
package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"ember"
)

func main() {
	if err := run(os.Args[1], os.Args[2], os.Args[3]); err != nil {
		fmt.Fprintln(os.Stderr, "greedy:", err)
		os.Exit(1)
	}
}

func run(path, maxTokens, message string) error {
	n, err := strconv.Atoi(maxTokens)
	if err != nil {
		return err
	}
	model, err := ember.LoadModel(path)
	if err != nil {
		return err
	}
	defer model.Close()
	engine, err := ember.NewEngine(model, &ember.EngineOptions{KVMemoryBytes: 64 << 20})
	if err != nil {
		return err
	}
	defer engine.Close()
	session, err := engine.NewSession(nil)
	if err != nil {
		return err
	}
	defer session.Close()
	if err := session.AddMessage("user", message); err != nil {
		return err
	}
	sampling := ember.DefaultSampling()
	sampling.MaxTokens = n
	sampling.Temperature = 0
	stream, err := session.Generate(&sampling)
	if err != nil {
		return err
	}
	defer stream.Close()
	text, err := stream.ReadAll()
	if err != nil {
		return err
	}
	ids := make([]string, 0, n)
	for _, t := range stream.Tokens() {
		ids = append(ids, strconv.Itoa(t))
	}
	fmt.Println(strings.Join(ids, " "))
	fmt.Fprintf(os.Stderr, "ember %s: %q\n", ember.Version(), text)
	return nil
}
