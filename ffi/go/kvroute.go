// Package kvroute links the kvroute router (a KV-cache-aware request router for LLM
// inference fleets) into a Go program through its C library, libkvroute.
//
// A Router is safe for concurrent use by many goroutines: the library locks internally and
// hashes prompts outside its lock. Create one with NewRouter, register pods, then for every
// request call Route (or RouteJSON with the request body, or RouteTokens with its token ids
// when the proxy tokenizes requests as the engine does) and, when the response ends,
// Complete with the decision's ticket, exactly once. A streaming proxy may also report the
// first token with FirstToken as soon as it arrives (least-ttft learns from it earlier).
//
//	r, err := kvroute.NewRouter(kvroute.Config{Seed: seed})
//	defer r.Close()
//	r.AddPod("llama", "vllm-a", "10.0.0.1:8000", true)
//	d, err := r.RouteJSON("", body, "", nowMs)      // model from the body
//	addr, _ := r.PodAddress(d.Pod)                   // forward the request there
//	defer r.Complete(d.Ticket, kvroute.Success, laterMs)
//
// Session affinity (AIBrix's session-affinity strategy, as the request's strategy or the
// configured default): route with the *Session methods (RouteJSONSession, RouteSession,
// RouteTokensSession, RouteKeysSession), passing the request's x-session-id header ("" when it
// has none), and return the decision's SessionID to the client in the response's x-session-id
// header. The client's next request carries it back and goes to the same pod while that pod
// is a candidate; once it is not (removed, not ready, ejected), the request goes to another
// pod, whose session id the response then carries.
//
// Building: the package compiles against its own copy of kvroute.h (kvroute.h in this
// directory, identical to the repository's include/kvroute.h) and links the libkvroute that
// `make install` installed, found through pkg-config: set PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig
// (unless the prefix is one pkg-config searches) and make the library loadable at run time,
// e.g. CGO_LDFLAGS="-Wl,-rpath,$PREFIX/lib". Install the library from the same kvroute
// version as this package: the package panics at start-up when the linked library's version
// differs from its header's (ffi/README.md, "Go").
//
// Memory: Go byte slices and strings are passed to C without copying. This is allowed
// because the library only reads them during the call and never keeps a pointer.
package kvroute

/*
#cgo pkg-config: kvroute
#include <stdlib.h>
#include "kvroute.h"
*/
import "C"

import (
	"reflect"
	"runtime"
	"sort"
	"time"
	"unsafe"
)

// Version is the version of the linked library, "major.minor.patch".
func Version() string { return C.GoString(C.kvroute_version()) }

// versionNumber is the linked library's (major << 16) | (minor << 8) | patch.
func versionNumber() uint32 { return uint32(C.kvroute_version_number()) }

// HeaderVersion is the version of kvroute.h this package was compiled against.
const HeaderVersion = C.KVROUTE_VERSION

// The package's structs are laid out as its kvroute.h says, and the library's output structs
// may grow from one version to the next: a library of another version than the header could
// write past them. Refuse it before any call.
func init() {
	if versionNumber() != uint32(C.KVROUTE_VERSION_NUMBER) {
		panic("kvroute: libkvroute " + Version() + " is linked, but this Go package is for " + HeaderVersion +
			": install libkvroute from the same kvroute version as the package")
	}
}

// Status is a kvroute status code; every error this package returns is a Status. Compare
// with errors.Is(err, kvroute.StatusUnknownModel) or a type switch.
type Status uint32

