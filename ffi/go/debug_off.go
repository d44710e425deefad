//go:build !kvroute_debug

package kvroute

func maybeGC() {}
