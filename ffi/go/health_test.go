package kvroute

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// newHealthRouter is a least-request router with pods a (10.0.0.1:8000) and b (10.0.0.2:8000)
// of model "llama" and the given health rules.
func newHealthRouter(t *testing.T, seed uint64, h HealthConfig) (r *Router, a, b PodID) {
	t.Helper()
	r, err := NewRouter(Config{Seed: seed, Strategy: "least-request", Health: h})
	if err != nil {
		t.Fatalf("NewRouter: %v", err)
	}
	if a, err = r.AddPod("llama", "vllm-a", "10.0.0.1:8000", true); err != nil {
		t.Fatal(err)
	}
	if b, err = r.AddPod("llama", "vllm-b", "10.0.0.2:8000", true); err != nil {
		t.Fatal(err)
	}
	return r, a, b
}

// mustRoute routes a short prompt (no complete block) with strategy ("" = the default).
func mustRoute(t *testing.T, r *Router, strategy string, nowMs uint64) Decision {
	t.Helper()
	d, err := r.Route("llama", []byte("hi"), strategy, nowMs)
	if err != nil {
		t.Fatalf("route at %d: %v", nowMs, err)
	}
	return d
}

func mustComplete(t *testing.T, r *Router, ticket uint64, o Outcome, nowMs uint64) HealthEvent {
	t.Helper()
	e, err := r.CompleteWithEvent(ticket, o, Timings{}, nowMs)
	if err != nil {
		t.Fatalf("complete %d: %v", ticket, err)
	}
	return e
}

func mustInfo(t *testing.T, r *Router, pod PodID) PodInfo {
	t.Helper()
	info, err := r.PodInfo(pod)
	if err != nil {
		t.Fatal(err)
	}
	return info
}

func TestOutcomeCodesAreAcceptedAndCounted(t *testing.T) {
	if ConnectFailed != 3 || Reset != 4 || Timeout != 5 {
		t.Fatalf("outcome numbers %d %d %d", ConnectFailed, Reset, Timeout)
	}
	r, err := NewRouter(Config{Seed: 3, Strategy: "least-request"})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.AddPod("solo", "solo-a", "10.0.1.1:8000", true); err != nil {
		t.Fatal(err)
	}
	// A model of one pod never loses it: the third gateway failure meets the rule, but the
	// ejection is skipped.
	want := []HealthEvent{HealthNone, HealthNone, HealthEjectionSkipped}
	for i, o := range []Outcome{ConnectFailed, Reset, Timeout} {
		d, err := r.Route("solo", nil, "", uint64(10+i))
		if err != nil {
			t.Fatal(err)
		}
		if e, err := r.CompleteWithEvent(d.Ticket, o, Timings{}, uint64(10+i)); err != nil || e != want[i] {
			t.Fatalf("outcome %d: %v %v, want %v", o, e, err, want[i])
		}
	}
	d, err := r.Route("solo", nil, "", 20)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.CompleteWithEvent(d.Ticket, Outcome(6), Timings{}, 20); !errors.Is(err, StatusInvalidParameter) {
		t.Fatalf("outcome 6: %v", err)
	}
	if err := r.Complete(d.Ticket, Timeout, 21); err != nil {
		t.Fatal(err)
	}
	s, err := r.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if s.CompletedConnectFailed != 1 || s.CompletedReset != 1 || s.CompletedTimeout != 2 || s.TicketsOpen != 0 {
		t.Fatalf("stats %+v", s)
	}
	if HealthEjected.String() != "ejected" || HealthEjectionSkipped.String() != "ejection_skipped" || HealthEvent(99).String() != "unknown" {
		t.Fatalf("labels %q %q %q", HealthEjected, HealthEjectionSkipped, HealthEvent(99))
	}
}

