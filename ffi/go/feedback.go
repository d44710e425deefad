package kvroute

/*
#include "kvroute.h"
*/
import "C"

import "runtime"

// Timings is what the caller observed about a request; nil fields are unknown. The timings
// of successful requests teach the least-ttft model the pod's rates.
type Timings struct {
	FirstTokenMs *uint64 // routing to first response byte or token
	TotalMs      *uint64 // routing to end of response
	OutputTokens *uint32 // tokens generated
	CachedTokens *uint32 // prompt tokens served from the engine's prefix cache
	PromptTokens *uint32 // prompt tokens as the engine counted them
}

// c is t as a kvroute_timings, with a known bit for every non-nil field.
func (t Timings) c() C.kvroute_timings {
	var c C.kvroute_timings
	if t.FirstTokenMs != nil {
		c.first_token_ms, c.known = C.uint64_t(*t.FirstTokenMs), c.known|C.KVROUTE_TIMING_FIRST_TOKEN_MS
	}
	if t.TotalMs != nil {
		c.total_ms, c.known = C.uint64_t(*t.TotalMs), c.known|C.KVROUTE_TIMING_TOTAL_MS
	}
	if t.OutputTokens != nil {
		c.output_tokens, c.known = C.uint32_t(*t.OutputTokens), c.known|C.KVROUTE_TIMING_OUTPUT_TOKENS
	}
	if t.CachedTokens != nil {
		c.cached_tokens, c.known = C.uint32_t(*t.CachedTokens), c.known|C.KVROUTE_TIMING_CACHED_TOKENS
	}
	if t.PromptTokens != nil {
		c.prompt_tokens, c.known = C.uint32_t(*t.PromptTokens), c.known|C.KVROUTE_TIMING_PROMPT_TOKENS
	}
	return c
}

// CompleteWithTimings is Complete plus what was observed about the request.
func (r *Router) CompleteWithTimings(ticket uint64, outcome Outcome, t Timings, nowMs uint64) error {
	c := t.c()
	st := C.kvroute_router_complete_with_timings(r.ptr(), C.kvroute_ticket(ticket), C.uint32_t(outcome), &c, C.uint64_t(nowMs))
	runtime.KeepAlive(r)
	return check(st)
}

// CompleteWithEvent is CompleteWithTimings (a zero Timings is no timings) that also returns
// what the outcome changed in the pod's health: HealthNone, HealthEjected (this failure
// ejected the pod), HealthEjectionSkipped (it met a rule, but the model could not spare the
// pod) or HealthReadmitted (the pod's probe succeeded).
func (r *Router) CompleteWithEvent(ticket uint64, outcome Outcome, t Timings, nowMs uint64) (HealthEvent, error) {
	c := t.c()
	var event C.uint32_t
	st := C.kvroute_router_complete_with_event(r.ptr(), C.kvroute_ticket(ticket), C.uint32_t(outcome), &c, C.uint64_t(nowMs), &event)
	runtime.KeepAlive(r)
	if err := check(st); err != nil {
		return HealthNone, err
	}
	return HealthEvent(event), nil
}

// ReportHealthCheck reports an active health check of the pod (a GET /health or a metrics
// scrape of its engine) that passed or failed at nowMs, and returns what it changed.
// UnhealthyThreshold failed checks in a row take the pod out of service
// (HealthChecksFailing), HealthyThreshold passed ones bring it back (HealthChecksPassing); a
// passed check after a failed one also ends an ejection for gateway failures
// (HealthReadmitted), never one for upstream errors. An unknown pod is StatusUnknownPod.
func (r *Router) ReportHealthCheck(pod PodID, passed bool, nowMs uint64) (HealthEvent, error) {
	var event C.uint32_t
	st := C.kvroute_router_report_health_check(r.ptr(), C.kvroute_pod_id(pod), C._Bool(passed), C.uint64_t(nowMs), &event)
	runtime.KeepAlive(r)
	if err := check(st); err != nil {
		return HealthNone, err
	}
	return HealthEvent(event), nil
}

