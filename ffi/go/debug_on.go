//go:build kvroute_debug

package kvroute

import "runtime"

// maybeGC forces a collection before every C call under the kvroute_debug build tag, so a
// missing runtime.KeepAlive (a handle finalized while C still uses it) fails the tests instead
// of hiding.
func maybeGC() { runtime.GC() }