// Three connect failures eject one pod of two: routes never pick it and say Excluded 1; after
// the ejection time one probe goes there, and its success readmits the pod.
func TestConnectFailuresEjectAndTheProbeReadmits(t *testing.T) {
	r, a, b := newHealthRouter(t, 5, HealthConfig{BaseEjection: time.Second})
	defer r.Close()
	if err := r.SetPodReady(b, false); err != nil {
		t.Fatal(err)
	}
	var toA []Decision
	for i := 0; i < 3; i++ {
		toA = append(toA, mustRoute(t, r, "", 100))
	}
	if err := r.SetPodReady(b, true); err != nil {
		t.Fatal(err)
	}
	for i, d := range toA {
		want := HealthNone
		if i == 2 {
			want = HealthEjected
		}
		if d.Pod != a {
			t.Fatalf("route %d went to %d", i, d.Pod)
		}
		if e := mustComplete(t, r, d.Ticket, ConnectFailed, 200); e != want {
			t.Fatalf("completion %d: %v, want %v", i, e, want)
		}
	}
	info := mustInfo(t, r, a)
	if !info.Ejected || info.Probing || info.EjectedUntilMs != 1200 || info.EjectionsGateway != 1 || info.Ejections5xx != 0 {
		t.Fatalf("after the ejection: %+v", info)
	}
	if at, ok, err := r.NextDeadline(); err != nil || !ok || at != 1200 {
		t.Fatalf("deadline %d %v %v", at, ok, err)
	}
	for i, s := range []string{"least-request", "random", "prefix-cache", "least-ttft"} {
		d := mustRoute(t, r, s, uint64(300+i))
		if d.Pod != b || d.Excluded != 1 || d.HealthProbe {
			t.Fatalf("%s while ejected: %+v", s, d)
		}
		mustComplete(t, r, d.Ticket, Success, uint64(300+i))
	}
	busy := mustRoute(t, r, "", 400) // b keeps one request open
	if line, err := r.Explain(busy.Ticket); err != nil || !strings.Contains(line, " excluded=1") {
		t.Fatalf("explanation %q %v", line, err)
	}

	if err := r.Tick(1200); err != nil {
		t.Fatal(err)
	}
	if info := mustInfo(t, r, a); !info.Ejected || !info.Probing || info.EjectedUntilMs != 0 {
		t.Fatalf("after the ejection time: %+v", info)
	}
	probe := mustRoute(t, r, "", 1201)
	if probe.Pod != a || !probe.HealthProbe || probe.Excluded != 0 {
		t.Fatalf("probe %+v", probe)
	}
	if other := mustRoute(t, r, "", 1202); other.Pod != b || other.Excluded != 1 {
		t.Fatalf("one probe at a time: %+v", other)
	}
	if e := mustComplete(t, r, probe.Ticket, Success, 1300); e != HealthReadmitted {
		t.Fatalf("probe success: %v", e)
	}
	if info := mustInfo(t, r, a); info.Ejected || info.Probing {
		t.Fatalf("after the probe: %+v", info)
	}
	if back := mustRoute(t, r, "", 1301); back.Pod != a || back.Excluded != 0 || back.HealthProbe {
		t.Fatalf("after readmission: %+v", back)
	}
}

// Three failed checks take a pod out of service, a passed one brings it back.
func TestHealthChecksTakeAPodOutAndBringItBack(t *testing.T) {
	r, a, b := newHealthRouter(t, 9, HealthConfig{})
	defer r.Close()
	for i, want := range []HealthEvent{HealthNone, HealthNone, HealthChecksFailing, HealthNone} {
		if e, err := r.ReportHealthCheck(a, false, uint64(10+i)); err != nil || e != want {
			t.Fatalf("failed check %d: %v %v, want %v", i, e, err, want)
		}
	}
	if info := mustInfo(t, r, a); !info.ChecksFailing || info.Ejected || !info.Ready {
		t.Fatalf("checks failing: %+v", info)
	}
	for i := 0; i < 10; i++ {
		s := "least-request"
		if i%2 == 1 {
			s = "random"
		}
		d := mustRoute(t, r, s, uint64(20+i))
		if d.Pod != b || d.Excluded != 1 {
			t.Fatalf("route %d: %+v", i, d)
		}
		mustComplete(t, r, d.Ticket, Success, uint64(20+i))
	}
	if _, err := r.ReportHealthCheck(PodID(4321), true, 40); !errors.Is(err, StatusUnknownPod) {
		t.Fatalf("unknown pod: %v", err)
	}
	if e, err := r.ReportHealthCheck(a, true, 50); err != nil || e != HealthChecksPassing {
		t.Fatalf("passed check: %v %v", e, err)
	}
	if info := mustInfo(t, r, a); info.ChecksFailing {
		t.Fatalf("checks passing: %+v", info)
	}
	first, second := mustRoute(t, r, "", 51), mustRoute(t, r, "", 52)
	if first.Pod == second.Pod || second.Excluded != 0 {
		t.Fatalf("both pods take requests again: %+v %+v", first, second)
	}
}