// The status codes (stable numbers; see kvroute.h).
const (
	StatusOK               Status = C.KVROUTE_STATUS_OK
	StatusNullParameter    Status = C.KVROUTE_STATUS_NULL_PARAMETER
	StatusInvalidParameter Status = C.KVROUTE_STATUS_INVALID_PARAMETER
	StatusInvalidUTF8      Status = C.KVROUTE_STATUS_INVALID_UTF8
	StatusInsufficientSize Status = C.KVROUTE_STATUS_INSUFFICIENT_SIZE
	StatusUnknownModel     Status = C.KVROUTE_STATUS_UNKNOWN_MODEL
	StatusNoReadyPod       Status = C.KVROUTE_STATUS_NO_READY_POD
	StatusUnknownPod       Status = C.KVROUTE_STATUS_UNKNOWN_POD
	StatusUnknownTicket    Status = C.KVROUTE_STATUS_UNKNOWN_TICKET
	StatusTicketNotOpen    Status = C.KVROUTE_STATUS_TICKET_NOT_OPEN
	StatusInvalidStrategy  Status = C.KVROUTE_STATUS_INVALID_STRATEGY
	StatusInvalidAddress   Status = C.KVROUTE_STATUS_INVALID_ADDRESS
	StatusEmptyName        Status = C.KVROUTE_STATUS_EMPTY_NAME
	StatusInvalidBody      Status = C.KVROUTE_STATUS_INVALID_BODY
	StatusInvalidConfig    Status = C.KVROUTE_STATUS_INVALID_CONFIG
	StatusNoPodInSubset    Status = C.KVROUTE_STATUS_NO_POD_IN_SUBSET
	StatusPanic            Status = C.KVROUTE_STATUS_PANIC
	StatusPoisoned         Status = C.KVROUTE_STATUS_POISONED
)

// Error returns the status name, e.g. "KVROUTE_STATUS_UNKNOWN_MODEL".
func (s Status) Error() string { return C.GoString(C.kvroute_status_str(C.uint32_t(s))) }

func check(st C.kvroute_status) error {
	if st == C.KVROUTE_STATUS_OK {
		return nil
	}
	return Status(st)
}

// Reason says why the router chose a pod.
type Reason uint32

// The reasons (stable numbers; see kvroute.h).
const (
	ReasonRandom               Reason = C.KVROUTE_REASON_RANDOM
	ReasonLeastRequest         Reason = C.KVROUTE_REASON_LEAST_REQUEST
	ReasonPrefixMatch          Reason = C.KVROUTE_REASON_PREFIX_MATCH
	ReasonPrefixMatchSkipped   Reason = C.KVROUTE_REASON_PREFIX_MATCH_SKIPPED
	ReasonLeastRequestFallback Reason = C.KVROUTE_REASON_LEAST_REQUEST_FALLBACK
	ReasonWeighted             Reason = C.KVROUTE_REASON_WEIGHTED
	ReasonLeastTTFT            Reason = C.KVROUTE_REASON_LEAST_TTFT
	ReasonLeastTTFTProbe       Reason = C.KVROUTE_REASON_LEAST_TTFT_PROBE
	ReasonLeastKVCache         Reason = C.KVROUTE_REASON_LEAST_KV_CACHE
	ReasonLeastGPUCache        Reason = C.KVROUTE_REASON_LEAST_GPU_CACHE
	ReasonLeastBusyTime        Reason = C.KVROUTE_REASON_LEAST_BUSY_TIME
	ReasonLeastLatency         Reason = C.KVROUTE_REASON_LEAST_LATENCY
	ReasonThroughput           Reason = C.KVROUTE_REASON_THROUGHPUT
	ReasonLeastUtilization     Reason = C.KVROUTE_REASON_LEAST_UTILIZATION
	ReasonPowerOfTwo           Reason = C.KVROUTE_REASON_POWER_OF_TWO
	ReasonSessionAffinity      Reason = C.KVROUTE_REASON_SESSION_AFFINITY
)

// String returns AIBrix's label for the reason, e.g. "prefix_match".
func (r Reason) String() string { return C.GoString(C.kvroute_reason_str(C.uint32_t(r))) }

// Outcome says how a request ended. It also feeds the pod's health: Failed, ConnectFailed,
// Reset and Timeout are upstream errors (HealthConfig.Consecutive5xx of them in a row eject
// the pod), ConnectFailed, Reset and Timeout also gateway failures
// (HealthConfig.ConsecutiveGatewayFailures in a row eject it); a success resets both counts
// and a cancel never counts against the pod.
type Outcome uint32

