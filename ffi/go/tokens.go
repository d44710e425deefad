package kvroute

/*
#include "kvroute.h"
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// DefaultBlockTokens is vLLM's default KV-cache block size in tokens (its --block-size), the
// block size of a Tokens whose BlockTokens is 0.
const DefaultBlockTokens = C.KVROUTE_DEFAULT_BLOCK_TOKENS

// MaxBlockTokens is the largest block size accepted.
const MaxBlockTokens = C.KVROUTE_MAX_BLOCK_TOKENS

// Tokens is a prompt as token ids, for a proxy that tokenizes requests itself: tokenized with
// the model's tokenizer and chat template exactly as the engine (vLLM) tokenizes them, so that
// a block of the router's index is a block of the engine's KV cache. See ffi/README.md,
// "Token ids or text?".
type Tokens struct {
	// IDs are the prompt's token ids (at most math.MaxUint32). A trailing partial block is not
	// keyed (the engine caches full blocks only) but counts in the prompt's length.
	IDs []uint32
	// BlockTokens is the engine's KV-cache block size in tokens (vLLM's --block-size), at most
	// MaxBlockTokens; 0 means DefaultBlockTokens. Keys of different sizes never match: route a
	// model's requests with one size.
	BlockTokens uint32
	// LoRA is the name of the LoRA adapter the request runs with ("": none); it is part of
	// every block's key.
	LoRA string
	// CacheSalt is the request's cache_salt ("": none); it is part of the first block's key,
	// and so of every block's.
	CacheSalt string
}

// blockTokens is the block size passed to C.
func (t *Tokens) blockTokens() C.uint32_t {
	if t.BlockTokens == 0 {
		return DefaultBlockTokens
	}
	return C.uint32_t(t.BlockTokens)
}

// idsArg passes token ids to C without copying: (&ids[0], len) or (NULL, 0).
func idsArg(ids []uint32) (*C.uint32_t, C.size_t) {
	if len(ids) == 0 {
		return nil, 0
	}
	return (*C.uint32_t)(unsafe.Pointer(&ids[0])), C.size_t(len(ids))
}

// RouteTokens routes a request whose prompt the caller tokenized (see Tokens). The router keys
// the ids in token blocks with its hash seed, outside its lock, and least-ttft counts the
// prompt exactly, in tokens. strategy "" uses the configured default; maxOutputTokens is the
// request's output-token limit (max_completion_tokens, else max_tokens), 0 for none. An
// invalid BlockTokens, or more than math.MaxUint32 ids, is StatusInvalidParameter; a LoRA name
// or salt that is not UTF-8 StatusInvalidUTF8. Route and RouteJSON route on the prompt's text
// instead.
func (r *Router) RouteTokens(model string, prompt Tokens, strategy string, maxOutputTokens uint32, nowMs uint64) (Decision, error) {
	return r.RouteTokensSubset(model, prompt, strategy, maxOutputTokens, nil, nowMs)
}

// RouteTokensSubset is RouteTokens restricted to an endpoint subset, as in RouteSubset.
func (r *Router) RouteTokensSubset(model string, prompt Tokens, strategy string, maxOutputTokens uint32, subset []string, nowMs uint64) (Decision, error) {
	return r.routeTokens(model, prompt, strategy, maxOutputTokens, subset, "", nowMs)
}

// RouteTokensSession is RouteTokensSubset with the request's session id, as in RouteSession.
func (r *Router) RouteTokensSession(model string, prompt Tokens, strategy string, maxOutputTokens uint32, subset []string, sessionID string, nowMs uint64) (Decision, error) {
	d, err := r.routeTokens(model, prompt, strategy, maxOutputTokens, subset, sessionID, nowMs)
	return r.withSessionID(d, err, nowMs)
}

func (r *Router) routeTokens(model string, prompt Tokens, strategy string, maxOutputTokens uint32, subset []string, sessionID string, nowMs uint64) (Decision, error) {
	var d C.kvroute_decision
	mp, mn := stringArg(model)
	tp, tn := idsArg(prompt.IDs)
	lp, ln := stringArg(prompt.LoRA)
	cp, cn := stringArg(prompt.CacheSalt)
	sp, sn := stringArg(strategy)
	ap, an, free := subsetArg(subset)
	defer free()
	ip, in := stringArg(sessionID)
	st := C.kvroute_router_route_tokens_session(r.ptr(), mp, mn, tp, tn, prompt.blockTokens(), lp, ln, cp, cn, sp, sn,
		C.uint32_t(maxOutputTokens), ap, an, ip, in, C.uint64_t(nowMs), &d)
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

// RouteKeys routes a request on token-block keys the caller already holds (from
// TokenBlockKeys with the router's hash seed, Config.HashSeed, to share the index with
// RouteTokens): keys of the prompt's complete blocks in order, promptTokens the prompt's
// length in tokens, blockTokens the size the keys were cut at (0: DefaultBlockTokens). More
// keys than promptTokens holds blocks, or an invalid blockTokens, is StatusInvalidParameter.
// subset is as in RouteSubset (nil: none); the rest as in RouteTokens.
func (r *Router) RouteKeys(model string, keys []uint64, promptTokens, blockTokens uint32, strategy string, maxOutputTokens uint32, subset []string, nowMs uint64) (Decision, error) {
	return r.routeKeys(model, keys, promptTokens, blockTokens, strategy, maxOutputTokens, subset, "", nowMs)
}

// RouteKeysSession is RouteKeys with the request's session id, as in RouteSession.
func (r *Router) RouteKeysSession(model string, keys []uint64, promptTokens, blockTokens uint32, strategy string, maxOutputTokens uint32, subset []string, sessionID string, nowMs uint64) (Decision, error) {
	d, err := r.routeKeys(model, keys, promptTokens, blockTokens, strategy, maxOutputTokens, subset, sessionID, nowMs)
	return r.withSessionID(d, err, nowMs)
}

func (r *Router) routeKeys(model string, keys []uint64, promptTokens, blockTokens uint32, strategy string, maxOutputTokens uint32, subset []string, sessionID string, nowMs uint64) (Decision, error) {
	if blockTokens == 0 {
		blockTokens = DefaultBlockTokens
	}
	var d C.kvroute_decision
	mp, mn := stringArg(model)
	var kp *C.uint64_t
	if len(keys) > 0 {
		kp = (*C.uint64_t)(unsafe.Pointer(&keys[0]))
	}
	sp, sn := stringArg(strategy)
	ap, an, free := subsetArg(subset)
	defer free()
	ip, in := stringArg(sessionID)
	st := C.kvroute_router_route_keys_session(r.ptr(), mp, mn, kp, C.size_t(len(keys)), C.uint32_t(promptTokens),
		C.uint32_t(blockTokens), sp, sn, C.uint32_t(maxOutputTokens), ap, an, ip, in, C.uint64_t(nowMs), &d)
	runtime.KeepAlive(r)
	runtime.KeepAlive(model)
	runtime.KeepAlive(keys)
	runtime.KeepAlive(strategy)
	runtime.KeepAlive(sessionID)
	if err := check(st); err != nil {
		return Decision{}, err
	}
	return decisionFrom(&d), nil
}

// TokenBlockKeys computes the token-block keys of prompt as RouteTokens keys it when seed is
// the router's hash seed (Config.HashSeed), for checking or precomputing them: one key per
// complete block, each naming the whole prefix up to its block, the LoRA adapter and the
// salt.
func TokenBlockKeys(seed uint64, prompt Tokens) ([]uint64, error) {
	tp, tn := idsArg(prompt.IDs)
	lp, ln := stringArg(prompt.LoRA)
	cp, cn := stringArg(prompt.CacheSalt)
	block := prompt.blockTokens()
	var n C.size_t
	st := C.kvroute_token_block_keys(block, C.uint64_t(seed), tp, tn, lp, ln, cp, cn, nil, 0, &n)
	if st != C.KVROUTE_STATUS_INSUFFICIENT_SIZE {
		runtime.KeepAlive(prompt)
		if err := check(st); err != nil {
			return nil, err
		}
		return []uint64{}, nil
	}
	out := make([]uint64, int(n))
	st = C.kvroute_token_block_keys(block, C.uint64_t(seed), tp, tn, lp, ln, cp, cn,
		(*C.uint64_t)(unsafe.Pointer(&out[0])), C.size_t(len(out)), &n)
	runtime.KeepAlive(prompt)
	if err := check(st); err != nil {
		return nil, err
	}
	return out[:n], nil
}
