// Command example is a complete program using kvroute from Go: a router with two pods, two
// chat requests that share a long system prompt (the second goes to the pod that holds the
// first's KV cache), and one request for a model no pod serves. It prints what the C example
// prints.
package main

import (
	"errors"
	"fmt"
	"log"
	"strings"
	"time"

	kvroute "example.invalid/kvroute/ffi/go"
)

var start = time.Now()

// nowMs is the caller's monotonic clock in milliseconds: the router never reads a clock itself.
func nowMs() uint64 { return uint64(time.Since(start).Milliseconds()) }

// httpStatus is the HTTP status a gateway answers for a failed route.
func httpStatus(err error) int {
	switch {
	case errors.Is(err, kvroute.StatusNoReadyPod), errors.Is(err, kvroute.StatusNoPodInSubset):
		return 503
	case errors.Is(err, kvroute.StatusUnknownModel), errors.Is(err, kvroute.StatusInvalidBody),
		errors.Is(err, kvroute.StatusInvalidStrategy), errors.Is(err, kvroute.StatusInvalidUTF8):
		return 400
	default: // StatusPanic, StatusPoisoned: a bug in kvroute
		return 500
	}
}

// handle routes one OpenAI request body as received (the model is taken from the body), prints
// what a gateway would do with it, and completes it. strategy is the request's
// routing-strategy header ("" for the router's).
func handle(r *kvroute.Router, body []byte, strategy string) {
	routedMs := nowMs()
	d, err := r.RouteJSON("", body, strategy, routedMs)
	if err != nil {
		fmt.Println(httpStatus(err), err) // err.Error() is the status name
		return
	}
	addr, _ := r.PodAddress(d.Pod) // connect here
	why, _ := r.Explain(d.Ticket)  // log it, or send it as a header
	fmt.Println(200, addr, why)
	// ... proxy the request to addr; when streaming, report the first chunk (optional, it
	// teaches least-ttft earlier):
	firstMs := nowMs() - routedMs
	if err := r.FirstToken(d.Ticket, kvroute.Timings{FirstTokenMs: &firstMs}, nowMs()); err != nil {
		log.Print(err)
	}
	// ... then, exactly once, say how it ended: Success, Cancelled, Failed (a 5xx),
	// ConnectFailed, Reset or Timeout (see "Pod health").
	if err := r.Complete(d.Ticket, kvroute.Success, nowMs()); err != nil {
		log.Print(err)
	}
}

func main() {
	// Seed fixes every random choice: fixed here so that every run prints the same; a gateway
	// passes fresh randomness (crypto/rand).
	r, err := kvroute.NewRouter(kvroute.Config{Seed: 42, Strategy: "prefix-cache"})
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close() // idempotent; a finalizer is the backstop

	for _, pod := range [][2]string{{"vllm-a", "10.0.0.1:8000"}, {"vllm-b", "10.0.0.2:8000"}} {
		if _, err := r.AddPod("llama", pod[0], pod[1], true); err != nil {
			log.Fatal(err)
		}
	}

	system := strings.Repeat("You are a careful assistant. ", 20)
	for _, q := range []string{"What is KV caching?", "And prefix caching?"} {
		body := fmt.Sprintf(`{"model":"llama","messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, system, q)
		handle(r, []byte(body), "")
	}
	handle(r, []byte(`{"model":"mistral","prompt":"Hello"}`), "")

	// Timers: call Tick when the next deadline is due (or every second).
	if at, ok, _ := r.NextDeadline(); ok && at <= nowMs() {
		if err := r.Tick(nowMs()); err != nil {
			log.Print(err)
		}
	}
}