// The outcomes passed to Complete (stable numbers; see kvroute.h).
const (
	Success       Outcome = C.KVROUTE_OUTCOME_SUCCESS        // finished normally (a 4xx too: the pod worked)
	Cancelled     Outcome = C.KVROUTE_OUTCOME_CANCELLED      // the client went away; says nothing about the pod
	Failed        Outcome = C.KVROUTE_OUTCOME_FAILED         // a 5xx, or a failure not told apart
	ConnectFailed Outcome = C.KVROUTE_OUTCOME_CONNECT_FAILED // the pod could not be connected to
	Reset         Outcome = C.KVROUTE_OUTCOME_RESET          // the pod closed or reset the connection
	Timeout       Outcome = C.KVROUTE_OUTCOME_TIMEOUT        // the pod did not answer in time
)

// HealthEvent is a change of a pod's health, returned by ReportHealthCheck and
// CompleteWithEvent for logs and metrics. New events may be added.
type HealthEvent uint32

// The health events (stable numbers; see kvroute.h).
const (
	HealthNone            HealthEvent = C.KVROUTE_HEALTH_EVENT_NONE             // nothing changed
	HealthEjected         HealthEvent = C.KVROUTE_HEALTH_EVENT_EJECTED          // ejected until PodInfo.EjectedUntilMs
	HealthEjectionSkipped HealthEvent = C.KVROUTE_HEALTH_EVENT_EJECTION_SKIPPED // met a rule, but the model could not spare it
	HealthReadmitted      HealthEvent = C.KVROUTE_HEALTH_EVENT_READMITTED       // back in service (probe or check)
	HealthChecksFailing   HealthEvent = C.KVROUTE_HEALTH_EVENT_CHECKS_FAILING   // active checks failing: out of service
	HealthChecksPassing   HealthEvent = C.KVROUTE_HEALTH_EVENT_CHECKS_PASSING   // active checks passing again
)

// String returns the event's label, e.g. "ejected" ("unknown" for numbers this library does
// not know).
func (e HealthEvent) String() string {
	return C.GoString(C.kvroute_health_event_str(C.uint32_t(e)))
}

// PodID identifies a pod within one Router. Ids are never reused.
type PodID uint32

// Config configures a Router. The zero value of every field means the library's default
// (AIBrix v0.7.0's shipped values: block size 128, index capacity 200000 blocks, index TTL
// 20 min, ticket TTL 30 min, imbalance count 16, stddev factor 2, strategy "prefix-cache").
type Config struct {
	// Strategy is the default strategy spec, e.g. "prefix-cache" or
	// "prefix-cache:2,least-request:1".
	Strategy string
	// BlockSize is the prompt-hash block size in bytes.
	BlockSize int
	// IndexCapacity is the prefix-index capacity in blocks.
	IndexCapacity int
	// IndexTTL is how long a pod's index entry stays valid after its last write.
	IndexTTL time.Duration
	// TicketTTL is how long a ticket may stay open before Tick expires it.
	TicketTTL time.Duration
	// ImbalanceAbsCount, when set, is prefix-cache's max-min in-flight imbalance threshold.
	ImbalanceAbsCount *uint32
	// StddevFactor, when set, is k in prefix-cache's load <= mean + k*stddev filter.
	StddevFactor *float64
	// Seed fixes every random choice: the same seed and calls give the same decisions.
	Seed uint64
	// HashSeed, when set, fixes the prompt-hash seed (otherwise derived from Seed).
	HashSeed *uint64
	// Health holds the pod-health rules (Envoy's outlier-detection defaults).
	Health HealthConfig
	// TTFT sets least-ttft's model by the names of the Envoy service's [ttft] TOML section:
	// engine_block_tokens (the engine's KV block size in tokens, default 16), max_seqs,
	// prefill_tokens_per_s, tpot_ms, overhead_ms, output_tokens, bytes_per_token,
	// learning_rate, max_sample_ratio, snapshot_max_age_ms, tie_ms, stall_weight,
	// explore_wait_ms. An unknown name or a value out of range (a count that is not whole) is
	// StatusInvalidParameter.
	TTFT map[string]float64
}

