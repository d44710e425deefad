package kvroute

import (
	"encoding/json"
	"testing"
)

// BenchmarkRoute measures one route + complete of the study's prompt shape (~28,000 bytes)
// through cgo, on a router with 4 pods whose index already holds the prompt's family.
func BenchmarkRoute(b *testing.B) {
	r := newTestRouter(b, Config{Seed: 1}, 4)
	defer r.Close()
	prompt := []byte(studyPrompt(0, 100000))
	if _, err := r.Route("study", prompt, "", 0); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(prompt)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		d, err := r.Route("study", prompt, "", uint64(i))
		if err != nil {
			b.Fatal(err)
		}
		if err := r.Complete(d.Ticket, Success, uint64(i)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRouteJSON is BenchmarkRoute with a chat completions body (prompt extraction in
// the library).
func BenchmarkRouteJSON(b *testing.B) {
	r := newTestRouter(b, Config{Seed: 1}, 4)
	defer r.Close()
	body, _ := json.Marshal(map[string]any{
		"model":    "study",
		"messages": []map[string]string{{"role": "user", "content": studyPrompt(0, 100000)}},
	})
	b.SetBytes(int64(len(body)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		d, err := r.RouteJSON("", body, "", uint64(i))
		if err != nil {
			b.Fatal(err)
		}
		if err := r.Complete(d.Ticket, Success, uint64(i)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCgoCall is the cost of one trivial call through cgo (kvroute_version_number), the
// fixed overhead each Route and Complete pays on top of the library's own work.
func BenchmarkCgoCall(b *testing.B) {
	for i := 0; i < b.N; i++ {
		if versionNumber() == 0 {
			b.Fatal("version 0")
		}
	}
}