// FirstToken reports the first token of an open request (routed, not yet completed) as soon
// as a streaming proxy sees it, so that least-ttft learns the pod's prompt-side rates a whole
// decode before the completion. Only FirstTokenMs (required: StatusInvalidParameter without
// it), PromptTokens and CachedTokens are read; TotalMs and OutputTokens are ignored, so the
// same Timings can be passed to CompleteWithTimings at the end. Prompt and cached tokens
// given here are learned here, else from the completion's (a vLLM stream carries usage at
// its first token only with continuous usage stats). Nothing is released: the
// ticket must still be completed once. A second report for a ticket is ignored (nil); an
// unknown ticket is StatusUnknownTicket, a completed or expired one StatusTicketNotOpen.
func (r *Router) FirstToken(ticket uint64, t Timings, nowMs uint64) error {
	c := t.c()
	st := C.kvroute_router_first_token(r.ptr(), C.kvroute_ticket(ticket), &c, C.uint64_t(nowMs))
	runtime.KeepAlive(r)
	return check(st)
}

// EngineSnapshot is an engine's own view of its load, as scraped from its metrics; nil
// fields are unknown.
type EngineSnapshot struct {
	Running       uint32   // vllm:num_requests_running
	Waiting       uint32   // vllm:num_requests_waiting
	KVUsage       *float64 // vllm:kv_cache_usage_perc, in [0, 1]; see SetEngineKVCacheTokens
	PrefixQueries *uint64  // vllm:prefix_cache_queries_total
	PrefixHits    *uint64  // vllm:prefix_cache_hits_total
	// vllm:request_prefill_time_seconds, cumulative. With PrefixQueries and PrefixHits it
	// teaches the pod's prefill rate and overhead where completions carry no first-token time.
	Prefill *EngineHistogram
	// vllm:inter_token_latency_seconds (or vllm:time_per_output_token_seconds), cumulative.
	// It teaches the pod's time per output token where completions carry no first-token time
	// or no output tokens.
	InterToken *EngineHistogram
}

// EngineHistogram is a cumulative timing histogram of an engine: its _sum in seconds (finite,
// not negative) and its _count.
type EngineHistogram struct {
	Seconds float64
	Count   uint64
}

// ObserveEngine records the pod's engine state as scraped at nowMs, for the least-ttft model.
func (r *Router) ObserveEngine(pod PodID, s EngineSnapshot, nowMs uint64) error {
	c := C.kvroute_engine_snapshot{running: C.uint32_t(s.Running), waiting: C.uint32_t(s.Waiting)}
	if s.KVUsage != nil {
		c.kv_usage, c.known = C.double(*s.KVUsage), c.known|C.KVROUTE_ENGINE_KV_USAGE
	}
	if s.PrefixQueries != nil {
		c.prefix_queries, c.known = C.uint64_t(*s.PrefixQueries), c.known|C.KVROUTE_ENGINE_PREFIX_QUERIES
	}
	if s.PrefixHits != nil {
		c.prefix_hits, c.known = C.uint64_t(*s.PrefixHits), c.known|C.KVROUTE_ENGINE_PREFIX_HITS
	}
	var t C.kvroute_engine_timing
	if h := s.Prefill; h != nil {
		t.prefill_seconds, t.prefills = C.double(h.Seconds), C.uint64_t(h.Count)
		t.known |= C.KVROUTE_ENGINE_TIMING_PREFILL
	}
	if h := s.InterToken; h != nil {
		t.inter_token_seconds, t.inter_tokens = C.double(h.Seconds), C.uint64_t(h.Count)
		t.known |= C.KVROUTE_ENGINE_TIMING_INTER_TOKEN
	}
	st := C.kvroute_router_observe_engine_timed(r.ptr(), C.kvroute_pod_id(pod), &c, &t, C.uint64_t(nowMs))
	runtime.KeepAlive(r)
	return check(st)
}

// SetEngineKVCacheTokens sets the size of the pod's engine KV cache in tokens (vLLM:
// num_gpu_blocks × block_size, labels of vllm:cache_config_info), added to the pod's engine
// snapshots from then on; 0 makes it unknown again (the default). With it and a snapshot's
// KVUsage, least-ttft takes a request whose uncached prompt does not fit in the free share to
// wait for a running sequence to end; without it, the KV cache is never taken as full.
func (r *Router) SetEngineKVCacheTokens(pod PodID, tokens uint64) error {
	st := C.kvroute_router_set_engine_kv_cache_tokens(r.ptr(), C.kvroute_pod_id(pod), C.uint64_t(tokens))
	runtime.KeepAlive(r)
	return check(st)
}

// SetPodCapacity sets the pod's engine capacity in concurrent sequences (vLLM
// --max-num-seqs) for the least-ttft model.
func (r *Router) SetPodCapacity(pod PodID, maxSeqs uint32) error {
	st := C.kvroute_router_set_pod_capacity(r.ptr(), C.kvroute_pod_id(pod), C.uint32_t(maxSeqs))
	runtime.KeepAlive(r)
	return check(st)
}
