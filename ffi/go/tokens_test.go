package kvroute

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
)

// tokenIDs is n token ids of family (the same family: the same ids), from a small LCG.
func tokenIDs(family uint64, n int) []uint32 {
	x := family*0x9E3779B97F4A7C15 | 1
	ids := make([]uint32, n)
	for i := range ids {
		x = x*6364136223846793005 + 1442695040888963407
		ids[i] = uint32(x>>40) % 128000
	}
	return ids
}

// explainedPromptTokens is N of "pred_cached_tokens=C/N" in the ticket's decision line.
func explainedPromptTokens(t *testing.T, r *Router, ticket uint64) int {
	t.Helper()
	line, err := r.Explain(ticket)
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range strings.Fields(line) {
		if v := strings.TrimPrefix(kv, "pred_cached_tokens="); v != kv {
			var cached, prompt int
			if _, err := fmt.Sscanf(v, "%d/%d", &cached, &prompt); err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			return prompt
		}
	}
	t.Fatalf("no pred_cached_tokens in %q", line)
	return 0
}

// Keys from an independent implementation of the scheme (pure-Python XXH64:
// tests/c/token_keys_golden.py).
func TestTokenBlockKeysGolden(t *testing.T) {
	ids := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9}
	for _, c := range []struct {
		lora, salt string
		keys       []uint64
	}{
		{"", "", []uint64{0xd2828303c82b3344, 0x8879faddb1d9721b}},
		{"sql", "", []uint64{0x46385cd41f318aa3, 0x39f297036e1dda2b}},
		{"", "tenant-1", []uint64{0x80225f633e8330d8, 0x2baf9d2edb9a58bb}},
		{"sql", "tenant-1", []uint64{0x61b74bbd12967618, 0x30b8481bf599aaa2}},
	} {
		got, err := TokenBlockKeys(42, Tokens{IDs: ids, BlockTokens: 4, LoRA: c.lora, CacheSalt: c.salt})
		if err != nil || fmt.Sprint(got) != fmt.Sprint(c.keys) {
			t.Fatalf("%q %q: %x %v, want %x", c.lora, c.salt, got, err, c.keys)
		}
	}
	long := make([]uint32, 40)
	for i := range long {
		long[i] = 1000 + uint32(i)
	}
	// BlockTokens 0 is DefaultBlockTokens (16).
	got, err := TokenBlockKeys(0, Tokens{IDs: long})
	if err != nil || fmt.Sprint(got) != fmt.Sprint([]uint64{0x7f98bc3aa313799f, 0xb4bb9f4d4833b4ea}) {
		t.Fatalf("%x %v", got, err)
	}
	if got, err := TokenBlockKeys(0, Tokens{IDs: long[:15]}); err != nil || got == nil || len(got) != 0 {
		t.Fatalf("shorter than a block: %v %v", got, err)
	}
	for _, c := range []struct {
		prompt Tokens
		want   Status
	}{
		{Tokens{IDs: long, BlockTokens: MaxBlockTokens + 1}, StatusInvalidParameter},
		{Tokens{IDs: long, LoRA: "a\xff"}, StatusInvalidUTF8},
		{Tokens{IDs: long, CacheSalt: "\xc3"}, StatusInvalidUTF8},
	} {
		if _, err := TokenBlockKeys(0, c.prompt); !errors.Is(err, c.want) {
			t.Fatalf("%+v: %v, want %v", c.prompt, err, c.want)
		}
	}
}

