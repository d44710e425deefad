package kvroute_test

import (
	"errors"
	"fmt"
	"strings"

	kvroute "example.invalid/kvroute/ffi/go"
)

func Example() {
	r, err := kvroute.NewRouter(kvroute.Config{Seed: 7, Strategy: "prefix-cache"})
	if err != nil {
		panic(err)
	}
	defer r.Close()
	for i, addr := range []string{"10.0.0.1:8000", "10.0.0.2:8000"} {
		if _, err := r.AddPod("llama", fmt.Sprintf("vllm-%c", 'a'+i), addr, true); err != nil {
			panic(err)
		}
	}
	system := strings.Repeat("You are a careful assistant. ", 20)
	body := func(q string) []byte {
		return []byte(fmt.Sprintf(`{"model":"llama","messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, system, q))
	}

	first, _ := r.RouteJSON("", body("What is KV caching?"), "", 1000)
	second, _ := r.RouteJSON("", body("And prefix caching?"), "", 1001)
	fmt.Println(second.Pod == first.Pod, second.Reason, second.MatchedBlocks > 0)

	addr, _ := r.PodAddress(second.Pod)
	fmt.Println(strings.HasPrefix(addr, "10.0.0."))

	fmt.Println(r.Complete(first.Ticket, kvroute.Success, 2000))
	err = r.Complete(first.Ticket, kvroute.Success, 2001)
	fmt.Println(errors.Is(err, kvroute.StatusTicketNotOpen), err)
	fmt.Println(r.Complete(second.Ticket, kvroute.Cancelled, 2002))

	_, err = r.Route("mistral", nil, "", 3000)
	fmt.Println(err)
	// Output:
	// true prefix_match true
	// true
	// <nil>
	// true KVROUTE_STATUS_TICKET_NOT_OPEN
	// <nil>
	// KVROUTE_STATUS_UNKNOWN_MODEL
}