// HealthConfig holds the pod-health rules: outlier detection from completion outcomes and
// active checks (ReportHealthCheck). The zero value of every field means the library's
// default; the counts for which 0 means something else (a rule turned off, any share) are
// pointers. Durations have millisecond resolution: a negative one, or a BaseEjection under
// 1 ms, is StatusInvalidParameter.
type HealthConfig struct {
	// Consecutive5xx, when set, is how many upstream errors in a row eject a pod (default 5;
	// 0 turns the rule off).
	Consecutive5xx *uint32
	// ConsecutiveGatewayFailures, when set, is how many connect failures, resets or timeouts
	// in a row eject a pod (default 3; 0 turns the rule off).
	ConsecutiveGatewayFailures *uint32
	// BaseEjection is the first ejection's length (default 30 s); the n-th lasts n times as
	// long (n decays while the pod stays in service).
	BaseEjection time.Duration
	// MaxEjection caps an ejection's length (default 300 s; less than BaseEjection is taken
	// as BaseEjection).
	MaxEjection time.Duration
	// MaxEjectionPercent, when set, is the most pods of a model ejected at once, in percent
	// of its pods (default 10; one pod may always be ejected, and one always stays in
	// service). Above 100 is StatusInvalidParameter.
	MaxEjectionPercent *uint32
	// UnhealthyThreshold, when set, is how many failed checks in a row take a pod out of
	// service (default 3; 0: checks never do).
	UnhealthyThreshold *uint32
	// HealthyThreshold is how many passed checks in a row bring it back (0: the default, 1).
	HealthyThreshold uint32
}

// Router is a kvroute router. It is safe for concurrent use, except that Close must not run
// concurrently with other methods.
type Router struct {
	_ptr *C.kvroute_router
}

// ptr returns the live handle or panics if the router was closed. See the package docs of
// wasmtime-go (ffi.go) for why every access goes through one function: it is where the
// debug build forces a GC, so that a missing runtime.KeepAlive shows up in tests.
func (r *Router) ptr() *C.kvroute_router {
	p := r._ptr
	if p == nil {
		panic("kvroute: use of a closed Router")
	}
	maybeGC()
	return p
}

// bytesArg passes a byte slice to C without copying: (&b[0], len) or (NULL, 0).
func bytesArg(b []byte) (*C.uint8_t, C.size_t) {
	if len(b) == 0 {
		return nil, 0
	}
	return (*C.uint8_t)(unsafe.Pointer(&b[0])), C.size_t(len(b))
}

// stringArg passes a string to C without copying (Go 1.19 has no unsafe.StringData). The C
// side only reads it during the call.
func stringArg(s string) (*C.uint8_t, C.size_t) {
	if len(s) == 0 {
		return nil, 0
	}
	hdr := (*reflect.StringHeader)(unsafe.Pointer(&s))
	return (*C.uint8_t)(unsafe.Pointer(hdr.Data)), C.size_t(len(s))
}