// Chats sharing a 1,000-token system prompt go to the same pod and match its 62 blocks;
// least-ttft counts the prompt exactly; RouteKeys on TokenBlockKeys with the router's hash
// seed is RouteTokens; another adapter or salt matches nothing.
func TestRouteTokens(t *testing.T) {
	hashSeed := uint64(1234)
	r := newTestRouter(t, Config{Seed: 21, HashSeed: &hashSeed, Strategy: "least-ttft"}, 2)
	defer r.Close()
	system := tokenIDs(1, 1000)
	first := append(append([]uint32{}, system...), tokenIDs(2, 5)...)
	second := append(append([]uint32{}, system...), tokenIDs(3, 13)...)

	d1, err := r.RouteTokens("study", Tokens{IDs: first}, "", 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if d1.MatchedBlocks != 0 || d1.TotalBlocks != 1005/16 || explainedPromptTokens(t, r, d1.Ticket) != 1005 {
		t.Fatalf("first %+v", d1)
	}
	d2, err := r.RouteTokens("study", Tokens{IDs: second, BlockTokens: 16}, "", 256, 11)
	if err != nil {
		t.Fatal(err)
	}
	if d2.Pod != d1.Pod || d2.Reason != ReasonLeastTTFT || d2.MatchedBlocks != 62 || d2.TotalBlocks != 63 {
		t.Fatalf("second %+v, first %+v", d2, d1)
	}
	if n := explainedPromptTokens(t, r, d2.Ticket); n != 1013 {
		t.Fatalf("prompt tokens %d, want 1013", n)
	}
	keys, err := TokenBlockKeys(hashSeed, Tokens{IDs: second})
	if err != nil || len(keys) != 63 {
		t.Fatalf("keys %d %v", len(keys), err)
	}
	d3, err := r.RouteKeys("study", keys, uint32(len(second)), 0, "", 0, nil, 12)
	if err != nil || d3.Pod != d1.Pod || d3.MatchedBlocks != 63 || explainedPromptTokens(t, r, d3.Ticket) != 1013 {
		t.Fatalf("keyed %+v %v", d3, err)
	}
	for _, p := range []Tokens{{IDs: first, LoRA: "sql"}, {IDs: first, CacheSalt: "tenant-2"}} {
		d, err := r.RouteTokens("study", p, "", 0, 13)
		if err != nil || d.MatchedBlocks != 0 {
			t.Fatalf("%q %q: %+v %v", p.LoRA, p.CacheSalt, d, err)
		}
	}
	// The subset keeps to its pods.
	other := "10.0.0.1:8000"
	if info, _ := r.PodInfo(d1.Pod); info.Address == other {
		other = "10.0.0.2:8000"
	}
	d4, err := r.RouteTokensSubset("study", Tokens{IDs: first}, "", 0, []string{other}, 14)
	if err != nil || d4.Pod == d1.Pod {
		t.Fatalf("subset %+v %v", d4, err)
	}

	for _, c := range []struct {
		name string
		err  error
		want Status
	}{
		{"block 0 is the default, above the max", errOf(r.RouteTokens("study", Tokens{IDs: first, BlockTokens: MaxBlockTokens + 1}, "", 0, 20)), StatusInvalidParameter},
		{"model", errOf(r.RouteTokens("study\xff", Tokens{IDs: first}, "", 0, 20)), StatusInvalidUTF8},
		{"lora", errOf(r.RouteTokens("study", Tokens{IDs: first, LoRA: "\xff"}, "", 0, 20)), StatusInvalidUTF8},
		{"salt", errOf(r.RouteTokens("study", Tokens{IDs: first, CacheSalt: "\xfe"}, "", 0, 20)), StatusInvalidUTF8},
		{"strategy", errOf(r.RouteTokens("study", Tokens{IDs: first}, "fastest", 0, 20)), StatusInvalidStrategy},
		{"unknown model", errOf(r.RouteTokens("nosuch", Tokens{IDs: first}, "", 0, 20)), StatusUnknownModel},
		{"empty subset", errOf(r.RouteTokensSubset("study", Tokens{IDs: first}, "", 0, []string{}, 20)), StatusNoPodInSubset},
		{"too many keys", errOf(r.RouteKeys("study", keys, 63*16-1, 16, "", 0, nil, 20)), StatusInvalidParameter},
		{"keys block", errOf(r.RouteKeys("study", keys, 1013, MaxBlockTokens+1, "", 0, nil, 20)), StatusInvalidParameter},
	} {
		if !errors.Is(c.err, c.want) {
			t.Fatalf("%s: %v, want %v", c.name, c.err, c.want)
		}
	}
	if d, err := r.RouteTokens("study", Tokens{}, "", 0, 21); err != nil || d.TotalBlocks != 0 {
		t.Fatalf("empty prompt: %+v %v", d, err)
	}
}

// errOf is the error of a route call.
func errOf(_ Decision, err error) error { return err }

// RouteTokens from 16 goroutines at once (the tests run with -race): every call keys its
// prompt outside the lock; the counters add up afterwards.
func TestRouteTokensFrom16Goroutines(t *testing.T) {
	const goroutines, perGoroutine = 16, 50
	r := newTestRouter(t, Config{Seed: 3, Strategy: "prefix-cache"}, 4)
	defer r.Close()
	families := make([][]uint32, 4)
	for f := range families {
		families[f] = tokenIDs(uint64(f+10), 512)
	}
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < perGoroutine; i++ {
				now := uint64(g*perGoroutine + i)
				prompt := append(append([]uint32{}, families[(g+i)%4]...), tokenIDs(uint64(1000*g+i), 20)...)
				d, err := r.RouteTokens("study", Tokens{IDs: prompt}, "", 0, now)
				if err == nil && (d.TotalBlocks != 33 || d.MatchedBlocks > 32) {
					err = fmt.Errorf("decision %+v: want 33 blocks, at most the family's 32 matched", d)
				}
				if err == nil {
					err = r.Complete(d.Ticket, Success, now)
				}
				if err != nil {
					errs <- err
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
	if s.TicketsIssued != want || s.CompletedSuccess != want || s.InFlight != 0 || s.RoutedByReason[ReasonPrefixMatch] == 0 {
		t.Fatalf("stats after concurrent use: %+v", s)
	}
}