func TestEndpointSubset(t *testing.T) {
	r, a, b := newHealthRouter(t, 13, HealthConfig{})
	defer r.Close()
	c, err := r.AddPod("llama", "vllm-c", "10.0.0.3:8000", true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.AddPod("other", "vllm-d", "10.0.0.4:8000", true); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		d, err := r.RouteSubset("llama", []byte("hi"), "random", []string{"10.0.0.2:8000"}, 10)
		if err != nil || d.Pod != b {
			t.Fatalf("only b: %+v %v", d, err)
		}
	}
	picked := map[PodID]int{}
	for i := 0; i < 10; i++ { // kept open: least-request spreads over the subset, never b
		d, err := r.RouteSubset("llama", []byte("hi"), "", []string{"10.0.0.1:8000", "10.9.9.9:1", "10.0.0.3:8000"}, 20)
		if err != nil {
			t.Fatal(err)
		}
		picked[d.Pod]++
	}
	if picked[a] != 5 || picked[c] != 5 {
		t.Fatalf("a or c: %v", picked)
	}
	body := []byte(`{"model":"llama","prompt":"hello"}`)
	if d, err := r.RouteJSONSubset("", body, "", []string{"10.0.0.2:8000"}, 30); err != nil || d.Pod != b {
		t.Fatalf("JSON, only b: %+v %v", d, err)
	}
	if d, err := r.RouteSubset("llama", []byte("hi"), "", nil, 31); err != nil || d.Pod == b {
		t.Fatalf("nil subset (b is the busiest): %+v %v", d, err)
	}
	for _, subset := range [][]string{{}, {"10.9.9.9:8000"}, {"10.0.0.4:8000"}} {
		if _, err := r.RouteSubset("llama", []byte("hi"), "", subset, 40); !errors.Is(err, StatusNoPodInSubset) {
			t.Fatalf("subset %q: %v", subset, err)
		}
	}
	if _, err := r.RouteJSONSubset("", body, "", []string{}, 40); !errors.Is(err, StatusNoPodInSubset) ||
		err.Error() != "KVROUTE_STATUS_NO_POD_IN_SUBSET" {
		t.Fatalf("JSON, empty subset: %v", err)
	}
	if _, err := r.RouteSubset("llama", nil, "", []string{"10.0.0.2:8000\xff"}, 40); !errors.Is(err, StatusInvalidUTF8) {
		t.Fatalf("bad UTF-8: %v", err)
	}
	if _, err := r.RouteSubset("mistral", nil, "", []string{"10.0.0.2:8000"}, 40); !errors.Is(err, StatusUnknownModel) {
		t.Fatalf("unknown model: %v", err)
	}
}

func TestHealthConfig(t *testing.T) {
	zero, over := uint32(0), uint32(101)
	for _, bad := range []HealthConfig{
		{BaseEjection: -time.Second},
		{MaxEjection: -time.Second},
		{BaseEjection: time.Microsecond}, // 0 ms
		{MaxEjectionPercent: &over},
	} {
		if _, err := NewRouter(Config{Health: bad}); !errors.Is(err, StatusInvalidParameter) {
			t.Fatalf("%+v: %v", bad, err)
		}
	}
	// With the gateway-failure rule off and 5xx at its default, three connect failures eject
	// nothing; BaseEjection sets the length.
	r, a, b := newHealthRouter(t, 17, HealthConfig{ConsecutiveGatewayFailures: &zero, BaseEjection: 2 * time.Second})
	defer r.Close()
	if err := r.SetPodReady(b, false); err != nil {
		t.Fatal(err)
	}
	var toA []Decision
	for i := 0; i < 5; i++ {
		toA = append(toA, mustRoute(t, r, "", 10))
	}
	if err := r.SetPodReady(b, true); err != nil {
		t.Fatal(err)
	}
	for i, d := range toA {
		want := HealthNone
		if i == 4 {
			want = HealthEjected // the fifth upstream error in a row
		}
		if e := mustComplete(t, r, d.Ticket, ConnectFailed, 10); d.Pod != a || e != want {
			t.Fatalf("failure %d on %d: %v, want %v", i, d.Pod, e, want)
		}
	}
	if info := mustInfo(t, r, a); info.EjectedUntilMs != 2010 || info.Ejections5xx != 1 || info.EjectionsGateway != 0 {
		t.Fatalf("%+v", info)
	}
}