// NewRouter builds a router with cfg. Call Close when done (a finalizer frees it otherwise).
// A negative size or duration is StatusInvalidParameter.
func NewRouter(cfg Config) (*Router, error) {
	if cfg.BlockSize < 0 || cfg.IndexCapacity < 0 || cfg.IndexTTL < 0 || cfg.TicketTTL < 0 ||
		cfg.Health.BaseEjection < 0 || cfg.Health.MaxEjection < 0 {
		return nil, StatusInvalidParameter
	}
	b := C.kvroute_config_builder_new()
	if b == nil {
		return nil, StatusPanic
	}
	set := func(st C.kvroute_status) error { return check(st) }
	errs := []error{set(C.kvroute_config_builder_set_seed(b, C.uint64_t(cfg.Seed)))}
	if cfg.Strategy != "" {
		p, n := stringArg(cfg.Strategy)
		errs = append(errs, set(C.kvroute_config_builder_set_strategy(b, p, n)))
	}
	if cfg.BlockSize != 0 {
		errs = append(errs, set(C.kvroute_config_builder_set_block_size(b, C.size_t(cfg.BlockSize))))
	}
	if cfg.IndexCapacity != 0 {
		errs = append(errs, set(C.kvroute_config_builder_set_index_capacity(b, C.size_t(cfg.IndexCapacity))))
	}
	if cfg.IndexTTL != 0 {
		errs = append(errs, set(C.kvroute_config_builder_set_index_ttl_ms(b, C.uint64_t(cfg.IndexTTL.Milliseconds()))))
	}
	if cfg.TicketTTL != 0 {
		errs = append(errs, set(C.kvroute_config_builder_set_ticket_ttl_ms(b, C.uint64_t(cfg.TicketTTL.Milliseconds()))))
	}
	if cfg.ImbalanceAbsCount != nil {
		errs = append(errs, set(C.kvroute_config_builder_set_imbalance_abs_count(b, C.uint32_t(*cfg.ImbalanceAbsCount))))
	}
	if cfg.StddevFactor != nil {
		errs = append(errs, set(C.kvroute_config_builder_set_stddev_factor(b, C.double(*cfg.StddevFactor))))
	}
	if cfg.HashSeed != nil {
		errs = append(errs, set(C.kvroute_config_builder_set_hash_seed(b, C.uint64_t(*cfg.HashSeed))))
	}
	h := cfg.Health
	if h.Consecutive5xx != nil {
		errs = append(errs, set(C.kvroute_config_builder_set_consecutive_5xx(b, C.uint32_t(*h.Consecutive5xx))))
	}
	if h.ConsecutiveGatewayFailures != nil {
		errs = append(errs, set(C.kvroute_config_builder_set_consecutive_gateway_failures(b, C.uint32_t(*h.ConsecutiveGatewayFailures))))
	}
	if h.BaseEjection != 0 {
		errs = append(errs, set(C.kvroute_config_builder_set_base_ejection_ms(b, C.uint64_t(h.BaseEjection.Milliseconds()))))
	}
	if h.MaxEjection != 0 {
		errs = append(errs, set(C.kvroute_config_builder_set_max_ejection_ms(b, C.uint64_t(h.MaxEjection.Milliseconds()))))
	}
	if h.MaxEjectionPercent != nil {
		errs = append(errs, set(C.kvroute_config_builder_set_max_ejection_percent(b, C.uint32_t(*h.MaxEjectionPercent))))
	}
	if h.UnhealthyThreshold != nil {
		errs = append(errs, set(C.kvroute_config_builder_set_unhealthy_threshold(b, C.uint32_t(*h.UnhealthyThreshold))))
	}
	if h.HealthyThreshold != 0 {
		errs = append(errs, set(C.kvroute_config_builder_set_healthy_threshold(b, C.uint32_t(h.HealthyThreshold))))
	}
	keys := make([]string, 0, len(cfg.TTFT))
	for k := range cfg.TTFT {
		keys = append(keys, k)
	}
	sort.Strings(keys) // the first error is the same on every run
	for _, k := range keys {
		p, n := stringArg(k)
		errs = append(errs, set(C.kvroute_config_builder_set_ttft(b, p, n, C.double(cfg.TTFT[k]))))
		runtime.KeepAlive(k)
	}
	runtime.KeepAlive(cfg.Strategy)
	for _, err := range errs {
		if err != nil {
			C.kvroute_config_builder_free(b)
			return nil, err
		}
	}
	var config *C.kvroute_config
	// Build consumes the builder whether it succeeds or fails.
	if err := check(C.kvroute_config_builder_build(b, &config)); err != nil {
		return nil, err
	}
	defer C.kvroute_config_free(config)
	r := &Router{}
	if err := check(C.kvroute_router_new(config, &r._ptr)); err != nil {
		return nil, err
	}
	runtime.SetFinalizer(r, (*Router).Close)
	return r, nil
}

// Close frees the router. It is idempotent; any other method called afterwards panics.
func (r *Router) Close() {
	if r._ptr == nil {
		return
	}
	runtime.SetFinalizer(r, nil)
	C.kvroute_router_free(r._ptr)
	r._ptr = nil
}

