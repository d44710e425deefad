package kvroute

/*
#include "kvroute.h"
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// AddPod makes the pod named name serve model, creating it or updating its address
// ("ip:port") and readiness. It returns the pod's id.
func (r *Router) AddPod(model, name, address string, ready bool) (PodID, error) {
	var id C.kvroute_pod_id
	mp, mn := stringArg(model)
	np, nn := stringArg(name)
	ap, an := stringArg(address)
	st := C.kvroute_router_add_pod(r.ptr(), mp, mn, np, nn, ap, an, C._Bool(ready), &id)
	runtime.KeepAlive(r)
	runtime.KeepAlive(model)
	runtime.KeepAlive(name)
	runtime.KeepAlive(address)
	return PodID(id), check(st)
}

// UpsertPod creates or updates the pod named name without changing the models it serves.
func (r *Router) UpsertPod(name, address string, ready bool) (PodID, error) {
	var id C.kvroute_pod_id
	np, nn := stringArg(name)
	ap, an := stringArg(address)
	st := C.kvroute_router_upsert_pod(r.ptr(), np, nn, ap, an, C._Bool(ready), &id)
	runtime.KeepAlive(r)
	runtime.KeepAlive(name)
	runtime.KeepAlive(address)
	return PodID(id), check(st)
}

// SetPodReady sets whether the pod may receive new requests.
func (r *Router) SetPodReady(pod PodID, ready bool) error {
	st := C.kvroute_router_set_pod_ready(r.ptr(), C.kvroute_pod_id(pod), C._Bool(ready))
	runtime.KeepAlive(r)
	return check(st)
}

// SetPodDataParallelRank makes the pod engine rank of a data-parallel server (vLLM
// --data-parallel-size: several engines behind one address, each with its own KV cache), or
// a whole server again with a negative rank. Add each engine as a pod of its own (its own
// name, the server's address); decisions for it carry the rank (Decision.DataParallelRank).
func (r *Router) SetPodDataParallelRank(pod PodID, rank int64) error {
	st := C.kvroute_router_set_pod_data_parallel_rank(r.ptr(), C.kvroute_pod_id(pod), C.int64_t(rank))
	runtime.KeepAlive(r)
	return check(st)
}

// SetPodAddress changes the pod's "ip:port" address.
func (r *Router) SetPodAddress(pod PodID, address string) error {
	ap, an := stringArg(address)
	st := C.kvroute_router_set_pod_address(r.ptr(), C.kvroute_pod_id(pod), ap, an)
	runtime.KeepAlive(r)
	runtime.KeepAlive(address)
	return check(st)
}

// DetachPod stops the pod from serving model.
func (r *Router) DetachPod(model string, pod PodID) error {
	mp, mn := stringArg(model)
	st := C.kvroute_router_detach_pod(r.ptr(), mp, mn, C.kvroute_pod_id(pod))
	runtime.KeepAlive(r)
	runtime.KeepAlive(model)
	return check(st)
}

// RemoveModel stops serving model: its pods stop serving it and routing it returns
// StatusUnknownModel until AddPod attaches a pod to it again.
func (r *Router) RemoveModel(model string) error {
	mp, mn := stringArg(model)
	st := C.kvroute_router_remove_model(r.ptr(), mp, mn)
	runtime.KeepAlive(r)
	runtime.KeepAlive(model)
	return check(st)
}

// RemovePod removes the pod; its open tickets can still be completed.
func (r *Router) RemovePod(pod PodID) error {
	st := C.kvroute_router_remove_pod(r.ptr(), C.kvroute_pod_id(pod))
	runtime.KeepAlive(r)
	return check(st)
}

// PodID looks up the live pod named name.
func (r *Router) PodID(name string) (PodID, error) {
	var id C.kvroute_pod_id
	np, nn := stringArg(name)
	st := C.kvroute_router_pod_id(r.ptr(), np, nn, &id)
	runtime.KeepAlive(r)
	runtime.KeepAlive(name)
	return PodID(id), check(st)
}

// Pods lists the live pods, in the order they were added.
func (r *Router) Pods() ([]PodID, error) {
	ids := make([]PodID, 16)
	for {
		var n C.size_t
		st := C.kvroute_router_pods(r.ptr(), (*C.kvroute_pod_id)(unsafe.Pointer(&ids[0])), C.size_t(len(ids)), &n)
		runtime.KeepAlive(r)
		switch st {
		case C.KVROUTE_STATUS_OK:
			return ids[:n], nil
		case C.KVROUTE_STATUS_INSUFFICIENT_SIZE:
			ids = make([]PodID, int(n)+8) // pods may be added between calls
		default:
			return nil, Status(st)
		}
	}
}

// PodInfo is one pod's state.
type PodInfo struct {
	ID       PodID
	Name     string
	Address  string
	Ready    bool // as set by AddPod / SetPodReady; its health is below
	InFlight uint32
	Routed   uint64
	Models   uint32
	// Ejected: ejected by outlier detection and not yet back in service (waiting out its
	// ejection, or probing).
	Ejected bool
	// Probing: the ejection time is over and one probe request at a time decides.
	Probing bool
	// EjectedUntilMs: while it waits out an ejection, when that ends (0 otherwise).
	EjectedUntilMs uint64
	// ChecksFailing: its active checks are failing (out of service until they pass).
	ChecksFailing bool
	// Ejections5xx and EjectionsGateway count its ejections for consecutive upstream errors
	// and for consecutive gateway failures.
	Ejections5xx, EjectionsGateway uint64
}

// PodInfo reads the pod's state.
func (r *Router) PodInfo(pod PodID) (PodInfo, error) {
	var info C.kvroute_pod_info
	st := C.kvroute_router_pod_info(r.ptr(), C.kvroute_pod_id(pod), &info)
	runtime.KeepAlive(r)
	if err := check(st); err != nil {
		return PodInfo{}, err
	}
	name, err := r.PodName(pod)
	if err != nil {
		return PodInfo{}, err
	}
	addr, err := r.PodAddress(pod)
	if err != nil {
		return PodInfo{}, err
	}
	return PodInfo{
		ID: PodID(info.id), Name: name, Address: addr, Ready: bool(info.ready),
		InFlight: uint32(info.in_flight), Routed: uint64(info.routed), Models: uint32(info.models),
		Ejected: bool(info.ejected), Probing: bool(info.probing), EjectedUntilMs: uint64(info.ejected_until_ms),
		ChecksFailing: bool(info.checks_failing), Ejections5xx: uint64(info.ejections_5xx),
		EjectionsGateway: uint64(info.ejections_gateway),
	}, nil
}

// PodName returns the pod's name.
func (r *Router) PodName(pod PodID) (string, error) {
	return r.readString(func(p *C.kvroute_router, buf *C.uint8_t, n C.size_t, out *C.size_t) C.kvroute_status {
		return C.kvroute_router_pod_name(p, C.kvroute_pod_id(pod), buf, n, out)
	})
}

// PodAddress returns the pod's "ip:port" address.
func (r *Router) PodAddress(pod PodID) (string, error) {
	return r.readString(func(p *C.kvroute_router, buf *C.uint8_t, n C.size_t, out *C.size_t) C.kvroute_status {
		return C.kvroute_router_pod_address(p, C.kvroute_pod_id(pod), buf, n, out)
	})
}

// InFlight returns the pod's in-flight count.
func (r *Router) InFlight(pod PodID) (uint32, error) {
	var n C.uint32_t
	st := C.kvroute_router_in_flight(r.ptr(), C.kvroute_pod_id(pod), &n)
	runtime.KeepAlive(r)
	return uint32(n), check(st)
}

// Stats holds the router's counters (all models).
type Stats struct {
	Pods, ReadyPods, Models, InFlight                        uint64
	TicketsOpen, TicketsIssued                               uint64
	CompletedSuccess, CompletedCancelled, CompletedFailed    uint64
	CompletedConnectFailed, CompletedReset, CompletedTimeout uint64
	TicketsExpired, TicketsOrphaned, TicketsRejected         uint64
	IndexBlocks, IndexCapacity, IndexInserted                uint64
	IndexEvicted, IndexExpired, IndexPurged                  uint64
	UnknownModel, NoReadyPod, ImbalanceEvents                uint64
	RoutedByReason                                           [16]uint64 // indexed by Reason
	DecisionsByMatchBucket                                   [5]uint64  // 0, 1-25, 26-50, 51-75, 76-100
}

// Stats reads every counter.
func (r *Router) Stats() (Stats, error) {
	var s C.kvroute_stats
	st := C.kvroute_router_stats(r.ptr(), &s)
	runtime.KeepAlive(r)
	if err := check(st); err != nil {
		return Stats{}, err
	}
	out := Stats{
		Pods: uint64(s.pods), ReadyPods: uint64(s.ready_pods), Models: uint64(s.models), InFlight: uint64(s.in_flight),
		TicketsOpen: uint64(s.tickets_open), TicketsIssued: uint64(s.tickets_issued),
		CompletedSuccess: uint64(s.completed_success), CompletedCancelled: uint64(s.completed_cancelled),
		CompletedFailed: uint64(s.completed_failed), TicketsExpired: uint64(s.tickets_expired),
		TicketsOrphaned: uint64(s.tickets_orphaned), TicketsRejected: uint64(s.tickets_rejected),
		IndexBlocks: uint64(s.index_blocks), IndexCapacity: uint64(s.index_capacity),
		IndexInserted: uint64(s.index_inserted), IndexEvicted: uint64(s.index_evicted),
		IndexExpired: uint64(s.index_expired), IndexPurged: uint64(s.index_purged),
		UnknownModel: uint64(s.unknown_model), NoReadyPod: uint64(s.no_ready_pod),
		ImbalanceEvents: uint64(s.imbalance_events), CompletedConnectFailed: uint64(s.completed_connect_failed),
		CompletedReset: uint64(s.completed_reset), CompletedTimeout: uint64(s.completed_timeout),
	}
	for i := range out.RoutedByReason {
		out.RoutedByReason[i] = uint64(s.routed_by_reason[i])
	}
	for i := range out.DecisionsByMatchBucket {
		out.DecisionsByMatchBucket[i] = uint64(s.decisions_by_match_bucket[i])
	}
	return out, nil
}

// PrefixHashes computes the block hashes of prompt with hash scheme v1 (what the router
// indexes), for checking or precomputing.
func PrefixHashes(blockSize int, seed uint64, prompt []byte) ([]uint64, error) {
	pp, pn := bytesArg(prompt)
	var n C.size_t
	st := C.kvroute_prefix_hashes(C.size_t(blockSize), C.uint64_t(seed), pp, pn, nil, 0, &n)
	if st != C.KVROUTE_STATUS_INSUFFICIENT_SIZE {
		runtime.KeepAlive(prompt)
		if err := check(st); err != nil {
			return nil, err
		}
		return []uint64{}, nil
	}
	out := make([]uint64, int(n))
	st = C.kvroute_prefix_hashes(C.size_t(blockSize), C.uint64_t(seed), pp, pn,
		(*C.uint64_t)(unsafe.Pointer(&out[0])), C.size_t(len(out)), &n)
	runtime.KeepAlive(prompt)
	if err := check(st); err != nil {
		return nil, err
	}
	return out[:n], nil
}

// ExtractPrompt returns the prompt text RouteJSON would hash for an OpenAI-style body.
func ExtractPrompt(body []byte) (string, error) {
	bp, bn := bytesArg(body)
	var n C.size_t
	st := C.kvroute_extract_prompt(bp, bn, nil, 0, &n)
	if st != C.KVROUTE_STATUS_INSUFFICIENT_SIZE {
		runtime.KeepAlive(body)
		return "", Status(st) // a successful call always needs at least the NUL
	}
	buf := make([]byte, int(n))
	st = C.kvroute_extract_prompt(bp, bn, (*C.uint8_t)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)), &n)
	runtime.KeepAlive(body)
	if err := check(st); err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}
