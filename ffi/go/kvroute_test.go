package kvroute

import (
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

const sentence = "The service tracks request latency, token throughput, cache utilization, and healthy replicas.\n"

// studyPrompt is the study's prompt shape (~28,000 bytes): a 256-hex salt line, `Document N`,
// the sentence 300 times, then a question.
func studyPrompt(family, question int) string {
	salt := strings.Repeat(fmt.Sprintf("%016x", uint64(family)*0x9E3779B97F4A7C15+1), 16)
	return fmt.Sprintf("%s\nDocument %d\n%sQuestion %06d: Explain the operational tradeoffs in detail.",
		salt, family, strings.Repeat(sentence, 300), question)
}

func newTestRouter(t testing.TB, cfg Config, pods int) *Router {
	t.Helper()
	r, err := NewRouter(cfg)
	if err != nil {
		t.Fatalf("NewRouter: %v", err)
	}
	for i := 0; i < pods; i++ {
		if _, err := r.AddPod("study", fmt.Sprintf("vllm-%d", i), fmt.Sprintf("10.0.0.%d:8000", i+1), true); err != nil {
			t.Fatalf("AddPod: %v", err)
		}
	}
	return r
}

func TestVersionMatchesHeader(t *testing.T) {
	if Version() != HeaderVersion {
		t.Fatalf("linked library %s, header %s", Version(), HeaderVersion)
	}
}

func TestRouteMatchesPrefixAndCompletesOnce(t *testing.T) {
	r := newTestRouter(t, Config{Seed: 7}, 3)
	defer r.Close()
	prompt := []byte(studyPrompt(1, 100000))
	first, err := r.Route("study", prompt, "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	if first.Reason != ReasonLeastRequestFallback || first.TotalBlocks != uint32(len(prompt)/128) {
		t.Fatalf("first decision %+v", first)
	}
	body, _ := json.Marshal(map[string]any{"model": "study", "prompt": string(prompt)})
	second, err := r.RouteJSON("", body, "", 1001)
	if err != nil {
		t.Fatal(err)
	}
	if second.Pod != first.Pod || second.Reason != ReasonPrefixMatch || second.MatchPercent != 100 {
		t.Fatalf("second decision %+v, first %+v", second, first)
	}
	line, err := r.Explain(second.Ticket)
	if err != nil || !strings.HasPrefix(line, "strategy=prefix-cache reason=prefix_match pod=vllm-") {
		t.Fatalf("Explain: %q %v", line, err)
	}
	if n, _ := r.InFlight(first.Pod); n != 2 {
		t.Fatalf("in flight %d, want 2", n)
	}
	if err := r.Complete(first.Ticket, Success, 1002); err != nil {
		t.Fatal(err)
	}
	if err := r.Complete(first.Ticket, Success, 1003); !errors.Is(err, StatusTicketNotOpen) {
		t.Fatalf("double completion: %v", err)
	}
	if err := r.Complete(1<<40, Success, 1003); !errors.Is(err, StatusUnknownTicket) {
		t.Fatalf("unknown ticket: %v", err)
	}
	if err := r.Complete(second.Ticket, Outcome(9), 1003); !errors.Is(err, StatusInvalidParameter) {
		t.Fatalf("bad outcome: %v", err)
	}
	if err := r.Complete(second.Ticket, Cancelled, 1003); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Explain(second.Ticket); !errors.Is(err, StatusUnknownTicket) {
		t.Fatalf("explain after completion: %v", err)
	}
}

func TestErrorsAreStatuses(t *testing.T) {
	if _, err := NewRouter(Config{Strategy: "round-robin"}); !errors.Is(err, StatusInvalidStrategy) {
		t.Fatalf("bad strategy: %v", err)
	}
	for _, bad := range []Config{{BlockSize: -1}, {IndexCapacity: -1}, {IndexTTL: -time.Millisecond}, {TicketTTL: -time.Second}} {
		if _, err := NewRouter(bad); !errors.Is(err, StatusInvalidParameter) {
			t.Fatalf("%+v: %v", bad, err)
		}
	}
	r := newTestRouter(t, Config{}, 1)
	defer r.Close()
	if _, err := r.Route("nosuch", nil, "", 1); !errors.Is(err, StatusUnknownModel) || err.Error() != "KVROUTE_STATUS_UNKNOWN_MODEL" {
		t.Fatalf("unknown model: %v", err)
	}
	if _, err := r.Route("study\xff", nil, "", 1); !errors.Is(err, StatusInvalidUTF8) {
		t.Fatalf("bad UTF-8: %v", err)
	}
	if _, err := r.Route("study", nil, "fastest", 1); !errors.Is(err, StatusInvalidStrategy) {
		t.Fatalf("bad strategy: %v", err)
	}
	if _, err := r.RouteJSON("", []byte(`{"messages":"x"}`), "", 1); !errors.Is(err, StatusInvalidBody) {
		t.Fatalf("bad body: %v", err)
	}
	if _, err := r.AddPod("study", "x", "not-an-address", true); !errors.Is(err, StatusInvalidAddress) {
		t.Fatalf("bad address: %v", err)
	}
	pods, err := r.Pods()
	if err != nil || len(pods) != 1 {
		t.Fatalf("Pods: %v %v", pods, err)
	}
	info, err := r.PodInfo(pods[0])
	if err != nil || info.Name != "vllm-0" || info.Address != "10.0.0.1:8000" || !info.Ready {
		t.Fatalf("PodInfo: %+v %v", info, err)
	}
	if err := r.SetPodReady(pods[0], false); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Route("study", nil, "", 2); !errors.Is(err, StatusNoReadyPod) {
		t.Fatalf("no ready pod: %v", err)
	}
	if err := r.RemovePod(pods[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := r.PodInfo(pods[0]); !errors.Is(err, StatusUnknownPod) {
		t.Fatalf("removed pod: %v", err)
	}
	if err := r.RemoveModel("study"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Route("study", nil, "", 3); !errors.Is(err, StatusUnknownModel) {
		t.Fatalf("removed model: %v", err)
	}
	if err := r.RemoveModel("study"); !errors.Is(err, StatusUnknownModel) {
		t.Fatalf("removed twice: %v", err)
	}
}

func TestCloseIsIdempotentAndUseAfterClosePanics(t *testing.T) {
	r := newTestRouter(t, Config{}, 1)
	r.Close()
	r.Close()
	defer func() {
		if recover() == nil {
			t.Fatal("Route on a closed Router did not panic")
		}
	}()
	_, _ = r.Route("study", nil, "", 1)
}

func TestSameSeedSameDecisions(t *testing.T) {
	run := func() []Decision {
		r := newTestRouter(t, Config{Seed: 42, Strategy: "prefix-cache:2,least-request:1"}, 4)
		defer r.Close()
		var out []Decision
		for i := 0; i < 40; i++ {
			d, err := r.Route("study", []byte(studyPrompt(i%5, i)), "", uint64(i*100))
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, d)
			if i%3 == 0 {
				if err := r.Complete(d.Ticket, Success, uint64(i*100+50)); err != nil {
					t.Fatal(err)
				}
			}
		}
		return out
	}
	a, b := run(), run()
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("decision %d differs: %+v vs %+v", i, a[i], b[i])
		}
	}
}

// Sixteen goroutines route, explain and complete on one Router at once; afterwards every
// counter adds up and no slot is left in flight.
func TestConcurrentUseFrom16Goroutines(t *testing.T) {
	const goroutines, perGoroutine = 16, 60
	r := newTestRouter(t, Config{Seed: 3}, 4)
	defer r.Close()
	prompts := make([][]byte, 8)
	for i := range prompts {
		prompts[i] = []byte(studyPrompt(i, 100000+i))
	}
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < perGoroutine; i++ {
				now := uint64(g*perGoroutine + i)
				d, err := r.Route("study", prompts[(g+i)%len(prompts)], "", now)
				if err != nil {
					errs <- fmt.Errorf("route: %w", err)
					return
				}
				if _, err := r.Explain(d.Ticket); err != nil {
					errs <- fmt.Errorf("explain: %w", err)
					return
				}
				if err := r.Complete(d.Ticket, Success, now); err != nil {
					errs <- fmt.Errorf("complete: %w", err)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	s, err := r.Stats()
	if err != nil {
		t.Fatal(err)
	}
	want := uint64(goroutines * perGoroutine)
	if s.TicketsIssued != want || s.CompletedSuccess != want || s.TicketsOpen != 0 || s.InFlight != 0 || s.TicketsRejected != 0 {
		t.Fatalf("stats after concurrent use: %+v", s)
	}
	var routed uint64
	for _, n := range s.RoutedByReason {
		routed += n
	}
	if routed != want || s.RoutedByReason[ReasonPrefixMatch] == 0 {
		t.Fatalf("reasons %v", s.RoutedByReason)
	}
}

func TestTicketTTLAndDeadline(t *testing.T) {
	r := newTestRouter(t, Config{TicketTTL: 100_000_000}, 1) // 100 ms
	defer r.Close()
	if _, ok, err := r.NextDeadline(); ok || err != nil {
		t.Fatalf("deadline on an empty router: %v %v", ok, err)
	}
	d, err := r.Route("study", []byte("short"), "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	at, ok, err := r.NextDeadline()
	if err != nil || !ok || at != 1100 {
		t.Fatalf("deadline %d %v %v", at, ok, err)
	}
	if err := r.Tick(at); err != nil {
		t.Fatal(err)
	}
	if err := r.Complete(d.Ticket, Success, at+1); !errors.Is(err, StatusTicketNotOpen) {
		t.Fatalf("completion after expiry: %v", err)
	}
}

func TestExtractPrompt(t *testing.T) {
	got, err := ExtractPrompt([]byte(`{"messages":[{"role":"system","content":"a\nb"},{"content":[ {"type":"text"} ]}]}`))
	if err != nil || got != "a\nb [ {\"type\":\"text\"} ]" {
		t.Fatalf("%q %v", got, err)
	}
	if _, err := ExtractPrompt([]byte("nope")); !errors.Is(err, StatusInvalidBody) {
		t.Fatalf("%v", err)
	}
}

// The golden prefix-hash vectors (scheme v1, generated by an independent implementation).
func TestGoldenHashVectors(t *testing.T) {
	raw, err := os.ReadFile("../../tests/vectors/prefix_hash_v1.json")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Scheme string `json:"scheme"`
		Cases  []struct {
			BlockSize int      `json:"block_size"`
			Seed      uint64   `json:"seed"`
			PromptHex string   `json:"prompt_hex"`
			Hashes    []string `json:"hashes"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	if file.Scheme != "v1" || len(file.Cases) < 5 {
		t.Fatalf("unexpected vectors file: scheme %q, %d cases", file.Scheme, len(file.Cases))
	}
	for i, c := range file.Cases {
		prompt, err := hex.DecodeString(c.PromptHex)
		if err != nil {
			t.Fatal(err)
		}
		got, err := PrefixHashes(c.BlockSize, c.Seed, prompt)
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		if len(got) != len(c.Hashes) {
			t.Fatalf("case %d: %d hashes, want %d", i, len(got), len(c.Hashes))
		}
		for j, h := range got {
			if s := fmt.Sprintf("0x%016x", h); s != c.Hashes[j] {
				t.Fatalf("case %d hash %d: %s, want %s", i, j, s, c.Hashes[j])
			}
		}
	}
}

func TestLeastTTFTInputs(t *testing.T) {
	r := newTestRouter(t, Config{Seed: 5, Strategy: "least-ttft"}, 2)
	defer r.Close()
	pods, _ := r.Pods()
	// pods[1] holds 4 sequences, and its engine shows 6 requests this router did not send:
	// least-ttft predicts a wait there and sends everything to pods[0] (idle, with room).
	for i, seqs := range []uint32{16, 4} {
		if err := r.SetPodCapacity(pods[i], seqs); err != nil {
			t.Fatal(err)
		}
	}
	kv := 0.25
	if err := r.ObserveEngine(pods[1], EngineSnapshot{Running: 4, Waiting: 2, KVUsage: &kv}, 10); err != nil {
		t.Fatal(err)
	}
	bad := 2.0
	if err := r.ObserveEngine(pods[1], EngineSnapshot{KVUsage: &bad}, 10); !errors.Is(err, StatusInvalidParameter) {
		t.Fatalf("kv usage 2.0: %v", err)
	}
	for i := uint64(0); i < 8; i++ {
		d, err := r.Route("study", []byte(studyPrompt(int(i), 1)), "", 11+i)
		if err != nil || d.Pod != pods[0] {
			t.Fatalf("route %d: %+v %v", i, d, err)
		}
		if q := decisionField(t, r, d.Ticket, "runner_up_ttft_ms"); q <= decisionField(t, r, d.Ticket, "pred_ttft_ms") {
			t.Fatalf("route %d: the busy pod is not predicted slower", i)
		}
		if err := r.Complete(d.Ticket, Success, 11+i); err != nil {
			t.Fatal(err)
		}
	}
	d, err := r.Route("study", []byte(studyPrompt(2, 1)), "", 20)
	if err != nil || d.Reason != ReasonLeastTTFT {
		t.Fatalf("%+v %v", d, err)
	}
	if ReasonLeastTTFTProbe.String() != "least_ttft_probe" {
		t.Fatalf("%q", ReasonLeastTTFTProbe.String())
	}
	first, total := uint64(150), uint64(4000)
	if err := r.CompleteWithTimings(d.Ticket, Success, Timings{FirstTokenMs: &first, TotalMs: &total}, 4020); err != nil {
		t.Fatal(err)
	}
	if err := r.CompleteWithTimings(d.Ticket, Success, Timings{}, 4021); !errors.Is(err, StatusTicketNotOpen) {
		t.Fatalf("double completion: %v", err)
	}
}

// A pod with two sequence slots, one request open and its engine's KV cache 99% used: a new
// prompt waits for the running request only when the cache's size says the prompt cannot fit.
func TestEngineKVCacheSize(t *testing.T) {
	r := newTestRouter(t, Config{Seed: 5, Strategy: "least-ttft"}, 1)
	defer r.Close()
	pods, _ := r.Pods()
	pod := pods[0]
	if err := r.SetPodCapacity(pod, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Route("study", []byte("first"), "", 0); err != nil {
		t.Fatal(err)
	}
	queueAfter := func(tokens uint64, family int) float64 {
		if err := r.SetEngineKVCacheTokens(pod, tokens); err != nil {
			t.Fatal(err)
		}
		kv := 0.99
		now := uint64(family)
		if err := r.ObserveEngine(pod, EngineSnapshot{Running: 1, KVUsage: &kv}, now); err != nil {
			t.Fatal(err)
		}
		d, err := r.Route("study", []byte(studyPrompt(family, 1)), "", now)
		if err != nil {
			t.Fatal(err)
		}
		q := decisionField(t, r, d.Ticket, "pred_queue_ms")
		if err := r.Complete(d.Ticket, Cancelled, now); err != nil {
			t.Fatal(err)
		}
		return q
	}
	if q := queueAfter(0, 1); q != 0 {
		t.Fatalf("size unknown: queue %v", q)
	}
	if q := queueAfter(100_000, 2); q <= 0 {
		t.Fatalf("1,000 tokens free: queue %v", q)
	}
	if q := queueAfter(0, 3); q != 0 {
		t.Fatalf("unknown again: queue %v", q)
	}
	if err := r.SetEngineKVCacheTokens(PodID(4321), 1); !errors.Is(err, StatusUnknownPod) {
		t.Fatalf("unknown pod: %v", err)
	}
}

// decisionField is the number after "key=" in the ticket's decision line.
func decisionField(t *testing.T, r *Router, ticket uint64, key string) float64 {
	t.Helper()
	line, err := r.Explain(ticket)
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range strings.Fields(line) {
		if v := strings.TrimPrefix(kv, key+"="); v != kv {
			var f float64
			if _, err := fmt.Sscan(v, &f); err != nil {
				t.Fatalf("%s in %q: %v", key, line, err)
			}
			return f
		}
	}
	t.Fatalf("no %s in %q", key, line)
	return 0
}

// queueBehindOneRequest feeds a one-slot pod 30 engine snapshots (with the inter-token
// counters at 10 ms a gap when timed) after a completion without a first-token time, and
// returns the queue predicted for a request waiting behind a study prompt.
func queueBehindOneRequest(t *testing.T, timed bool) float64 {
	r := newTestRouter(t, Config{Seed: 5, Strategy: "least-ttft"}, 1)
	defer r.Close()
	pods, _ := r.Pods()
	if err := r.SetPodCapacity(pods[0], 1); err != nil {
		t.Fatal(err)
	}
	d, err := r.Route("study", []byte("warm-up"), "", 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Complete(d.Ticket, Success, 500); err != nil {
		t.Fatal(err)
	}
	for k := uint64(0); k < 30; k++ {
		s := EngineSnapshot{}
		if timed {
			s.InterToken = &EngineHistogram{Seconds: float64(k), Count: k * 100}
		}
		if err := r.ObserveEngine(pods[0], s, 1000+k*1000); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.Route("study", []byte(studyPrompt(1, 1)), "", 31000); err != nil {
		t.Fatal(err)
	}
	waiting, err := r.Route("study", []byte("next"), "", 31000)
	if err != nil {
		t.Fatal(err)
	}
	return decisionField(t, r, waiting.Ticket, "pred_queue_ms")
}

func TestEngineTimingCounters(t *testing.T) {
	r := newTestRouter(t, Config{Seed: 5, Strategy: "least-ttft"}, 1)
	defer r.Close()
	pods, _ := r.Pods()
	ok := EngineSnapshot{
		Prefill:    &EngineHistogram{Seconds: 2.5, Count: 8},
		InterToken: &EngineHistogram{Seconds: 3.2, Count: 320},
	}
	if err := r.ObserveEngine(pods[0], ok, 10); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []EngineSnapshot{
		{Prefill: &EngineHistogram{Seconds: -1, Count: 8}},
		{InterToken: &EngineHistogram{Seconds: math.NaN(), Count: 8}},
		{InterToken: &EngineHistogram{Seconds: math.Inf(1), Count: 8}},
	} {
		if err := r.ObserveEngine(pods[0], bad, 10); !errors.Is(err, StatusInvalidParameter) {
			t.Fatalf("%+v %+v: %v", bad.Prefill, bad.InterToken, err)
		}
	}

	// The counters reach the model: the request ahead decodes its 127 remaining tokens at the
	// learned ~10 ms instead of the prior 50 ms.
	prior, learned := queueBehindOneRequest(t, false), queueBehindOneRequest(t, true)
	if saved := prior - learned; saved < 4900 || saved > 5200 {
		t.Fatalf("queue %.0f ms with the inter-token counters, %.0f ms without", learned, prior)
	}
}

// ttftAfterFirstToken routes a study prompt (~7,000 tokens) to an idle one-pod least-ttft
// router, reports its first token 7,050 ms after routing when report is set (a prefill rate
// of 1,000 tokens/s against the prior 3,000), completes it without timings, and returns the
// time to first token predicted for the next study prompt.
func ttftAfterFirstToken(t *testing.T, report bool) float64 {
	r := newTestRouter(t, Config{Seed: 5, Strategy: "least-ttft"}, 1)
	defer r.Close()
	d, err := r.Route("study", []byte(studyPrompt(1, 1)), "", 1)
	if err != nil {
		t.Fatal(err)
	}
	if report {
		first, prompt, cached := uint64(7050), uint32(7000), uint32(0)
		tm := Timings{FirstTokenMs: &first, PromptTokens: &prompt, CachedTokens: &cached}
		if err := r.FirstToken(d.Ticket, tm, 7051); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Complete(d.Ticket, Success, 9000); err != nil {
		t.Fatal(err)
	}
	next, err := r.Route("study", []byte(studyPrompt(2, 1)), "", 9001)
	if err != nil {
		t.Fatal(err)
	}
	return decisionField(t, r, next.Ticket, "pred_ttft_ms")
}

func TestFirstToken(t *testing.T) {
	r := newTestRouter(t, Config{Seed: 5, Strategy: "least-ttft"}, 1)
	defer r.Close()
	d, err := r.Route("study", []byte(studyPrompt(1, 1)), "", 10)
	if err != nil {
		t.Fatal(err)
	}
	first, total, prompt := uint64(300), uint64(4000), uint32(7000)
	if err := r.FirstToken(d.Ticket, Timings{PromptTokens: &prompt}, 310); !errors.Is(err, StatusInvalidParameter) {
		t.Fatalf("without FirstTokenMs: %v", err)
	}
	if err := r.FirstToken(d.Ticket+1000, Timings{FirstTokenMs: &first}, 310); !errors.Is(err, StatusUnknownTicket) {
		t.Fatalf("unknown ticket: %v", err)
	}
	if err := r.FirstToken(d.Ticket, Timings{FirstTokenMs: &first, PromptTokens: &prompt}, 310); err != nil {
		t.Fatal(err)
	}
	// A second report is ignored; the completion-only fields are accepted.
	all := Timings{FirstTokenMs: &first, TotalMs: &total, PromptTokens: &prompt}
	if err := r.FirstToken(d.Ticket, all, 311); err != nil {
		t.Fatalf("second report: %v", err)
	}
	if n, _ := r.InFlight(d.Pod); n != 1 {
		t.Fatalf("in flight %d after the first token, want 1 (nothing released)", n)
	}
	if err := r.CompleteWithTimings(d.Ticket, Success, all, 4010); err != nil {
		t.Fatal(err)
	}
	if err := r.FirstToken(d.Ticket, all, 4011); !errors.Is(err, StatusTicketNotOpen) {
		t.Fatalf("after completion: %v", err)
	}

	// The report reaches the model: it learns the slow prefill rate (~2,450 ms without the
	// report, ~2,800 with; a completion without cached tokens says none will come, so the pod
	// is not probed as possibly warm in either case).
	prior, learned := ttftAfterFirstToken(t, false), ttftAfterFirstToken(t, true)
	if learned-prior < 200 {
		t.Fatalf("predicted ttft %.0f ms after a slow first token, %.0f ms without the report", learned, prior)
	}
}

// TestSessionAffinity: a request without a session id gets its pod's back (Go's own base64 of
// the pod's address: AIBrix's encoding); with it, every *Session method goes to that pod; a
// spec without session-affinity gives none; once the pod is removed the id falls back to
// another pod, whose id comes back, and ids that name no pod are no error.
func TestSessionAffinity(t *testing.T) {
	r := newTestRouter(t, Config{Seed: 3, Strategy: "session-affinity"}, 3)
	defer r.Close()
	idOf := func(pod PodID) string {
		addr, err := r.PodAddress(pod)
		if err != nil {
			t.Fatal(err)
		}
		return base64.StdEncoding.EncodeToString([]byte(addr))
	}
	first, err := r.RouteSession("study", []byte("hi"), "", nil, "", 1)
	if err != nil || first.Reason != ReasonRandom || first.SessionID != idOf(first.Pod) {
		t.Fatalf("first: %+v %v", first, err)
	}
	id := first.SessionID
	body := []byte(`{"model":"study","prompt":"hi"}`)
	routes := map[string]func(session string) (Decision, error){
		"RouteSession": func(s string) (Decision, error) {
			return r.RouteSession("study", []byte("hi"), "", nil, s, 2)
		},
		"RouteJSONSession": func(s string) (Decision, error) { return r.RouteJSONSession("", body, "", nil, s, 2) },
		"RouteTokensSession": func(s string) (Decision, error) {
			return r.RouteTokensSession("study", Tokens{IDs: []uint32{1, 2, 3}}, "", 0, nil, s, 2)
		},
		"RouteKeysSession": func(s string) (Decision, error) {
			return r.RouteKeysSession("study", []uint64{7}, 20, 16, "", 0, nil, s, 2)
		},
	}
	for name, route := range routes {
		for i := 0; i < 3; i++ { // the pod's load grows: the tickets stay open
			d, err := route(id)
			if err != nil || d.Pod != first.Pod || d.Reason != ReasonSessionAffinity || d.SessionID != id {
				t.Fatalf("%s: %+v %v, want pod %d", name, d, err, first.Pod)
			}
		}
	}
	// The other methods leave SessionID empty; Router.SessionID reads the decision's.
	d, err := r.Route("study", []byte("hi"), "", 3)
	if err != nil || d.SessionID != "" {
		t.Fatalf("Route: %+v %v", d, err)
	}
	if got, err := r.SessionID(d.Ticket); err != nil || got != idOf(d.Pod) {
		t.Fatalf("SessionID: %q %v, want %q", got, err, idOf(d.Pod))
	}
	// least-request ignores the id (and avoids the loaded pod): no session id.
	d, err = r.RouteJSONSession("", body, "least-request", nil, id, 4)
	if err != nil || d.Pod == first.Pod || d.SessionID != "" {
		t.Fatalf("least-request: %+v %v", d, err)
	}
	// least-ttft reads the id as a cache hint, not a pin, and names the pod it chose.
	d, err = r.RouteJSONSession("", body, "least-ttft", nil, id, 4)
	if err != nil || d.Reason != ReasonLeastTTFT || d.SessionID != idOf(d.Pod) {
		t.Fatalf("least-ttft: %+v %v", d, err)
	}
	if err := r.RemovePod(first.Pod); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{id, "not base64!", "\xff\xfe"} {
		d, err := r.RouteSession("study", []byte("hi"), "", nil, s, 5)
		if err != nil || d.Pod == first.Pod || d.Reason != ReasonRandom || d.SessionID != idOf(d.Pod) {
			t.Fatalf("session %q after removal: %+v %v", s, d, err)
		}
	}
	if _, err := r.SessionID(1 << 40); !errors.Is(err, StatusUnknownTicket) {
		t.Fatalf("SessionID of an unknown ticket: %v", err)
	}
}

func TestDataParallelRanks(t *testing.T) {
	r := newTestRouter(t, Config{Seed: 5, Strategy: "session-affinity"}, 1) // vllm-0: a whole server
	defer r.Close()
	var ranks []PodID
	for i := 0; i < 2; i++ {
		pod, err := r.AddPod("study", fmt.Sprintf("dp/dp%d", i), "10.0.0.9:8000", true)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.SetPodDataParallelRank(pod, int64(i)); err != nil {
			t.Fatal(err)
		}
		ranks = append(ranks, pod)
	}
	seen := map[int64]bool{}
	for now := uint64(1); now < 60; now++ {
		d, err := r.RouteSession("study", []byte("hi"), "", nil, "", now)
		if err != nil {
			t.Fatal(err)
		}
		want := int64(-1)
		for i, p := range ranks {
			if d.Pod == p {
				want = int64(i)
			}
		}
		if d.DataParallelRank != want {
			t.Fatalf("%+v: rank %d, want %d", d, d.DataParallelRank, want)
		}
		seen[want] = true
		again, err := r.RouteSession("study", []byte("hi"), "", nil, d.SessionID, now)
		if err != nil || again.Pod != d.Pod || again.DataParallelRank != want {
			t.Fatalf("session %q: %+v %v, want pod %d", d.SessionID, again, err, d.Pod)
		}
	}
	if len(seen) != 3 {
		t.Fatalf("ranks seen: %v", seen)
	}
	if err := r.SetPodDataParallelRank(ranks[0], 1<<32); !errors.Is(err, StatusInvalidParameter) {
		t.Fatalf("rank 1<<32: %v", err)
	}
	if err := r.SetPodDataParallelRank(99, 0); !errors.Is(err, StatusUnknownPod) {
		t.Fatalf("unknown pod: %v", err)
	}
}

// predictedTTFT reads pred_ttft_ms from a decision's explanation.
func predictedTTFT(t *testing.T, r *Router, ticket uint64) int {
	t.Helper()
	line, err := r.Explain(ticket)
	if err != nil {
		t.Fatalf("Explain: %v", err)
	}
	for _, w := range strings.Fields(line) {
		if strings.HasPrefix(w, "pred_ttft_ms=") {
			n, err := strconv.Atoi(strings.TrimPrefix(w, "pred_ttft_ms="))
			if err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			return n
		}
	}
	t.Fatalf("no prediction in %q", line)
	return 0
}

func TestTTFTSettingsReachTheModel(t *testing.T) {
	prompt := []byte(strings.Repeat("a long shared prompt. ", 400))
	first := func(cfg Config) (int, int) {
		r := newTestRouter(t, cfg, 1)
		defer r.Close()
		a, err := r.Route("study", prompt, "least-ttft", 1)
		if err != nil {
			t.Fatal(err)
		}
		b, err := r.Route("study", prompt, "least-ttft", 1)
		if err != nil {
			t.Fatal(err)
		}
		return predictedTTFT(t, r, a.Ticket), predictedTTFT(t, r, b.Ticket)
	}
	def, _ := first(Config{Seed: 1})
	slow, second := first(Config{Seed: 1, TTFT: map[string]float64{"prefill_tokens_per_s": 300, "max_seqs": 1}})
	if slow <= 5*def {
		t.Fatalf("a tenth of the prefill rate: %d ms vs %d ms", slow, def)
	}
	if second <= slow+def {
		t.Fatalf("one slot: the second request waits (%d ms vs %d ms)", second, slow)
	}
	for _, bad := range []map[string]float64{{"prefill": 1}, {"max_seqs": 2.5}, {"learning_rate": 0}} {
		if _, err := NewRouter(Config{TTFT: bad}); err != StatusInvalidParameter {
			t.Fatalf("%v: got %v, want StatusInvalidParameter", bad, err)
		}
	}
}