// Decision is one routing decision. The request holds an in-flight slot on Pod until
// Complete(Ticket, ...) is called.
type Decision struct {
	Ticket        uint64
	Pod           PodID
	Reason        Reason
	MatchPercent  uint32 // matched*100/total, rounded down
	MatchedBlocks uint32 // leading prompt blocks the pod held
	TotalBlocks   uint32 // complete blocks in the prompt
	Imbalance     bool   // prefix-cache's imbalance guard fired
	Load          uint32 // the pod's in-flight load before this request
	LoadMin       uint32
	LoadMax       uint32
	LoadMean      float64
	ReadyPods     uint32
	Excluded      uint32 // ready pods left out for their health (ejected, probe out, checks failing)
	HealthProbe   bool   // the probe of a pod whose ejection is over: its outcome decides
	// DataParallelRank is the chosen pod's engine rank when it is one engine of a
	// data-parallel server (Router.SetPodDataParallelRank): send it upstream as vLLM's
	// X-data-parallel-rank header. -1 for a whole server.
	DataParallelRank int64
	// SessionID is the chosen pod's session id for session-affinity and least-ttft, to return
	// to the client in the response's x-session-id header; set by the *Session methods when
	// the strategy spec includes either, "" otherwise (see RouteSession and Router.SessionID).
	SessionID string
}

func decisionFrom(d *C.kvroute_decision) Decision {
	return Decision{
		Ticket:           uint64(d.ticket),
		Pod:              PodID(d.pod),
		Reason:           Reason(d.reason),
		MatchPercent:     uint32(d.match_percent),
		MatchedBlocks:    uint32(d.matched_blocks),
		TotalBlocks:      uint32(d.total_blocks),
		Imbalance:        bool(d.imbalance),
		Load:             uint32(d.load),
		LoadMin:          uint32(d.load_min),
		LoadMax:          uint32(d.load_max),
		LoadMean:         float64(d.load_mean),
		ReadyPods:        uint32(d.ready_pods),
		Excluded:         uint32(d.excluded),
		HealthProbe:      bool(d.health_probe),
		DataParallelRank: int64(d.data_parallel_rank),
	}
}

// Route routes a request whose prompt is given as bytes. strategy "" uses the configured
// default; nowMs is the caller's monotonic clock in milliseconds. It passes no output-token
// limit; RouteJSON reads one from the body.
func (r *Router) Route(model string, prompt []byte, strategy string, nowMs uint64) (Decision, error) {
	return r.RouteSubset(model, prompt, strategy, nil, nowMs)
}

// RouteSubset is Route restricted to an endpoint subset (the Gateway API Inference Extension's
// subset hint): only the model's pods whose "ip:port" address is in subset are candidates.
// A nil subset means none (Route); a non-nil empty one, or one where no pod of the model is
// ready and in service, gives StatusNoPodInSubset.
func (r *Router) RouteSubset(model string, prompt []byte, strategy string, subset []string, nowMs uint64) (Decision, error) {
	return r.routeBytes(model, prompt, strategy, subset, "", nowMs)
}

// RouteSession is RouteSubset with the request's session id, for AIBrix's session-affinity
// strategy: sessionID is the request's x-session-id header ("" when it has none), and the
// decision's SessionID is the one to return to the client in the response's x-session-id
// header, so that its next request, passing it back, goes to the same pod.
//
// With a strategy spec (strategy, or the configured default) that includes session-affinity,
// a session id naming a candidate pod (of the model, ready, in service, in the subset if any)
// sends the request there (ReasonSessionAffinity; in a weighted spec that pod scores 1 for
// session-affinity, the others 0). Without one, or with one naming no candidate (its pod was
// removed, is not ready, ejected or failing its checks, is outside the subset, or the id is
// not the base64 of an address), session-affinity alone picks a uniformly random candidate
// (ReasonRandom). Either way the decision's SessionID is the chosen pod's: the standard base64
// of its address as given to AddPod, AIBrix's encoding (stateless: whichever pod has that
// address takes the session). A session id that is not base64, or not even UTF-8, is no
// error. Under least-ttft the session id does not pick the pod: the model counts the pod it
// names as holding the previous turn's answer, and SessionID names the chosen pod. With any
// other spec, sessionID is ignored and SessionID is "".
func (r *Router) RouteSession(model string, prompt []byte, strategy string, subset []string, sessionID string, nowMs uint64) (Decision, error) {
	d, err := r.routeBytes(model, prompt, strategy, subset, sessionID, nowMs)
	return r.withSessionID(d, err, nowMs)
}

func (r *Router) routeBytes(model string, prompt []byte, strategy string, subset []string, sessionID string, nowMs uint64) (Decision, error) {
	var d C.kvroute_decision
	mp, mn := stringArg(model)
	pp, pn := bytesArg(prompt)
	sp, sn := stringArg(strategy)
	ap, an, free := subsetArg(subset)
	defer free()
	ip, in := stringArg(sessionID)
	st := C.kvroute_router_route_session(r.ptr(), mp, mn, pp, pn, sp, sn, ap, an, ip, in, C.uint64_t(nowMs), &d)
	runtime.KeepAlive(r)
	runtime.KeepAlive(model)
	runtime.KeepAlive(prompt)
	runtime.KeepAlive(strategy)
	runtime.KeepAlive(sessionID)
	if err := check(st); err != nil {
		return Decision{}, err
	}
	return decisionFrom(&d), nil
}

// RouteJSON routes a request given as its OpenAI-style JSON body (chat completions or
// completions); the prompt is extracted as AIBrix does. model "" takes the body's "model".
// The body's max_completion_tokens (else max_tokens) caps the decode least-ttft predicts.
func (r *Router) RouteJSON(model string, body []byte, strategy string, nowMs uint64) (Decision, error) {
	return r.RouteJSONSubset(model, body, strategy, nil, nowMs)
}

// RouteJSONSubset is RouteJSON restricted to an endpoint subset, as in RouteSubset.
func (r *Router) RouteJSONSubset(model string, body []byte, strategy string, subset []string, nowMs uint64) (Decision, error) {
	return r.routeJSON(model, body, strategy, subset, "", nowMs)
}

// RouteJSONSession is RouteJSONSubset with the request's session id (its x-session-id header,
// which is not part of the body), as in RouteSession.
func (r *Router) RouteJSONSession(model string, body []byte, strategy string, subset []string, sessionID string, nowMs uint64) (Decision, error) {
	d, err := r.routeJSON(model, body, strategy, subset, sessionID, nowMs)
	return r.withSessionID(d, err, nowMs)
}

func (r *Router) routeJSON(model string, body []byte, strategy string, subset []string, sessionID string, nowMs uint64) (Decision, error) {
	var d C.kvroute_decision
	mp, mn := stringArg(model)
	bp, bn := bytesArg(body)
	sp, sn := stringArg(strategy)
	ap, an, free := subsetArg(subset)
	defer free()
	ip, in := stringArg(sessionID)
	st := C.kvroute_router_route_json_session(r.ptr(), mp, mn, bp, bn, sp, sn, ap, an, ip, in, C.uint64_t(nowMs), &d)
	runtime.KeepAlive(r)
	runtime.KeepAlive(model)
	runtime.KeepAlive(body)
	runtime.KeepAlive(strategy)
	runtime.KeepAlive(sessionID)
	if err := check(st); err != nil {
		return Decision{}, err
	}
	return decisionFrom(&d), nil
}

// withSessionID completes a successful route's decision with its session id. If that cannot be
// read (a bug, or a concurrent Tick expired the ticket already), the ticket is released as
// Cancelled, which says nothing against the pod, and the error returned.
func (r *Router) withSessionID(d Decision, err error, nowMs uint64) (Decision, error) {
	if err != nil {
		return d, err
	}
	if d.SessionID, err = r.SessionID(d.Ticket); err != nil {
		_ = r.Complete(d.Ticket, Cancelled, nowMs)
		return Decision{}, err
	}
	return d, nil
}

// subsetArg copies the addresses into one C allocation (an array of pointers followed by the
// NUL-terminated strings: cgo may not pass Go memory holding Go pointers) and returns the
// array, its length and the function that frees it. nil gives (NULL, 0): no subset.
func subsetArg(addresses []string) (**C.char, C.size_t, func()) {
	if addresses == nil {
		return nil, 0, func() {}
	}
	ptrSize := unsafe.Sizeof((*C.char)(nil))
	size := uintptr(len(addresses)) * ptrSize
	for _, a := range addresses {
		size += uintptr(len(a)) + 1
	}
	if size == 0 {
		size = 1 // an empty subset is a non-NULL array of length 0
	}
	block := C.malloc(C.size_t(size))
	if block == nil {
		panic("kvroute: out of memory")
	}
	ptrs := unsafe.Slice((**C.char)(block), len(addresses))
	text := unsafe.Slice((*byte)(block), size)
	off := uintptr(len(addresses)) * ptrSize
	for i, a := range addresses {
		ptrs[i] = (*C.char)(unsafe.Pointer(&text[off]))
		off += uintptr(copy(text[off:], a))
		text[off] = 0
		off++
	}
	return (**C.char)(block), C.size_t(len(addresses)), func() { C.free(block) }
}

// Complete releases the ticket's in-flight slot, exactly once, with how the request ended
// (which feeds the pod's health; see Outcome). A second completion returns
// StatusTicketNotOpen, an unknown ticket StatusUnknownTicket. CompleteWithEvent also says
// what changed in the pod's health.
func (r *Router) Complete(ticket uint64, outcome Outcome, nowMs uint64) error {
	st := C.kvroute_router_complete(r.ptr(), C.kvroute_ticket(ticket), C.uint32_t(outcome), C.uint64_t(nowMs))
	runtime.KeepAlive(r)
	return check(st)
}

// Explain returns the one-line explanation of an open ticket's decision (for logs and the
// x-kvroute-decision header). Call it before Complete.
func (r *Router) Explain(ticket uint64) (string, error) {
	return r.readString(func(p *C.kvroute_router, buf *C.uint8_t, n C.size_t, out *C.size_t) C.kvroute_status {
		return C.kvroute_router_explain(p, C.kvroute_ticket(ticket), buf, n, out)
	})
}

// SessionID returns the session id of an open ticket's decision: the chosen pod's, for the
// response's x-session-id header, when the strategy spec the request was routed with (by any
// method) includes session-affinity, else "". The *Session methods set Decision.SessionID
// with it. Call it before Complete.
func (r *Router) SessionID(ticket uint64) (string, error) {
	return r.readString(func(p *C.kvroute_router, buf *C.uint8_t, n C.size_t, out *C.size_t) C.kvroute_status {
		return C.kvroute_router_session_id(p, C.kvroute_ticket(ticket), buf, n, out)
	})
}

// readString runs an out-buffer call, growing the buffer once if it was too small.
func (r *Router) readString(call func(*C.kvroute_router, *C.uint8_t, C.size_t, *C.size_t) C.kvroute_status) (string, error) {
	var buf [512]byte
	var n C.size_t
	st := call(r.ptr(), (*C.uint8_t)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)), &n)
	runtime.KeepAlive(r)
	if st == C.KVROUTE_STATUS_OK {
		return string(buf[:n]), nil
	}
	if st != C.KVROUTE_STATUS_INSUFFICIENT_SIZE {
		return "", Status(st)
	}
	big := make([]byte, int(n))
	st = call(r.ptr(), (*C.uint8_t)(unsafe.Pointer(&big[0])), C.size_t(len(big)), &n)
	runtime.KeepAlive(r)
	if err := check(st); err != nil {
		return "", err
	}
	return string(big[:n]), nil
}

// Tick does the time-driven work due at nowMs (index TTL, ticket TTL, ends of ejections).
func (r *Router) Tick(nowMs uint64) error {
	st := C.kvroute_router_tick(r.ptr(), C.uint64_t(nowMs))
	runtime.KeepAlive(r)
	return check(st)
}

// NextDeadline says when Tick next has work; ok is false when it has none.
func (r *Router) NextDeadline() (deadlineMs uint64, ok bool, err error) {
	var has C._Bool
	var at C.uint64_t
	st := C.kvroute_router_next_deadline(r.ptr(), &has, &at)
	runtime.KeepAlive(r)
	if err := check(st); err != nil {
		return 0, false, err
	}
	return uint64(at), bool(has), nil
}
